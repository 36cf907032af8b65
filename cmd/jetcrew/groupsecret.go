package main

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/jetcrew/jetcrew/dispatcher"
)

// groupSecretEnv names the variable holding the group secret's file, read
// when --group-secret is not given.
const groupSecretEnv = "JETCREW_GROUP_SECRET"

// groupSecretFile is the default group secret's path under the
// configuration directory (contextRoot).
var groupSecretFile = filepath.Join("jetcrew", "group.secret")

// groupSecretPath returns the group secret's file: flag (--group-secret),
// else $JETCREW_GROUP_SECRET, else jetcrew/group.secret under the
// configuration directory. given is true for a file the user named, which
// is never created.
func (a submitCmds) groupSecretPath(flag string) (path string, given bool, err error) {
	if flag != "" {
		return flag, true, nil
	}
	if p := a.getenv(groupSecretEnv); p != "" {
		return p, true, nil
	}
	root, err := a.groupSecretRoot()
	if err != nil {
		return "", false, fmt.Errorf("no group secret: give --group-secret FILE or set %s (%w)", groupSecretEnv, err)
	}
	return filepath.Join(root, groupSecretFile), false, nil
}

// groupSecret loads the secret submit derives its groups' keys from
// (groupSecretPath). The default file is created on first use, and said so
// on stderr unless quiet; a file the user named must exist.
func (a submitCmds) groupSecret(flag string, quiet bool) (dispatcher.GroupSecret, error) {
	path, given, err := a.groupSecretPath(flag)
	if err != nil {
		return dispatcher.GroupSecret{}, err
	}
	s, err := dispatcher.LoadGroupSecret(path)
	if !errors.Is(err, dispatcher.ErrNoGroupSecret) || given {
		return s, err
	}
	if s, err = dispatcher.CreateGroupSecret(path); errors.Is(err, fs.ErrExist) {
		// Another submit made it first: use that one.
		return dispatcher.LoadGroupSecret(path)
	} else if err != nil {
		return s, err
	}
	if !quiet {
		fmt.Fprintf(visible(a.stderr), "--- group secret created: %s (your groups' keys come from it: share it only with who may add runs to your groups)\n", path)
	}
	return s, nil
}

// keyToGroup keys enc to its group (dispatcher.Encoded.WithGroupKey) with
// the key secret derives for it, when its request names a group; enc as it
// is otherwise (a run alone in its own group needs no key).
func keyToGroup(enc dispatcher.Encoded, secret dispatcher.GroupSecret) (dispatcher.Encoded, error) {
	req := enc.Request()
	if req.Group == "" {
		return enc, nil
	}
	key, err := secret.Key(req.GroupRef())
	if err != nil {
		return dispatcher.Encoded{}, err
	}
	return enc.WithGroupKey(key)
}

// groupKeyed returns the encoded requests of encs keyed to their group by
// the group secret --group-secret names (groupSecret), loaded once and only
// when some request names a group.
func (a submitCmds) groupKeyed(o submitOptions, encs []dispatcher.Encoded) error {
	var (
		secret dispatcher.GroupSecret
		loaded bool
	)
	for i := range encs {
		if encs[i].Request().Group == "" {
			continue
		}
		if !loaded {
			var err error
			if secret, err = a.groupSecret(o.groupSecret, o.quiet); err != nil {
				return err
			}
			loaded = true
		}
		var err error
		if encs[i], err = keyToGroup(encs[i], secret); err != nil {
			return err
		}
	}
	return nil
}
