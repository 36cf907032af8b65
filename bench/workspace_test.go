//go:build bench

package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/docker"
	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// wsRepeats is how many times the workspace figures are measured.
const wsRepeats = 2

// TestWorkspace measures workspaces through NATS Object Store with real
// Docker: submit (snapshot + upload) → the run's process sees the tree,
// against the same snapshot file moved by hand (Object Store put + get +
// tar -x); ten runs on one snapshot; and the capture of a 1,000-file change
// (the run's last act reads the clock; the state's finished_at is written
// after the capture and upload).
func TestWorkspace(t *testing.T) {
	dockerClient(t)
	s := workertest.StartServer(t)
	ctx := context.Background()
	rt, err := docker.New(ctx, docker.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Close() })
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	tap := &logTap{}
	wlog := zerolog.New(tap)
	stateDir := workertest.StateDir(t)
	startBenchWorker(t, s, worker.Config{
		ID: "bench-ws-" + hex.EncodeToString(suffix), Runtime: rt, Concurrency: 2, Profiles: profiles(t),
		StateDir: stateDir, BridgePath: binary(t, "jetcrew-bridge"), Logger: &wlog,
	})
	nc := workertest.Connect(t, s)
	d, err := dispatcher.New(nc)
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	wsb, _, err := workspace.EnsureBuckets(ctx, js, workspace.BucketConfig{})
	require.NoError(t, err)
	repo := benchRepo(t, 25<<10)
	small := benchRepo(t, 512)

	var jet, raw, floor []float64
	var rawParts [3][]float64
	var stages []wsStages
	var size int64
	for range wsRepeats {
		up, st := wsStagesSample(t, d, wsb, tap, repo, stateDir)
		size = up.Info.Size
		jet = append(jet, st.total)
		stages = append(stages, st)
		parts := rawWorkspaceSample(t, wsb, repo)
		raw = append(raw, parts[0]+parts[1]+parts[2])
		for i := range parts {
			rawParts[i] = append(rawParts[i], parts[i])
		}
		floor = append(floor, runStartSample(t, d))
	}
	record(t, "workspace_snapshot_mib", Figure{Value: round(float64(size)/(1<<20), 1), Unit: "MiB",
		What: "the benchmark's workspace: a git work tree of 1,000 files (50 MiB) with two commits, as one snapshot (tree + .git with HEAD's history)"})
	record(t, "raw_object_put_get_untar_ms", Figure{Value: round(median(raw), 0), Unit: "ms", Samples: len(raw), Repeats: raw,
		What: "the same snapshot file moved by hand: Object Store put + get (nats.go, as `nats object put/get` do) + `tar -xf` onto tmpfs (/dev/shm), as a run's workspace volume is"})
	record(t, "workspace_submit_to_tree_ms", Figure{Value: round(median(jet), 0), Unit: "ms", Baseline: "raw_object_put_get_untar_ms", Samples: len(jet), Repeats: jet,
		What: "`submit --workspace` → the run's process sees the tree: snapshot (walk, HEAD's history: loose object files copied, the rest packed; tar, SHA-256) + upload + submit → worker download, digest check, tar header scan → container start → unpack inside the run's container → process reads the clock"})
	for i, part := range []string{"put", "get", "untar"} {
		record(t, "raw_object_"+part+"_ms", Figure{Value: round(median(rawParts[i]), 0), Unit: "ms", Baseline: "raw_object_put_get_untar_ms", Samples: len(rawParts[i]), Repeats: rawParts[i],
			What: "part of `raw_object_put_get_untar_ms`: the " + part})
	}
	recordWsStages(t, stages)
	record(t, "workspace_floor_run_start_ms", Figure{Value: round(median(floor), 0), Unit: "ms", Baseline: "raw_object_put_get_untar_ms", Samples: len(floor), Repeats: floor,
		What: "the same worker, a run without a workspace: submit → the run's process reads the clock (the container's part of `workspace_submit_to_tree_ms`, which no workspace change removes)"})

	// Ten runs on one snapshot.
	var starts []float64
	var uploaded int64
	for i := range 10 {
		up, took := wsSample(t, d, small, "adjtimex")
		if !up.Reused {
			uploaded += up.Info.Size
		}
		require.Equal(t, i > 0, up.Reused)
		starts = append(starts, took)
	}
	record(t, "workspace_ten_runs_uploaded_mib", Figure{Value: round(float64(uploaded)/(1<<20), 2), Unit: "MiB",
		What: "bytes uploaded for ten runs on one snapshot (the nine after the first find it by digest); the snapshot of 1,000 files of 1 KiB with two commits"})
	record(t, "workspace_first_run_start_ms", Figure{Value: round(starts[0], 0), Unit: "ms",
		What: "the first of ten runs on one snapshot: submit (with upload) → process reads the clock"})
	record(t, "workspace_tenth_run_start_ms", Figure{Value: round(starts[9], 0), Unit: "ms", Baseline: "workspace_first_run_start_ms",
		What: "the tenth: submit (snapshot taken, upload skipped) → process reads the clock"})

	// Capture of a 1,000-file change, against git doing the same by hand.
	var capture, rawCapture []float64
	for range wsRepeats {
		capture = append(capture, captureSample(t, d, small))
		rawCapture = append(rawCapture, rawGitCaptureSample(t, small))
	}
	record(t, "raw_git_capture_1000_files_ms", Figure{Value: round(median(rawCapture), 0), Unit: "ms", Samples: len(rawCapture), Repeats: rawCapture,
		What: "the same 1,000-file change captured by hand: a copy of the workspace's repository on a tmpfs (/dev/shm; the run's workspace is a tmpfs volume), each file appended to as the run does (untimed), then `git add -A && git commit -q && git bundle create` (the new commit, base..HEAD) `&& git diff --binary` base HEAD (git " + gitVersion(t) + "); no upload"})
	record(t, "workspace_capture_1000_files_ms", Figure{Value: round(median(capture), 0), Unit: "ms", Baseline: "raw_git_capture_1000_files_ms", Samples: len(capture), Repeats: capture,
		What: "a run appends a line to each of 1,000 files, then reads the clock as its last act → its state is final with the result (capture: walk, hash, commit, patch, bundle; upload); issue 25's goal, once workspace runs start warm: ≤ 1.5× the same change captured by hand with git"})
}

