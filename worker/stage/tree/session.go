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
	"github.com/jetcrew/jetcrew/worker/profile"
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
	rw.sessionDir, rw.sessionNames = plan.SessionDir, workspace.SessionNames{Keep: plan.SessionKeep, Skip: plan.SessionSkip}
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
	if names, err := tarNames(data); err != nil || !prof.HoldsSession(names, src.Agent.SessionID) {
		s.session.Fresh = fmt.Sprintf("run %s's session holds no session file of id %s: not resumed", ref.From, src.Agent.SessionID)
		s.run.Log.Info().Str("from_run", ref.From).Str("fresh", s.session.Fresh).Msg("follow-up starts a fresh session")
		return nil
	}
	rw.sessionIn = filepath.Join(rw.in(), "session.tar") // JailSessionPath
	if err := os.WriteFile(rw.sessionIn, data, 0o444); err != nil {
		return stageError(err, false)
	}
	rw.sessionSum = obj.SHA256
	s.session.Resumed, s.session.ID, s.session.Digest = true, src.Agent.SessionID, "sha256:"+obj.SHA256
	resp.Resume = src.Agent.SessionID
	return nil
}

// FirstAnswer stops a follow-up whose resumed session the model API
// refuses at its first answer with a 400 (invalid request): a session
// whose last turn was interrupted mid-thinking ends in a thinking block,
// and every request of it is refused alike (anthropics/claude-code#63374),
// so the run fails at once, never retried, the API's error and the way
// out named.
func (s *Stage) FirstAnswer(a profile.Answer) *stage.Stop {
	if s.session == nil || !s.session.Resumed || a.APIStatus != 400 {
		return nil
	}
	return &stage.Stop{State: messages.StateFailed, Reason: fmt.Sprintf("the session %s of run %s, resumed, is refused by the model API at its first answer: %s: "+
		"every request of it is refused alike (its last turn was cut short, as mid-thinking: anthropics/claude-code#63374); "+
		"`jetcrew followup --fresh %s` starts over on the same tree without it", s.session.ID, s.session.From, oneLine(a.Text), s.session.From)}
}

// oneLine returns the first line of s, at most 512 bytes of it.
func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 512 {
		s = s[:512] + "..."
	}
	return s
}

// tarNames returns the names of the regular files of the tar data.
func tarNames(data []byte) ([]string, error) {
	var names []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return names, nil
		}
		if err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			names = append(names, hdr.Name)
		}
	}
}

// keptSession returns the session object o as the run keeps it: the
// entries names keeps (what else the workspace's session directory holds,
// written there after exec's copy or forged, is dropped), each file's
// content masked with mask (nil: a run without secrets), under fresh
// headers (regular files mode 0600, directories 0700). The session is
// refused (an error: not kept, the follow-up starts fresh, saying so)
// when an entry's name holds a secret value of the run (masking it would
// rename the CLI's file; the names are readable by every submitter), and
// when a SQLite file (database, WAL or rollback journal) holds one:
// masking bytes inside a database breaks it (a WAL frame's checksum, a
// record's length, an index's order), so a database is kept byte for
// byte or not at all. Like the output mask it matches bytes: a value
// SQLite splits across two pages (a long text's overflow) or encodes is
// not seen. The object is at most messages.MaxSessionBytes plus its tar
// headers.
func keptSession(o workspace.CaptureObject, names workspace.SessionNames, mask stage.Masker) (workspace.CaptureObject, error) {
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
		name := strings.TrimSuffix(hdr.Name, "/")
		if !names.Kept(name) {
			continue
		}
		if mask != nil && mask.String(hdr.Name) != hdr.Name {
			return o, errors.New("an entry's name holds a secret value of the run")
		}
		if err := keepSessionEntry(tw, tr, hdr, mask); err != nil {
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

// keepSessionEntry writes the session entry hdr (its content read from
// tr) to tw under a fresh header: a directory, or a regular file whose
// content is masked with mask, or refused when it is a SQLite file mask
// would change.
func keepSessionEntry(tw *tar.Writer, tr io.Reader, hdr *tar.Header, mask stage.Masker) error {
	out := &tar.Header{Name: hdr.Name, ModTime: hdr.ModTime, Typeflag: hdr.Typeflag}
	switch hdr.Typeflag {
	case tar.TypeDir:
		out.Mode = 0o700
		return tw.WriteHeader(out)
	case tar.TypeReg:
	default:
		return fmt.Errorf("entry %q is not a file or directory", hdr.Name)
	}
	b, err := io.ReadAll(tr)
	if err != nil {
		return err
	}
	if mask != nil {
		masked := mask.String(string(b))
		switch {
		case masked == string(b):
		case isSQLite(b):
			return fmt.Errorf("%s is a SQLite file holding a secret value of the run: a database is never masked", hdr.Name)
		default:
			b = []byte(masked)
		}
	}
	out.Mode, out.Size = 0o600, int64(len(b))
	if err := tw.WriteHeader(out); err != nil {
		return err
	}
	_, err = tw.Write(b)
	return err
}

// SQLite's file headers (sqlite.org/fileformat.html): a database's first
// 16 bytes, a write-ahead log's first 4 (big-endian 0x377f0682 or
// 0x377f0683), a rollback journal's first 8.
var (
	sqliteDBMagic      = []byte("SQLite format 3\x00")
	sqliteWALMagics    = [][]byte{{0x37, 0x7f, 0x06, 0x82}, {0x37, 0x7f, 0x06, 0x83}}
	sqliteJournalMagic = []byte{0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7}
)

// isSQLite reports whether b is a SQLite database, write-ahead log or
// rollback journal, by its header.
func isSQLite(b []byte) bool {
	if bytes.HasPrefix(b, sqliteDBMagic) || bytes.HasPrefix(b, sqliteJournalMagic) {
		return true
	}
	for _, m := range sqliteWALMagics {
		if bytes.HasPrefix(b, m) {
			return true
		}
	}
	return false
}
