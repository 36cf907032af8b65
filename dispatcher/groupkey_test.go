package dispatcher

import (
	"encoding/base64"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// A group's key comes from the secret, the pool and the group alone: the
// same on any machine, another for another of the three.
func TestGroupSecretKey(t *testing.T) {
	t.Parallel()
	secret := GroupSecret{b: []byte(strings.Repeat("s", MinGroupSecretBytes))}
	pub := func(s GroupSecret, g messages.GroupRef) string {
		kp, err := s.Key(g)
		require.NoError(t, err)
		p, err := kp.PublicKey()
		require.NoError(t, err)
		require.True(t, nkeys.IsValidPublicUserKey(p))
		return p
	}
	crew := messages.GroupRef{Pool: "default", Name: "crew"}
	require.Equal(t, pub(secret, crew), pub(GroupSecret{b: []byte(strings.Repeat("s", MinGroupSecretBytes))}, crew))
	seen := map[string]bool{pub(secret, crew): true}
	for _, other := range []string{
		pub(secret, messages.GroupRef{Pool: "gpu", Name: "crew"}),
		pub(secret, messages.GroupRef{Pool: "default", Name: "crew2"}),
		// The zero bytes keep the pool and the group apart.
		pub(secret, messages.GroupRef{Pool: "defaultc", Name: "rew"}),
		pub(GroupSecret{b: []byte(strings.Repeat("t", MinGroupSecretBytes))}, crew),
	} {
		require.False(t, seen[other])
		seen[other] = true
	}
	_, err := GroupSecret{}.Key(crew)
	require.Error(t, err)
	_, err = secret.Key(messages.GroupRef{Pool: "default", Name: "a.b"})
	require.Error(t, err)
}

// A group secret is made once, private, and read back; a file others may
// read, a short one or none is refused, and the error never shows it.
func TestGroupSecretFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "jetcrew", "group.secret")
	_, err := LoadGroupSecret(path)
	require.ErrorIs(t, err, ErrNoGroupSecret)
	made, err := CreateGroupSecret(path)
	require.NoError(t, err)
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	st, err = os.Stat(filepath.Dir(path))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	read, err := LoadGroupSecret(path)
	require.NoError(t, err)
	require.Equal(t, made, read)
	_, err = CreateGroupSecret(path)
	require.ErrorIs(t, err, fs.ErrExist, "an existing secret is never replaced")

	require.NoError(t, os.Chmod(path, 0o640))
	_, err = LoadGroupSecret(path)
	require.ErrorContains(t, err, "chmod 600")
	short := filepath.Join(dir, "short")
	require.NoError(t, os.WriteFile(short, []byte("tooshort-secret\n"), 0o600))
	_, err = LoadGroupSecret(short)
	require.ErrorContains(t, err, "at least 32")
	require.NotContains(t, err.Error(), "tooshort")
}

// Two first submits at once make one secret: the other finds the file
// whole, never half written.
func TestGroupSecretCreatedOnce(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "group.secret")
	const n = 8
	made := make([]GroupSecret, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { made[i], errs[i] = CreateGroupSecret(path) })
	}
	wg.Wait()
	read, err := LoadGroupSecret(path)
	require.NoError(t, err)
	won := 0
	for i, err := range errs {
		if err == nil {
			won++
			require.Equal(t, read, made[i])
			continue
		}
		require.ErrorIs(t, err, fs.ErrExist)
	}
	require.Equal(t, 1, won)
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left")
}

// A request keyed to its group carries the key's public half and is
// published with the key's signature of the body as published, a
// workspace set after keying included.
func TestSubmitKeyedToGroup(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	secret := GroupSecret{b: []byte(strings.Repeat("k", MinGroupSecretBytes))}
	e, err := Encode(messages.RunRequest{ID: "crew-1", Profile: "shell", Group: "crew"})
	require.NoError(t, err)
	key, err := secret.Key(e.Request().GroupRef())
	require.NoError(t, err)
	e, err = e.WithGroupKey(key)
	require.NoError(t, err)
	e, err = e.WithWorkspace(messages.WorkspaceRef{Name: "sha256-" + strings.Repeat("a", 64) + ".tar", Digest: "sha256:" + strings.Repeat("a", 64)})
	require.NoError(t, err)
	_, err = b.d.SubmitEncoded(t.Context(), e, nil)
	require.NoError(t, err)

	st, err := b.js.Stream(t.Context(), messages.StreamRuns)
	require.NoError(t, err)
	msg, err := st.GetMsg(t.Context(), 1)
	require.NoError(t, err)
	req, err := messages.DecodeRunRequest(msg.Data)
	require.NoError(t, err)
	pub, err := key.PublicKey()
	require.NoError(t, err)
	require.Equal(t, pub, req.GroupKey)
	require.NotNil(t, req.Workspace)
	sig, err := base64.StdEncoding.DecodeString(msg.Header.Get(messages.HeaderGroupSignature))
	require.NoError(t, err)
	require.NoError(t, key.Verify(msg.Data, sig), "the signature is of the body as published")

	// A run alone in its own group takes no key.
	solo, err := Encode(messages.RunRequest{ID: "solo", Profile: "shell"})
	require.NoError(t, err)
	_, err = solo.WithGroupKey(key)
	require.ErrorIs(t, err, messages.ErrInvalidRequest)
}
