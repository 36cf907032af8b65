//go:build bench

package bench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// logTap is a worker's log sink keeping each JSON line with the time it
// was written (zerolog writes a line when the event happens).
type logTap struct {
	mu    sync.Mutex
	lines []tappedLine
}

// tappedLine is one log line: when it was written and its fields.
type tappedLine struct {
	at     time.Time
	fields map[string]any
}

func (l *logTap) Write(p []byte) (int, error) {
	at := time.Now()
	var m map[string]any
	if json.Unmarshal(p, &m) == nil {
		l.mu.Lock()
		l.lines = append(l.lines, tappedLine{at: at, fields: m})
		l.mu.Unlock()
	}
	return len(p), nil
}

// find returns the last line of run id with message msg.
func (l *logTap) find(t *testing.T, id, msg string) tappedLine {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.lines) - 1; i >= 0; i-- {
		if f := l.lines[i].fields; f["run_id"] == id && f["message"] == msg {
			return l.lines[i]
		}
	}
	t.Fatalf("no %q log line for run %s", msg, id)
	return tappedLine{}
}

// wsStages is one submit → tree sample cut into its parts, in ms.
type wsStages struct {
	total float64
	// Submit side (workspace.Uploaded's Stages and times).
	git, history, walk, write, snapshot, upload float64
	// queue: upload done → the worker begins staging (publish, fetch,
	// claim, plan). staging: the worker's download, digest check and
	// header scan into its snapshot cache (its "workspace staged" log
	// line), and the copy of the checked upload into jetcrew-workspaces. container: staged → the run's process reads the clock
	// (create, start, the in-jail unpack, exec).
	queue, staging, container float64
	// download and unpack: the same snapshot downloaded (digest checked)
	// and unpacked again by the bench itself, to split staging.
	download, unpack float64
}

// wsStagesSample submits a run on repo like wsSample and returns its
// stages; it deletes the snapshot afterwards, from both buckets, so the
// next sample uploads again.
func wsStagesSample(t *testing.T, d *dispatcher.Dispatcher, obs *workspace.SnapshotStore, tap *logTap, repo, stateDir string) (workspace.Uploaded, wsStages) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	up, err := d.UploadWorkspace(ctx, repo, workspace.SnapshotOptions{}, workspace.BucketConfig{})
	require.NoError(t, err)
	uploaded := time.Now()
	require.False(t, up.Reused)
	id, err := d.Submit(ctx, messages.RunRequest{Profile: "nocoord", Prompt: "ls d0/f0.txt >/dev/null && adjtimex", Workspace: &up.Ref})
	require.NoError(t, err)
	ran, err := probeTime(watchOutput(t, ctx, d, id))
	require.NoError(t, err)
	staged := tap.find(t, id, "workspace staged")
	stagedIn, ok := staged.fields["staged_in"].(float64) // zerolog: ms
	require.True(t, ok, "staged_in in %v", staged.fields)
	s := wsStages{
		total: ms(ran.Sub(t0)),
		git:   ms(up.Stages.Git), history: ms(up.Stages.History), walk: ms(up.Stages.Walk), write: ms(up.Stages.Write),
		snapshot: ms(up.SnapshotTook), upload: ms(up.UploadTook),
		queue:   ms(staged.at.Sub(uploaded)) - stagedIn,
		staging: stagedIn, container: ms(ran.Sub(staged.at)),
	}
	s.download, s.unpack = stageByHand(t, ctx, obs, up.Ref)
	require.NoError(t, obs.Delete(ctx, up.Ref.Name))
	require.NoError(t, obs.Uploads.Delete(ctx, up.Ref.Name))
	// The worker keeps downloaded snapshots by digest (StateDir/snap); the
	// next sample, of the same tree, must download it again.
	cached, err := filepath.Glob(filepath.Join(stateDir, "snap", "*.tar"))
	require.NoError(t, err)
	for _, f := range cached {
		require.NoError(t, os.Remove(f))
	}
	return up, s
}

// stageByHand downloads ref (digest checked) and unpacks it as the worker
// does, and returns the two times in ms.
func stageByHand(t *testing.T, ctx context.Context, obs jetstream.ObjectStore, ref messages.WorkspaceRef) (float64, float64) {
	t.Helper()
	dir := t.TempDir()
	t0 := time.Now()
	require.NoError(t, workspace.Download(ctx, obs, ref, filepath.Join(dir, "snapshot.tar"), 0))
	download := ms(time.Since(t0))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "tree"), 0o700))
	f, err := os.Open(filepath.Join(dir, "snapshot.tar"))
	require.NoError(t, err)
	defer f.Close()
	t0 = time.Now()
	require.NoError(t, workspace.Unpack(f, filepath.Join(dir, "tree"), workspace.UnpackOptions{UID: 1000, GID: 1000}))
	return download, ms(time.Since(t0))
}

// recordWsStages records the median of each stage of samples, each against
// the raw baseline (same run).
func recordWsStages(t *testing.T, samples []wsStages) {
	t.Helper()
	stages := []struct {
		name, what string
		get        func(wsStages) float64
	}{
		{"workspace_stage_snapshot_ms", "submit side, whole snapshot into its temporary file (the four parts below and the file)", func(s wsStages) float64 { return s.snapshot }},
		{"workspace_stage_git_open_ms", "snapshot: open the repository, read its index", func(s wsStages) float64 { return s.git }},
		{"workspace_stage_history_ms", "snapshot: list HEAD's history, read its loose object files (copied as they are), pack the others (no deltas, zlib BestSpeed), index file", func(s wsStages) float64 { return s.history }},
		{"workspace_stage_walk_ms", "snapshot: list the work tree, ignore rules applied", func(s wsStages) float64 { return s.walk }},
		{"workspace_stage_write_ms", "snapshot: read the files, write the tar (.git and tree) and its SHA-256", func(s wsStages) float64 { return s.write }},
		{"workspace_stage_upload_ms", "submit side: look the digest up, Object Store put of the snapshot file", func(s wsStages) float64 { return s.upload }},
		{"workspace_stage_queue_ms", "upload done → the worker begins staging: submit (publish), fetch, claim, plan", func(s wsStages) float64 { return s.queue }},
		{"workspace_stage_worker_staging_ms", "worker: staging before the run's container is created (its `workspace staged` log line): the buckets' records checked, the cache's file made and linked into the run's input directory, the download begun (it streams on beside the container's start)", func(s wsStages) float64 { return s.staging }},
		{"workspace_stage_download_ms", "by hand on the same snapshot, for scale: workspace.Download (Object Store get to a file, SHA-256 checked); in the run it streams beside the container's start and the in-jail unpack", func(s wsStages) float64 { return s.download }},
		{"workspace_stage_unpack_ms", "by hand on the same snapshot, for scale: workspace.Unpack (os.Root, chown to 1000:1000) from the whole file", func(s wsStages) float64 { return s.unpack }},
		{"workspace_stage_container_ms", "worker: staged → the run's process reads the clock: the container's create and start, the download and the in-jail unpack following it (overlapped), the digest check, exec", func(s wsStages) float64 { return s.container }},
	}
	for _, st := range stages {
		var xs []float64
		for _, s := range samples {
			xs = append(xs, st.get(s))
		}
		record(t, st.name, Figure{Value: round(median(xs), 0), Unit: "ms", Baseline: "raw_object_put_get_untar_ms", Samples: len(xs), Repeats: xs,
			What: "part of `workspace_submit_to_tree_ms`, " + st.what})
	}
}
