package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jsm.go/natscontext"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/jetcrew/jetcrew/roles"
)

// authDirName is the directory under `up`'s data directory holding one NKey
// seed file per role, <role>.nk, mode 0600.
const authDirName = "auth"

// contextPrefix prefixes the NATS CLI contexts `up --auth` writes:
// jetcrew-<role>.
const contextPrefix = "jetcrew-"

// isLoopback reports whether host (from --listen) only accepts local
// connections.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkExposure refuses to serve beyond loopback without authentication.
func checkExposure(listen, host string, auth bool) error {
	if isLoopback(host) || auth {
		return nil
	}
	return fmt.Errorf("--listen %s reaches beyond this machine, and without authentication anyone who can reach the port could run jobs with the worker's secrets, forge run states and delete the streams: add --auth (one NKey user per role) and --tlscert/--tlskey to encrypt, or listen on 127.0.0.1", listen)
}

// roleKeys are the seed files of `up --auth`'s users, by role.
type roleKeys map[roles.Role]string

// ensureRoleKeys creates, under dir (mode 0700), an NKey user seed file per
// role, <role>.nk mode 0600, keeping existing ones so the users and the
// contexts made from them stay valid across restarts. It returns the files
// and the server's users with their roles' permissions.
func ensureRoleKeys(dir string) (roleKeys, []*server.NkeyUser, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("auth directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("auth directory: %w", err)
	}
	keys := roleKeys{}
	var users []*server.NkeyUser
	for _, r := range roles.All {
		path := filepath.Join(dir, string(r)+".nk")
		kp, err := loadOrCreateSeed(path)
		if err != nil {
			return nil, nil, err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, nil, err
		}
		g, err := roles.Permissions(r)
		if err != nil {
			return nil, nil, err
		}
		keys[r] = path
		users = append(users, &server.NkeyUser{Nkey: pub, Permissions: g.ServerPermissions()})
	}
	return keys, users, nil
}

// loadOrCreateSeed reads the NKey user seed at path, or creates one there
// (mode 0600, never overwriting a file). A file readable by others is
// refused.
func loadOrCreateSeed(path string) (nkeys.KeyPair, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, err
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("create %s: %w", path, err)
		}
		_, werr := f.Write(append(seed, '\n'))
		if err := errors.Join(werr, f.Close()); err != nil {
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
		return kp, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s is mode %o: a seed must be readable by its owner only (chmod 600)", path, st.Mode().Perm())
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(data))))
	if err != nil {
		return nil, fmt.Errorf("%s: not an NKey user seed", path)
	}
	return kp, nil
}

// loadOrCreateToken reads the secret token in the file at path, or creates
// one there (32 random bytes in hex, mode 0600, never overwriting a file). A
// file readable by others, or empty, is refused.
func loadOrCreateToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		tok := hex.EncodeToString(b)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return "", fmt.Errorf("create %s: %w", path, err)
		}
		_, werr := f.WriteString(tok + "\n")
		if err := errors.Join(werr, f.Close()); err != nil {
			return "", fmt.Errorf("write %s: %w", path, err)
		}
		return tok, nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("%s is mode %o: a token must be readable by its owner only (chmod 600)", path, st.Mode().Perm())
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("%s is empty: remove it for a new token", path)
	}
	return tok, nil
}

// serverTLS sets opts to serve TLS only, with the certificate and key the
// connection options name (--tlscert/--tlskey); nothing when neither is
// given.
func (a serveCmds) serverTLS(opts *server.Options) error {
	c := a.conn // flags only: NATS_CERT/NATS_KEY are a client's
	if c.tlsCert == "" && c.tlsKey == "" {
		return nil
	}
	if c.tlsCert == "" || c.tlsKey == "" {
		return usageError(errors.New("--tlscert and --tlskey go together: the server's certificate and its private key"))
	}
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: c.tlsCert, KeyFile: c.tlsKey})
	if err != nil {
		return usageError(fmt.Errorf("TLS: %w", err))
	}
	opts.TLS, opts.TLSConfig = true, tc
	return nil
}

