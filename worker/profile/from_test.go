package profile_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// TestCheckFrom: from_profiles (absent: the profile alone; []: none) and
// feeds (absent: any; []: none), read from TOML, decide which runs a
// profile's runs may start from.
func TestCheckFrom(t *testing.T) {
	t.Parallel()
	ps, err := profile.ParseProfiles("p.toml", []byte(`
[profiles.coder]
image = "x"
command = ["true"]
[profiles.reviewer]
image = "x"
command = ["true"]
feeds = ["coder"]
[profiles.deployer]
image = "x"
command = ["true"]
from_profiles = ["coder", "reviewer"]
[profiles.any]
image = "x"
command = ["true"]
from_profiles = ["*"]
[profiles.sealed]
image = "x"
command = ["true"]
feeds = []
from_profiles = []
`))
	require.NoError(t, err)
	check := func(dst, src string) error {
		d := ps[dst]
		var s *profile.Profile
		if p, ok := ps[src]; ok {
			s = &p
		}
		return d.CheckFrom(src, s)
	}
	for _, tc := range []struct {
		dst, src, err string
	}{
		{"coder", "coder", ""},
		{"coder", "reviewer", `profile "coder" starts runs only from runs of coder (its from_profiles), not of profile "reviewer"`},
		{"deployer", "coder", ""},
		{"deployer", "reviewer", `profile "reviewer" lets only runs of coder start from its runs (its feeds), not of profile "deployer"`},
		{"any", "coder", ""},
		{"any", "sealed", `profile "sealed" lets no run start from its runs (its feeds is empty)`},
		{"any", "gone", `the earlier run's profile "gone" is not a profile of this worker: its feeds cannot be checked`},
		{"sealed", "sealed", `profile "sealed" starts no run from an earlier run's result (its from_profiles is empty)`},
	} {
		err := check(tc.dst, tc.src)
		if tc.err == "" {
			require.NoError(t, err, "%s from %s", tc.dst, tc.src)
		} else {
			require.EqualError(t, err, tc.err, "%s from %s", tc.dst, tc.src)
		}
	}
	sealed := ps["sealed"]
	require.ErrorContains(t, sealed.CheckRequest(messages.RunRequest{Profile: "sealed", Workspace: &messages.WorkspaceRef{From: "r1"}}), "its from_profiles is empty",
		"refused before staging")
	_, err = profile.ParseProfiles("p.toml", []byte("[profiles.x]\nimage = \"x\"\ncommand = [\"true\"]\nfeeds = [\"a.b\"]\n"))
	require.ErrorContains(t, err, `feeds "a.b"`)
}
