package tree

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/workspace"
)

// The agent CLI's session (docs/workspaces.md, "Follow-ups"). A run whose
// backend can resume (profile.Plan.SessionDir) has `jetcrew workspace exec`
// keep a copy of the CLI's session directory in the workspace once the
// agent exited; the capture returns it as the messages.ResultSession
// object, which the worker masks with the run's secret mask and stores
// beside the patch and bundle. A follow-up (the request's session.from)
// gets that object back, read-only, and exec restores it into the new
// run's HOME before the agent starts, which the engine starts with the
// CLI's resume flag (stage.PrestartResponse.Resume) — when the earlier run
// is of the same profile, kept a session and recorded its id. Otherwise
// the follow-up starts fresh on the earlier run's tree, and its state's
// session says why.

// stageSession sets what the run does with the CLI's session: rw's session
// directory (kept by exec) and, for a follow-up that can resume, the
// earlier session's object in rw's directory and the resume id in resp.
// A session that cannot be had makes the run start fresh, noted; only a
// store that cannot be reached is an error (transient).
func (s *Stage) stageSession(ctx context.Context, req *stage.PrestartRequest, rw *runWorkspace, resp *stage.PrestartResponse) error {
	plan, prof := req.Run.Plan, req.Run.Profile
	rw.sessionDir, rw.sessionSkip = plan.SessionDir, plan.SessionSkip
	ref := s.run.Request.Session
	if ref == nil {
		return nil
	}
	s.session = &messages.SessionNote{From: ref.From}
	src := s.fromState
	var obj *messages.ResultObject
	if src != nil && src.WorkspaceResult != nil {
		for i, o := range src.WorkspaceResult.Objects {
			if strings.HasSuffix(o.Name, "/"+messages.ResultSession) {
				obj = &src.WorkspaceResult.Objects[i]
			}
		}
	}
	switch {
	case src == nil:
		s.session.Fresh = "the workspace does not start from run " + ref.From
	case src.Profile != prof.Name:
		s.session.Fresh = fmt.Sprintf("run %s ran profile %q, not %q: a session is never fed to another profile", ref.From, src.Profile, prof.Name)
	case plan.SessionDir == "":
		s.session.Fresh = fmt.Sprintf("backend %s cannot resume a session", prof.Backend)
	case src.Agent == nil || !messages.ValidSessionID(src.Agent.SessionID):
		s.session.Fresh = fmt.Sprintf("run %s recorded no session id of its agent CLI", ref.From)
	case obj == nil:
		why := "its session files were not kept"
		if e := src.WorkspaceResult.SessionError; e != "" {
			why = e
		}
		s.session.Fresh = fmt.Sprintf("run %s kept no session: %s", ref.From, why)
	}
	if s.session.Fresh != "" {
		s.run.Log.Info().Str("from_run", ref.From).Str("fresh", s.session.Fresh).Msg("follow-up starts a fresh session")
		return nil
	}
	_, results, err := s.t.stores(ctx)
	if err != nil {
		return stageError(err, false)
	}
	data, err := readResultObject(ctx, results, *obj, messages.MaxSessionBytes+1<<20) // from.go
	if errors.Is(err, errFromRefused) {
		s.session.Fresh = fmt.Sprintf("run %s's session: %v", ref.From, err)
		return nil
	}
	if err != nil {
		return stageError(fmt.Errorf("read the session of run %s: %w", ref.From, err), false)
	}
	rw.sessionIn = filepath.Join(rw.dir, "session.tar")
	if err := os.WriteFile(rw.sessionIn, data, 0o444); err != nil {
		return stageError(err, false)
	}
	rw.sessionSum = obj.SHA256
	s.session.Resumed, s.session.ID = true, src.Agent.SessionID
	resp.Resume = src.Agent.SessionID
	return nil
}

// maskedSession returns the session object o with each file's content
// masked with the run's secret mask (unchanged when the run has none):
// the session is the agent's transcript, shown to whoever reads results.
// The object is at most messages.MaxSessionBytes plus its tar headers.
func (s *Stage) maskedSession(o workspace.CaptureObject) (workspace.CaptureObject, error) {
	if s.mask == nil {
		return o, nil
	}
	if o.Size > messages.MaxSessionBytes+1<<20 {
		return o, fmt.Errorf("the session object is %d bytes, over the cap", o.Size)
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	tr := tar.NewReader(io.NewSectionReader(o.Data, 0, o.Size))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return o, err
		}
		var content []byte
		if hdr.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				return o, err
			}
			content = []byte(s.mask.String(string(b)))
			hdr.Size = int64(len(content))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return o, err
		}
		if _, err := tw.Write(content); err != nil {
			return o, err
		}
	}
	if err := tw.Close(); err != nil {
		return o, err
	}
	sum := sha256.Sum256(out.Bytes())
	return workspace.CaptureObject{Kind: o.Kind, Data: io.NewSectionReader(bytes.NewReader(out.Bytes()), 0, int64(out.Len())),
		Size: int64(out.Len()), SHA256: hex.EncodeToString(sum[:])}, nil
}