// writeContexts writes a NATS CLI context per role, jetcrew-<role>, for the
// server at url with the role's seed file (and --tlsca, when given), where
// the NATS CLI reads them (contextRoot), and returns their files by role.
func (a serveCmds) writeContexts(url string, keys roleKeys) (map[roles.Role]string, error) {
	root, err := a.contextRoot()
	if err != nil {
		return nil, fmt.Errorf("cannot write NATS contexts: %w", err)
	}
	backend := natscontext.NewFileBackendAt(root)
	reg := natscontext.NewRegistry(backend, natscontext.WithoutSelection())
	ca := a.conn.tlsCA
	if ca != "" {
		if abs, err := filepath.Abs(ca); err == nil {
			ca = abs
		}
	}
	files := map[roles.Role]string{}
	for _, r := range roles.All {
		name := contextPrefix + string(r)
		c, err := natscontext.New(name, false,
			natscontext.WithServerURL(url),
			natscontext.WithNKey(keys[r]),
			natscontext.WithCA(ca),
			natscontext.WithInboxPrefix(roles.InboxPrefix(r)),
			natscontext.WithDescription("jetcrew "+string(r)+" of the server `jetcrew up --auth` runs"))
		if err != nil {
			return nil, err
		}
		if err := reg.Save(context.Background(), c, name); err != nil {
			return nil, fmt.Errorf("save NATS context %s: %w", name, err)
		}
		files[r] = backend.Path(name)
	}
	return files, nil
}

// printAuth tells where the role users and contexts are: per role, the
// context's name, its file and the seed file.
func (a serveCmds) printAuth(keys roleKeys, contexts map[roles.Role]string) {
	fmt.Fprintf(a.stdout, "# one NKey user per role (seed files, mode 0600) and a NATS CLI context for each, where the NATS CLI reads them:\n")
	for _, r := range roles.All {
		fmt.Fprintf(a.stdout, "NATS_CONTEXT_%s=%s\t# context %s, seed %s\n", strings.ToUpper(string(r)),
			contextPrefix+string(r), contexts[r], keys[r])
	}
}

// workerAuth is what `up`'s own worker connects with: the worker role's
// seed and inbox prefix.
func workerAuth(keys roleKeys) ([]nats.Option, error) {
	opt, err := nats.NkeyOptionFromSeed(keys[roles.Worker])
	if err != nil {
		return nil, err
	}
	return []nats.Option{opt, nats.CustomInboxPrefix(roles.InboxPrefix(roles.Worker))}, nil
}

// upServer returns the embedded server's options for `up`: listening on
// host:port, JetStream under dataDir, TLS when --tlscert/--tlskey are given,
// and with o.auth one NKey user per role (keys, the seed files).
func (a serveCmds) upServer(o upOptions, host string, port int, dataDir string) (*server.Options, roleKeys, error) {
	if err := checkExposure(o.listen, host, o.auth); err != nil {
		return nil, nil, usageError(err)
	}
	opts := embeddedServerOptions(host, port, dataDir, o.storeMiB)
	if err := a.serverTLS(opts); err != nil {
		return nil, nil, err
	}
	if !o.auth {
		return opts, nil, nil
	}
	keys, users, err := ensureRoleKeys(filepath.Join(dataDir, authDirName))
	if err != nil {
		return nil, nil, err
	}
	opts.Nkeys = users
	return opts, keys, nil
}

// announceAuth writes the roles' contexts for the server at url and prints
// where they and the seeds are; nothing without keys (no --auth).
func (a serveCmds) announceAuth(url string, keys roleKeys) error {
	if keys == nil {
		return nil
	}
	contexts, err := a.writeContexts(url, keys)
	if err != nil {
		return err
	}
	a.printAuth(keys, contexts)
	return nil
}
