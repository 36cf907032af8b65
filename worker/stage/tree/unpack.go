package tree

import (
	"fmt"
	"strings"

	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/workspace"
)

// unpackFailed starts the line `jetcrew workspace exec` prints when the
// snapshot does not unpack: "jetcrew workspace: unpack failed (KIND):
// DETAIL".
const unpackFailed = workspace.JailErrPrefix + "unpack failed ("

// unpackVerdict reads the in-jail tool's exit line in an exit the run's
// process made on its own: when `jetcrew workspace exec` could not unpack
// the snapshot (exit code workspace.JailExitCode, its line last on
// stderr), it returns the response that says so, NotRun set, and true.
// Such a run fails, with a dead letter, never retried (the snapshot will
// not unpack better next time), nothing captured; but it is retried
// (Retry) when no capture container held the workspace in time
// (UnpackNotHeld) or the worker could not fetch the snapshot it streamed
// in (UnpackFetch). The reason names the profile's workspace_mib (mib)
// when the tree's tmpfs was full, else repeats the unpacker's own words.
// The line comes from the container, before the agent ran; an agent that
// prints it and exits with the same code only fails its own run. It does
// no I/O.
func unpackVerdict(req *stage.ExitedRequest, mib int64) (stage.ExitedResponse, bool) {
	if req.Stopped || req.Status.Code != workspace.JailExitCode || !strings.HasPrefix(req.LastErr, unpackFailed) {
		return stage.ExitedResponse{}, false
	}
	kind, detail, _ := strings.Cut(strings.TrimPrefix(req.LastErr, unpackFailed), "): ")
	resp := stage.ExitedResponse{NotRun: true, Reason: "workspace: " + detail}
	switch kind {
	case workspace.UnpackNoSpace:
		resp.Reason = fmt.Sprintf("workspace: %v: the snapshot does not fit the profile's workspace_mib (%d MiB)", workspace.ErrTooLarge, mib)
	case workspace.UnpackOther:
		resp.Reason = "workspace: unpack failed: " + detail
	case workspace.UnpackNotHeld, workspace.UnpackFetch:
		// The capture container did not start in time, or the snapshot
		// streamed in could not be fetched: infrastructure, retried like
		// an engine that cannot be reached.
		resp.Retry = true
	}
	return resp, true
}
