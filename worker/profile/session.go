package profile

import (
	"fmt"
	"slices"

	"github.com/jetcrew/jetcrew/messages"
)

// resumer is a backend whose CLI can resume a session it saved in an
// earlier run (docs/backends.md, "Follow-ups"): where the CLI keeps its
// session files, and how its documented resume flag is passed.
type resumer interface {
	// sessionDir returns the container path of the directory holding the
	// CLI's session files, under p.Home; the path.Match patterns of the
	// names directly in it that are kept (none: all); and the names never
	// kept (credentials, logs, downloaded binaries).
	sessionDir(p Profile) (dir string, keep, skip []string)
	// resume returns argv (the plan's, the profile's args included) made
	// to resume session id.
	resume(argv []string, id string) []string
	// holds reports whether names, the files of a kept session (paths
	// relative to the session directory), hold session id where the CLI
	// looks it up.
	holds(names []string, id string) bool
}

// setSessionDir sets plan.SessionDir when b's CLI can resume a session.
func setSessionDir(b backend, p Profile, plan *Plan) {
	if r, ok := b.(resumer); ok {
		plan.SessionDir, plan.SessionKeep, plan.SessionSkip = r.sessionDir(p)
	}
}

// CanResume reports whether the profile's backend can resume an earlier
// session. Its CLI then documents a resume flag jetcrew passes.
func (a AgentConfig) CanResume() bool {
	b, err := lookupBackend(a.Backend)
	if err != nil {
		return false
	}
	_, ok := b.(resumer)
	return ok
}

// Resume returns plan, a plan of the profile, made to resume session id. It
// adds the CLI's resume flag: Claude Code `--resume ID`, Codex `exec resume
// ID`, opencode `--session ID`. It returns an error for a backend that
// cannot resume or an id messages.ValidSessionID refuses.
func (a AgentConfig) Resume(plan Plan, id string) (Plan, error) {
	b, err := lookupBackend(a.Backend)
	if err != nil {
		return plan, err
	}
	r, ok := b.(resumer)
	if !ok {
		return plan, fmt.Errorf("backend %s cannot resume a session", a.Backend)
	}
	if !messages.ValidSessionID(id) {
		return plan, fmt.Errorf("session id %q is not one jetcrew passes to a CLI", id)
	}
	plan.Argv = r.resume(slices.Clone(plan.Argv), id)
	return plan, nil
}

// noteSessionID keeps id as the run's session id when it is valid: the
// latest the CLI printed wins, the one a follow-up resumes. Claude Code
// names the session it resumes in its init event and goes on under a new
// id, which its later messages and its result name
// (anthropics/claude-code#4926, #58760); p.mu is held.
func (p *Parser) noteSessionID(id string) {
	if messages.ValidSessionID(id) {
		p.summary.SessionID = id
	}
}

// HoldsSession reports whether a kept session's files hold session id.
// names are the files of a kept session object (paths relative to the
// CLI's session directory); they hold it when they hold it where the
// profile's CLI looks it up on resume; false for a backend that cannot
// resume. A follow-up resumes only a session it holds: otherwise the CLI
// would fail on its own resume flag, and the run starts fresh instead,
// saying why.
func (a AgentConfig) HoldsSession(names []string, id string) bool {
	b, err := lookupBackend(a.Backend)
	if err != nil {
		return false
	}
	r, ok := b.(resumer)
	return ok && r.holds(names, id)
}
