package messages

import (
	"fmt"
	"regexp"
)

// SessionDir is the directory, relative to WorkspaceDir, where `jetcrew
// workspace exec` leaves a copy of the agent CLI's session files once the
// agent exited, for the capture to keep as the ResultSession object. Like
// ArtifactsDir it is never part of the captured commit or patch, nor of a
// later run's tree (docs/workspaces.md, "Follow-ups").
const SessionDir = ".jetcrew/session"

// MaxSessionBytes caps the agent CLI's session files a run keeps: their
// sizes summed, 16 MiB. `jetcrew workspace exec` copies none past it (the
// run records SessionNote.Kept false and why) and the capture refuses a
// SessionDir over it, so a follow-up never restores more.
const MaxSessionBytes = 16 << 20

// ResultSession is the kind of the result object holding the agent CLI's
// session files: a tar of the regular files the CLI left in its session
// directory (paths relative to it), each file's content masked with the
// run's secret mask. Kept in BucketResults beside the patch and bundle, so
// under that bucket's retention and readable by the roles that read
// results.
const ResultSession = "session.tar"

// SessionRef, in a request, asks the run to resume the agent CLI's session
// of an earlier run (a follow-up, `jetcrew followup`): the worker restores
// the session files that run kept into the new run's HOME and passes the
// CLI's documented resume flag, when the earlier run is of the same
// profile and its backend can resume; otherwise the run starts fresh, on
// the earlier run's tree, and RunState.Session says why. From must be the
// run the workspace starts from (WorkspaceRef.From).
type SessionRef struct {
	// From is the earlier run's id, equal to Workspace.From.
	From string `json:"from"`
}

// Validate returns an error wrapping ErrInvalidRequest when s is malformed
// or ws does not start from the same run (a session is never restored into
// another tree than the one it worked on).
func (s SessionRef) Validate(ws *WorkspaceRef) error {
	if err := ValidateName("session from", s.From); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if ws == nil || ws.From != s.From {
		return fmt.Errorf("%w: session from %s needs workspace from the same run", ErrInvalidRequest, s.From)
	}
	return nil
}

// sessionIDRE is the form of a session id jetcrew passes to a CLI's resume
// flag: what the CLIs print (UUIDs, Codex's thread ids, opencode's
// "ses_…" ids), nothing a command line could read as an option.
var sessionIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// ValidSessionID reports whether id may be kept as AgentSummary.SessionID
// and passed to a CLI's resume flag: 1 to 128 of [A-Za-z0-9_.-], not
// starting with '-', '_' or '.'. The id comes from the agent's output,
// untrusted.
func ValidSessionID(id string) bool { return sessionIDRE.MatchString(id) }

// SessionNote is what a run records of the agent CLI's session
// (RunState.Session): for a follow-up, whether the earlier run's session
// was restored, and for any run of a backend that keeps sessions, whether
// its own was kept.
type SessionNote struct {
	// From is the earlier run whose session the request asked for
	// (SessionRef.From); empty for a run that was no follow-up.
	From string `json:"from,omitempty"`
	// Resumed is true when the earlier run's session files were restored
	// into the run's HOME and the CLI was started with its resume flag.
	Resumed bool `json:"resumed,omitempty"`
	// ID is the session id passed to the resume flag.
	ID string `json:"id,omitempty"`
	// Digest is the "sha256:…" digest of the session.tar restored (the
	// earlier run's ResultSession object), when Resumed.
	Digest string `json:"digest,omitempty"`
	// Fresh says why a follow-up started a fresh session (on the earlier
	// run's tree): the backend cannot resume, another profile, no session
	// kept, the object gone, or one not holding the session id's file.
	// Empty when resumed or no follow-up.
	Fresh string `json:"fresh,omitempty"`
}
