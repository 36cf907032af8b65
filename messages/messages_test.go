package messages_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

var update = flag.Bool("update", false, "rewrite golden files")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "golden file missing; run go test ./messages -update")
	require.Equal(t, string(want), string(got))
}

func TestRunRequestWireGolden(t *testing.T) {
	t.Parallel()
	full := messages.RunRequest{
		Version: 1, ID: "01JXAMPLE0000000000000000", Profile: "shell", Prompt: "uname -a; echo hello",
		Pool: "default", Group: "g1", GroupKey: exampleGroupKey, Timeout: messages.Duration(90 * time.Second),
		Env: map[string]string{"B": "2", "A": "1"}, Labels: map[string]string{"team": "infra"},
		Workspace: &messages.WorkspaceRef{
			Name:   "sha256-9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08.tar",
			Digest: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		},
	}
	b, err := json.MarshalIndent(full, "", "  ")
	require.NoError(t, err)
	golden(t, "run-request-full.json", append(b, '\n'))

	git := messages.RunRequest{
		Version: 1, ID: "01JXAMPLE0000000000000001", Profile: "shell", Prompt: "git log --oneline", Pool: "default",
		Workspace: &messages.WorkspaceRef{Git: &messages.GitSource{URL: "https://git.example.com/org/repo.git", Ref: "main"}},
	}
	b, err = json.MarshalIndent(git, "", "  ")
	require.NoError(t, err)
	golden(t, "run-request-git.json", append(b, '\n'))
	gotGit, err := messages.DecodeRunRequest(b)
	require.NoError(t, err)
	require.Equal(t, git, gotGit)

	minimal := messages.RunRequest{Profile: "shell", Prompt: "echo hi"}
	b, err = json.Marshal(minimal)
	require.NoError(t, err)
	golden(t, "run-request-minimal.json", append(b, '\n'))

	// The golden files decode back to the same requests.
	data, err := os.ReadFile("testdata/run-request-full.json")
	require.NoError(t, err)
	got, err := messages.DecodeRunRequest(data)
	require.NoError(t, err)
	require.Equal(t, full, got)
	data, err = os.ReadFile("testdata/run-request-minimal.json")
	require.NoError(t, err)
	got, err = messages.DecodeRunRequest(data)
	require.NoError(t, err)
	require.Equal(t, minimal.WithDefaults(), got)
}

func TestRunStateWireGolden(t *testing.T) {
	t.Parallel()
	code := 3
	at := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	st := messages.RunState{
		Version: 1, ID: "r1", State: messages.StateFailed, Profile: "shell", Pool: "default", Group: "r1",
		Worker: "host-abc123", ContainerID: "c0ffee", ExitCode: &code, Attempts: 1, Reason: "exit code 3",
		StreamSeq: 7, Coordination: "available", BridgeConnected: true,
		OutputBytes: 42, QueuedAt: at, StartedAt: at.Add(time.Second), FinishedAt: at.Add(2 * time.Second),
		UpdatedAt: at.Add(2 * time.Second),
	}
	b, err := json.MarshalIndent(st, "", "  ")
	require.NoError(t, err)
	golden(t, "run-state.json", append(b, '\n'))

	ev := messages.Event{RunID: "r1", Type: messages.EventFinished, Time: at, Attempt: 1, Worker: "host-abc123",
		ContainerID: "c0ffee", State: messages.StateFailed, ExitCode: &code, Reason: "exit code 3"}
	b, err = json.MarshalIndent(ev, "", "  ")
	require.NoError(t, err)
	golden(t, "event-finished.json", append(b, '\n'))
}

// A workspace result's wire form, refused names included: each is the
// path as it is, JSON escaping its control characters.
func TestWorkspaceResultWireGolden(t *testing.T) {
	t.Parallel()
	res := messages.WorkspaceResult{
		Base: "0b2144a4763d577b78267b76e5a27377155a1646", Head: "4dc2d701adfec4f756e7b0e8f3d55c1c4de8b364",
		Commits: 1, FilesChanged: 1, Insertions: 1, Deletions: 1,
		Files:   []messages.FileStat{{Path: "main.go", Insertions: 1, Deletions: 1}},
		Objects: []messages.ResultObject{{Name: "r1/7-1/patch", Size: 251, SHA256: "2efc"}},
		Error:   "2 paths left out: their names hold a control character, or a component git will not check out (see refused)",
		Refused: []string{"esc\x1b[31mred.txt", "nested/.GIT"}, RefusedCount: 2,
	}
	b, err := json.MarshalIndent(res, "", "  ")
	require.NoError(t, err)
	golden(t, "workspace-result.json", append(b, '\n'))
	var back messages.WorkspaceResult
	require.NoError(t, messages.DecodeStrictJSON(b, &back))
	require.Equal(t, res, back)
}

func TestDecodeRunRequestRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, want string
	}{
		{"not json", `nope`, "invalid character"},
		{"array", `[]`, "cannot unmarshal array"},
		{"unknown field", `{"profile":"shell","image":"evil"}`, `unknown field "image"`},
		{"trailing data", `{"profile":"shell"}x`, "data after the JSON object"},
		{"no profile", `{"prompt":"x"}`, "profile is required"},
		{"profile with dot", `{"profile":"a.b"}`, "profile"},
		{"bad version", `{"version":2,"profile":"shell"}`, "version 2 is not supported"},
		{"id with star", `{"id":"a*","profile":"shell"}`, "id"},
		{"id with gt", `{"id":"a>","profile":"shell"}`, "id"},
		{"id with space", `{"id":"a b","profile":"shell"}`, "id"},
		{"id too long", `{"id":"` + strings.Repeat("a", 65) + `","profile":"shell"}`, "longest allowed is 64"},
		{"pool with dot", `{"profile":"shell","pool":"a.b"}`, "pool"},
		{"group with space", `{"profile":"shell","group":"a b"}`, "group"},
		{"timeout number", `{"profile":"shell","timeout":30}`, "duration must be a string"},
		{"timeout garbage", `{"profile":"shell","timeout":"soon"}`, "invalid duration"},
		{"timeout negative", `{"profile":"shell","timeout":"-1s"}`, "negative"},
		{"timeout too long", `{"profile":"shell","timeout":"25h"}`, "longer than the longest allowed"},
		{"env bad name", `{"profile":"shell","env":{"1X":"v"}}`, "not a valid variable name"},
		{"env reserved", `{"profile":"shell","env":{"jetcrew_x":"v"}}`, "reserved"},
		{"env nul", `{"profile":"shell","env":{"X":"a\u0000b"}}`, "NUL"},
		{"env too long", `{"profile":"shell","env":{"X":"` + strings.Repeat("v", messages.MaxEnvValueBytes+1) + `"}}`, "longest allowed"},
		{"label empty key", `{"profile":"shell","labels":{"":"v"}}`, "label"},
		{"oversize", `{"profile":"shell","prompt":"` + strings.Repeat("p", messages.MaxRequestBytes) + `"}`, "largest allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := messages.DecodeRunRequest([]byte(tt.body))
			require.ErrorIs(t, err, messages.ErrInvalidRequest)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestDecodeRunRequestDefaults(t *testing.T) {
	t.Parallel()
	r, err := messages.DecodeRunRequest([]byte(`{"profile":"shell"}`))
	require.NoError(t, err)
	require.Equal(t, messages.DefaultPool, r.Pool)
	require.Equal(t, messages.RequestVersion, r.Version)
	require.Empty(t, r.ID)
	r.ID = "x1"
	require.Equal(t, "x1", r.GroupOrID())
	// A request that names no pool belongs to the pool it arrived on; one
	// that names a pool keeps it.
	g, err := messages.DecodeRunRequestInPool([]byte(`{"profile":"shell"}`), "gpu")
	require.NoError(t, err)
	require.Equal(t, "gpu", g.Pool)
	g, err = messages.DecodeRunRequestInPool([]byte(`{"profile":"shell","pool":"cpu"}`), "gpu")
	require.NoError(t, err)
	require.Equal(t, "cpu", g.Pool)
	r.Group = "g"
	require.Equal(t, "g", r.GroupOrID())
}

func TestValidateToken(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "A-b_9", strings.Repeat("z", 64), "01JXAMPLE"} {
		require.NoError(t, messages.ValidateToken("t", ok), ok)
	}
	for _, bad := range []string{"", "a.b", "*", ">", "a b", "a\tb", "é", "a/b", strings.Repeat("z", 65), "$JS"} {
		require.ErrorIs(t, messages.ValidateToken("t", bad), messages.ErrInvalidToken, bad)
	}
}

func TestSubjects(t *testing.T) {
	t.Parallel()
	require.Equal(t, "jetcrew.runs.default", messages.SubjectRuns("default"))
	require.Equal(t, "jetcrew.events.r1.output", messages.SubjectEvents("r1", messages.EventOutput))
	require.Equal(t, "jetcrew.events.r1.>", messages.SubjectEventsAll("r1"))
	require.Equal(t, "jetcrew.failed.gpu.r1", messages.SubjectFailed("gpu", "r1"))
	require.Equal(t, "workers-gpu", messages.ConsumerName("gpu"))
	require.Equal(t, "jetcrew.runs.gpu.replay", messages.SubjectReplay("gpu"))
	for subject, want := range map[string]struct {
		pool   string
		replay bool
	}{
		"jetcrew.runs.gpu":           {"gpu", false},
		"jetcrew.runs.gpu.replay":    {"gpu", true},
		"jetcrew.runs.replay":        {"replay", false},
		"jetcrew.runs.replay.replay": {"replay", true},
	} {
		p, err := messages.PoolFromSubject(subject)
		require.NoError(t, err, subject)
		require.Equal(t, want.pool, p, subject)
		require.Equal(t, want.replay, messages.IsReplaySubject(subject), subject)
	}
	for _, bad := range []string{"jetcrew.runs.", "jetcrew.runs.a.b", "other.runs.a", "jetcrew.runs", "jetcrew.runs..replay", "jetcrew.runs.a.b.replay", "jetcrew.runs.a.replay.replay"} {
		_, err := messages.PoolFromSubject(bad)
		require.Error(t, err, bad)
		require.False(t, messages.IsReplaySubject(bad), bad)
	}
}

func TestStateFinal(t *testing.T) {
	t.Parallel()
	for s, final := range map[messages.State]bool{
		messages.StateQueued: false, messages.StateRunning: false, messages.StateSucceeded: true,
		messages.StateFailed: true, messages.StateCancelled: true, messages.StateTimedOut: true,
	} {
		require.Equal(t, final, s.Final(), s)
	}
}

// FuzzDecodeRunRequest checks that no input panics the decoder and that
// every accepted request re-encodes to one that decodes the same.
func FuzzDecodeRunRequest(f *testing.F) {
	for _, s := range []string{`{"profile":"shell","prompt":"echo hi"}`, `{"id":"a","profile":"p","env":{"A":"b"},"timeout":"1s"}`, `{`, `null`, `{"labels":{"":""}}`,
		`{"profile":"p","workspace":{"git":{"url":"https://h/o/r.git","ref":"main"}}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := messages.DecodeRunRequest(data)
		if err != nil {
			return
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := messages.DecodeRunRequest(b)
		if err != nil {
			t.Fatalf("re-encoded request refused: %v\n%s", err, b)
		}
		require.Equal(t, r, r2)
	})
}

func TestEgressWireGolden(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	ev := messages.EgressEvent{RunID: "r1", Time: at, Method: "CONNECT", Host: "api.anthropic.com", Port: 443,
		Allowed: true, Addr: "160.79.104.10:443", BytesUp: 2048, BytesDown: 65536, DurationMS: 1234}
	b, err := json.MarshalIndent(ev, "", "  ")
	require.NoError(t, err)
	golden(t, "event-egress.json", append(b, '\n'))
	tot := messages.EgressTotals{Allowed: 3, Refused: 1, BytesUp: 4096, BytesDown: 131072}
	b, err = json.MarshalIndent(messages.RunState{ID: "r1", State: messages.StateSucceeded, Egress: &tot, UpdatedAt: at}, "", "  ")
	require.NoError(t, err)
	golden(t, "run-state-egress.json", append(b, '\n'))
}

// A subject PoolFromSubject accepts is exactly its pool's runs or replay
// subject, and its pool is one token.
func FuzzPoolFromSubject(f *testing.F) {
	for _, s := range []string{"jetcrew.runs.gpu", "jetcrew.runs.gpu.replay", "jetcrew.runs..replay", "jetcrew.runs.a.b", "jetcrew.runs.replay"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, subject string) {
		pool, err := messages.PoolFromSubject(subject)
		if err != nil {
			require.False(t, messages.IsReplaySubject(subject))
			return
		}
		require.NotEmpty(t, pool)
		require.NotContains(t, pool, ".")
		require.True(t, subject == messages.SubjectRuns(pool) || subject == messages.SubjectReplay(pool), subject)
		require.Equal(t, subject == messages.SubjectReplay(pool), messages.IsReplaySubject(subject))
	})
}
