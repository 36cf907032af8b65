// Package secrets is the stage that hands a run its secrets (its
// profile's env_from_host values, as set on the worker) through the
// launcher at start, never through the container's configuration, and
// keeps them out of everything the run shows: it gives the engine the
// run's masker.
package secrets

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// SecretMask replaces every secret value in what a run shows to anyone.
const SecretMask = "***"

// minSecretBytes is the shortest value masked: a shorter one (a 1, a yes)
// would turn ordinary output into noise and is no secret worth the name.
const minSecretBytes = 4

// masker replaces the values of a run's secrets (its profile's
// env_from_host variables, as set on the worker) with SecretMask: in its
// output events, the agent events and result parsed from them, its reason
// (and so its dead letter's headers and the worker's log). Output is masked
// as a stream: the end of a chunk that could begin a secret is held back
// until the next chunk of the same stream (or close) decides, so a value
// split across chunks is masked too. Masking matches bytes: a secret that is
// encoded (base64, hex, JSON-escaped, reversed, one character per line)
// passes through, as in GitHub Actions. A nil *masker masks nothing.
// Not safe for concurrent use: the output publisher calls it under its lock.
type masker struct {
	secrets [][]byte // longest first, so a secret containing another wins
	carry   map[string][]byte
}

// newMasker returns a masker for the values of names in prof.EnvFromHost
// that lookup finds, or nil when there are none worth masking.
func newMasker(prof *profile.Profile, lookup func(string) (string, bool)) *masker {
	var secrets [][]byte
	for _, name := range prof.EnvFromHost {
		if v, ok := lookup(name); ok && len(v) >= minSecretBytes {
			secrets = append(secrets, []byte(v))
		}
	}
	if len(secrets) == 0 {
		return nil
	}
	slices.SortFunc(secrets, func(a, b []byte) int { return len(b) - len(a) })
	return &masker{secrets: secrets, carry: map[string][]byte{}}
}

// String returns s with every secret masked.
func (m *masker) String(s string) string {
	if m == nil {
		return s
	}
	for _, v := range m.secrets {
		s = strings.ReplaceAll(s, string(v), SecretMask)
	}
	return s
}

// Stream masks the next chunk p of output stream name and returns what may
// be published now; a tail that could start a secret is kept for later.
func (m *masker) Stream(name string, p []byte) []byte {
	if m == nil {
		return p
	}
	buf := append(m.carry[name], p...)
	for _, v := range m.secrets {
		if bytes.Contains(buf, v) {
			buf = bytes.ReplaceAll(buf, v, []byte(SecretMask))
		}
	}
	k := m.heldTail(buf)
	m.carry[name] = append([]byte(nil), buf[len(buf)-k:]...)
	return buf[:len(buf)-k]
}

// heldTail returns the length of the longest end of buf that is a proper
// beginning of a secret.
func (m *masker) heldTail(buf []byte) int {
	for k := min(len(buf), len(m.secrets[0])-1); k > 0; k-- {
		tail := buf[len(buf)-k:]
		for _, v := range m.secrets {
			if len(v) > k && bytes.HasPrefix(v, tail) {
				return k
			}
		}
	}
	return 0
}

// Flush returns what stream name still holds back: at the end of the
// output it can no longer become a secret.
func (m *masker) Flush(name string) []byte {
	if m == nil {
		return nil
	}
	rest := m.carry[name]
	delete(m.carry, name)
	return rest
}

// Secrets binds runs' secrets: it reads the worker's environment.
type Secrets struct {
	lookup func(string) (string, bool)
}

// New returns the Secrets reading variables with lookup (os.LookupEnv in
// production).
func New(lookup func(string) (string, bool)) *Secrets { return &Secrets{lookup: lookup} }

// For returns the stage of one run whose profile names env_from_host
// variables.
func (s *Secrets) For(*stage.Run) *Stage { return &Stage{s: s} }

// Stage is one run's secrets.
type Stage struct{ s *Secrets }

// The hooks Stage implements, declared so that a signature drifting from
// the contract fails to build (worker/runner's TestStageHooksImplemented
// holds this list to exactly the hooks implemented).
var (
	_ stage.Prestarter = (*Stage)(nil)
	_ stage.Adopter    = (*Stage)(nil)
)

// Name returns "secrets".
func (s *Stage) Name() string { return "secrets" }

// Prestart reads the values of the profile's env_from_host variables from
// the worker's environment and stages them in the run's directory at
// profile.LaunchEnvPath (a JSON array of "KEY=VALUE", mode 0444 in a
// directory only the run mounts), where the launcher reads them when the
// agent starts: no secret is in the container's configuration (its
// environment, labels or command line), so nobody who can read the
// engine's configuration (docker inspect) sees one. It gives the engine the
// run's masker, and the names for the receipt. A variable that is not set
// on the worker fails the run (retrying cannot help).
func (s *Stage) Prestart(_ context.Context, req *stage.PrestartRequest, resp *stage.PrestartResponse) error {
	prof := req.Run.Profile
	if req.Dir == nil {
		return errors.New("secrets need the run's directory")
	}
	env := make([]string, 0, len(prof.EnvFromHost))
	for _, name := range prof.EnvFromHost {
		v, ok := s.s.lookup(name)
		if !ok {
			return fmt.Errorf("profile %q: env_from_host %s is not set in the worker's environment", prof.Name, name)
		}
		env = append(env, name+"="+v)
	}
	// Nothing of a run that held secrets goes back to the pool of
	// directories.
	req.Dir.Taint()
	data, err := json.Marshal(env)
	if err != nil {
		return err
	}
	path := filepath.Join(req.Dir.Path(), filepath.Base(profile.LaunchEnvPath))
	_ = os.Remove(path)
	if err := os.WriteFile(path, data, 0o444); err != nil {
		return fmt.Errorf("stage the run's secrets: %w", err)
	}
	// The worker's umask may have taken the run user's read bit.
	if err := os.Chmod(path, 0o444); err != nil {
		return fmt.Errorf("stage the run's secrets: %w", err)
	}
	resp.LaunchEnvNames = append(resp.LaunchEnvNames, prof.EnvFromHost...)
	if m := newMasker(prof, s.s.lookup); m != nil {
		resp.Mask = m
	}
	return nil
}

// Adopt makes the adopted run's masker from the worker's environment, as
// Prestart does: the launcher read the staged values when the agent
// started, so nothing is staged again. A variable no longer set on this
// worker makes the run not adoptable: its output could not be masked.
func (s *Stage) Adopt(_ context.Context, req *stage.AdoptRequest, resp *stage.PrestartResponse) error {
	prof := req.Run.Profile
	for _, name := range prof.EnvFromHost {
		if _, ok := s.s.lookup(name); !ok {
			return fmt.Errorf("profile %q: env_from_host %s is not set in the worker's environment", prof.Name, name)
		}
	}
	if req.Dir != nil {
		req.Dir.Taint()
	}
	if m := newMasker(prof, s.s.lookup); m != nil {
		resp.Mask = m
	}
	return nil
}