// rawGitCaptureSample copies repo to a new directory on a tmpfs
// (/dev/shm), appends a line to each of its 1,000 files as captureSample's
// run does (untimed), and returns how long git takes to capture the
// change as a run's result: add, commit, a bundle of the new commit and a
// binary diff of it, in ms.
func rawGitCaptureSample(t *testing.T, repo string) float64 {
	t.Helper()
	var fs unix.Statfs_t
	require.NoError(t, unix.Statfs("/dev/shm", &fs))
	require.EqualValues(t, unix.TMPFS_MAGIC, fs.Type, "/dev/shm must be a tmpfs")
	tmp, err := os.MkdirTemp("/dev/shm", "bench-capture-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	dir := filepath.Join(tmp, "ws")
	sh := func(script string) {
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=b", "GIT_AUTHOR_EMAIL=b@x", "GIT_COMMITTER_NAME=b", "GIT_COMMITTER_EMAIL=b@x")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	out, err := exec.Command("cp", "-a", repo, dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	sh("for f in d*/f*.txt; do echo changed >> $f; done")
	t0 := time.Now()
	sh("base=$(git rev-parse HEAD) && git add -A && git commit -q -m run && git bundle create -q ../run.bundle $base..HEAD && git diff --binary $base HEAD > ../run.patch")
	took := ms(time.Since(t0))
	st, err := os.Stat(filepath.Join(tmp, "run.patch"))
	require.NoError(t, err)
	require.Positive(t, st.Size())
	return took
}

// gitVersion returns git's version number.
func gitVersion(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "version").Output()
	require.NoError(t, err)
	return strings.TrimPrefix(strings.TrimSpace(string(out)), "git version ")
}

// benchRepo makes a git work tree of 1,000 files of 2*half bytes (hex of
// random bytes) in ten directories, with two commits rewriting every file.
func benchRepo(t *testing.T, half int) string {
	dir := t.TempDir()
	git := func(args ...string) {
		cmd := exec.Command("git", append([]string{"-c", "user.name=b", "-c", "user.email=b@x"}, args...)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	git("init", "-q", "-b", "main")
	buf := make([]byte, half)
	writeAll := func(salt string) {
		for i := range 1000 {
			_, _ = rand.Read(buf)
			p := filepath.Join(dir, fmt.Sprintf("d%d", i%10), fmt.Sprintf("f%d.txt", i/10))
			require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			require.NoError(t, os.WriteFile(p, []byte(salt+hex.EncodeToString(buf)), 0o644))
		}
	}
	writeAll("one\n")
	git("add", "-A")
	git("commit", "-qm", "one")
	writeAll("two\n")
	git("commit", "-qam", "two")
	return dir
}

// wsSample submits a run with the workspace repo and returns what the
// upload did and how long after the submit began the run's process read
// the clock, in ms. The run must succeed.
func wsSample(t *testing.T, d *dispatcher.Dispatcher, repo, prompt string) (workspace.Uploaded, float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	up, err := d.UploadWorkspace(ctx, repo, workspace.SnapshotOptions{}, workspace.BucketConfig{})
	require.NoError(t, err)
	id, err := d.Submit(ctx, messages.RunRequest{Profile: "nocoord", Prompt: prompt, Workspace: &up.Ref})
	require.NoError(t, err)
	out := watchOutput(t, ctx, d, id)
	ran, err := probeTime(out)
	require.NoError(t, err)
	return up, ms(ran.Sub(t0))
}

// watchOutput follows run id to its end, requires success and returns its
// stdout.
func watchOutput(t *testing.T, ctx context.Context, d *dispatcher.Dispatcher, id string) []byte {
	t.Helper()
	var out bytes.Buffer
	fin, err := d.Watch(ctx, id, func(ev dispatcher.WatchEvent) error {
		if ev.Type == messages.EventOutput && ev.Stream == messages.StreamStdout {
			out.Write(ev.Data)
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, messages.StateSucceeded, fin.State, "run %s: %s", id, fin.Reason)
	return out.Bytes()
}

// runStartSample submits a run without a workspace and returns how long
// after the submit began its process read the clock, in ms.
func runStartSample(t *testing.T, d *dispatcher.Dispatcher) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	id, err := d.Submit(ctx, messages.RunRequest{Profile: "nocoord", Prompt: "adjtimex"})
	require.NoError(t, err)
	ran, err := probeTime(watchOutput(t, ctx, d, id))
	require.NoError(t, err)
	return ms(ran.Sub(t0))
}

// rawWorkspaceSample snapshots repo to a file (untimed), then times an
// Object Store put of it, a get into another file and `tar -xf` of that:
// the three times in ms.
func rawWorkspaceSample(t *testing.T, obs jetstream.ObjectStore, repo string) [3]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	f, err := os.Create(filepath.Join(tmp, "ws.tar"))
	require.NoError(t, err)
	_, err = workspace.Snapshot(repo, f, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	var took [3]float64
	t0 := time.Now()
	_, err = obs.PutFile(ctx, filepath.Join(tmp, "ws.tar"))
	require.NoError(t, err)
	took[0] = ms(time.Since(t0))
	t0 = time.Now()
	require.NoError(t, obs.GetFile(ctx, filepath.Join(tmp, "ws.tar"), filepath.Join(tmp, "got.tar")))
	took[1] = ms(time.Since(t0))
	x := untarDir(t)
	t0 = time.Now()
	out, err := exec.Command("tar", "-xf", filepath.Join(tmp, "got.tar"), "-C", x).CombinedOutput()
	require.NoError(t, err, "%s", out)
	took[2] = ms(time.Since(t0))
	require.NoError(t, obs.Delete(ctx, filepath.Join(tmp, "ws.tar")))
	return took
}

// untarDir returns an empty directory for the raw baseline's `tar -x`: on
// tmpfs (/dev/shm), as a run's workspace volume is (a tmpfs volume of the
// profile's workspace_mib), so that the baseline unpacks onto the same
// kind of file system as the runs it is compared with; the test's temp
// directory where there is no /dev/shm.
func untarDir(t *testing.T) string {
	t.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "jetcrew-bench-")
		require.NoError(t, err)
		t.Cleanup(func() { _ = os.RemoveAll(d) })
		return d
	}
	return t.TempDir()
}

// captureSample runs a change of 1,000 files and returns the time from the
// run's last act to its final state (written after the capture), in ms.
func captureSample(t *testing.T, d *dispatcher.Dispatcher, repo string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	up, err := d.UploadWorkspace(ctx, repo, workspace.SnapshotOptions{}, workspace.BucketConfig{})
	require.NoError(t, err)
	id, err := d.Submit(ctx, messages.RunRequest{Profile: "nocoord", Workspace: &up.Ref,
		Prompt: "for f in d*/f*.txt; do echo changed >> $f; done; adjtimex"})
	require.NoError(t, err)
	ran, err := probeTime(watchOutput(t, ctx, d, id))
	require.NoError(t, err)
	st, err := d.Status(ctx, id)
	require.NoError(t, err)
	require.NotNil(t, st.WorkspaceResult)
	require.Empty(t, st.WorkspaceResult.Error)
	require.Equal(t, 1000, st.WorkspaceResult.FilesChanged)
	return ms(st.FinishedAt.Sub(ran))
}
