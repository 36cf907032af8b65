package messages_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// session.from must name the run the workspace starts from: a session is
// restored only onto the tree it worked on.
func TestSessionRefValidate(t *testing.T) {
	t.Parallel()
	req := func(ws *messages.WorkspaceRef, from string) messages.RunRequest {
		return messages.RunRequest{ID: "r2", Profile: "claude", Prompt: "more", Workspace: ws, Session: &messages.SessionRef{From: from}}
	}
	require.NoError(t, req(&messages.WorkspaceRef{From: "r1"}, "r1").Validate())
	for name, r := range map[string]messages.RunRequest{
		"no workspace":   req(nil, "r1"),
		"another run":    req(&messages.WorkspaceRef{From: "r0"}, "r1"),
		"a snapshot":     req(&messages.WorkspaceRef{Name: "x", Digest: "sha256:" + string(make([]byte, 0))}, "r1"),
		"empty":          req(&messages.WorkspaceRef{From: "r1"}, ""),
		"reserved name":  req(&messages.WorkspaceRef{From: "all"}, "all"),
		"not a run name": req(&messages.WorkspaceRef{From: "r1"}, "a b"),
	} {
		require.ErrorIs(t, r.Validate(), messages.ErrInvalidRequest, name)
	}
	for id, ok := range map[string]bool{"5014da61-e3fc-42ef-b7ac-2a0c1fabd097": true, "ses_abc": true, "-x": false, "": false, "a b": false, "a/b": false} {
		require.Equal(t, ok, messages.ValidSessionID(id), id)
	}
}
