package runner

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// A stage's resume id replaces the plan's command at the end of the
// container's command, after what stages prepended (the workspace's exec),
// with the CLI's resume flag; a backend that cannot resume fails the run.
func TestResumePlan(t *testing.T) {
	t.Parallel()
	prof, err := profile.ParseProfiles("test", []byte("[profiles.c]\nbackend = \"codex\"\nimage = \"img\"\n"))
	require.NoError(t, err)
	p := prof["c"]
	plan, err := p.Plan("task", false)
	require.NoError(t, err)
	wrap := []string{"/run/jetcrew-ws/jetcrew", "workspace", "exec", "--session", plan.SessionDir, "--"}
	spec := jail.ContainerSpec{Cmd: append(append([]string(nil), wrap...), plan.ContainerArgv()...)}
	resumed, err := resumePlan(&p, plan, &spec, "t-1")
	require.NoError(t, err)
	require.Equal(t, wrap, spec.Cmd[:len(wrap)])
	require.Equal(t, resumed.ContainerArgv(), spec.Cmd[len(wrap):])
	require.Equal(t, []string{"codex", "exec", "--json", "--skip-git-repo-check", "resume", "t-1", "-"}, resumed.Argv)

	shell := profile.ShellProfile()
	splan, err := shell.Plan("true", false)
	require.NoError(t, err)
	_, err = resumePlan(&shell, splan, &jail.ContainerSpec{Cmd: splan.ContainerArgv()}, "t-1")
	require.ErrorContains(t, err, "cannot resume")
}
