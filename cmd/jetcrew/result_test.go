package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// Names a hostile run chooses for its files: a bidi override that shows
// "invoice<U+202E>fdp.sh" as "invoicehs.pdf", a C1 CSI, an escape sequence
// that retitles the window, a newline and a tab that forge a line or a
// column of the listing.
const (
	nameBidi = "invoice\u202efdp.sh"
	nameC1   = "c1\u009b31mred.txt"
	nameOSC  = "osc\x1b]0;pwned\a.txt"
	nameNL   = "nl\n  forged.txt | binary"
	nameTab  = "tab\tname.txt"
)

// hostilePatch is the run's patch: names and lines a terminal would obey.
const hostilePatch = "diff --git a/" + nameBidi + " b/" + nameBidi + "\nnew file mode 100644\n--- /dev/null\n+++ b/" + nameBidi +
	"\n@@ -0,0 +1 @@\n+\x1b]0;pwned\a\u009b2J\u202eevil\n"

// hostileArtifact is the content of the artifact named nameBidi.
const hostileArtifact = "#!/bin/sh\n\x1b]0;pwned\a\u202e\n"

// hostileResult stores, on a fresh server, the state of run "hostile", a
// finished workspace run whose every name is its own choice and hostile,
// and its patch and artifacts tar, and returns the server's URL.
func hostileResult(t *testing.T) string {
	t.Helper()
	s := workertest.StartServer(t)
	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	ctx := t.Context()

	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	arts := []messages.ResultObject{}
	for _, f := range []struct{ name, body string }{{nameBidi, hostileArtifact}, {nameTab, "x\n"}, {nameC1, ""}} {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(f.body))}))
		_, err := tw.Write([]byte(f.body))
		require.NoError(t, err)
		arts = append(arts, messages.ResultObject{Name: f.name, Size: int64(len(f.body)), SHA256: sum(f.body)})
	}
	require.NoError(t, tw.Close())

	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: messages.BucketResults})
	require.NoError(t, err)
	var objs []messages.ResultObject
	for kind, body := range map[string]string{messages.ResultPatch: hostilePatch, messages.ResultArtifacts: tb.String()} {
		name := messages.ResultObjectName("hostile", 1, 1, kind)
		_, err := obs.PutBytes(ctx, name, []byte(body))
		require.NoError(t, err)
		objs = append(objs, messages.ResultObject{Name: name, Size: int64(len(body)), SHA256: sum(body)})
	}

	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: messages.BucketRuns})
	require.NoError(t, err)
	st := messages.RunState{Version: 1, ID: "hostile", State: messages.StateSucceeded, Profile: "shell", Pool: "default",
		UpdatedAt: time.Now(), WorkspaceResult: &messages.WorkspaceResult{
			Base: strings.Repeat("a", 40), Head: strings.Repeat("b", 40), Commits: 1, FilesChanged: 5, Insertions: 4, Deletions: 1,
			Files: []messages.FileStat{
				{Path: nameBidi, Insertions: 1}, {Path: nameC1, Insertions: 2, Deletions: 1},
				{Path: nameOSC, Binary: true}, {Path: nameNL, Insertions: 1}, {Path: "empty.txt"},
			},
			Objects: objs, Artifacts: arts,
			Error: "capture: \x1b[2J\u202ewarning",
		}}
	data, err := json.Marshal(st)
	require.NoError(t, err)
	_, err = kv.Put(ctx, "hostile", data)
	require.NoError(t, err)
	return s.ClientURL()
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// requireInert checks that out holds nothing a terminal obeys or that
// reorders text: no C0 control but newline, no DEL, no C1 control, no bidi
// control.
func requireInert(t *testing.T, out string, what ...any) {
	t.Helper()
	for _, r := range out {
		if r == '\n' {
			continue
		}
		require.False(t, r < 0x20 || (r >= 0x7f && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) ||
			r == 0x200e || r == 0x200f || r == 0x061c, "%U reaches the terminal in %q %v", r, out, what)
	}
}

// Every name a run chose reaches the submitter's terminal
// escaped, as status and failed show reasons: result's files, objects,
// artifacts and error, artifacts' list, and a newline or a tab in a name
// forges no line or column. diff and artifacts --get are exact when piped
// (git apply reads the patch) and escaped on a terminal.
func TestResultNamesShownEscaped(t *testing.T) {
	t.Parallel()
	url := hostileResult(t)

	code, stdout, stderr := cli(t, url, "result", "hostile")
	require.Equal(t, 0, code, stderr)
	requireInert(t, strings.ReplaceAll(stdout, "\t", " "), "result")
	require.Contains(t, stdout, `  invoice\u202efdp.sh | +1 -0`+"\n")
	require.Contains(t, stdout, `  c1\u009b31mred.txt | +2 -1`+"\n")
	require.Contains(t, stdout, `  osc\x1b]0;pwned\a.txt | binary`+"\n")
	require.Contains(t, stdout, `  nl\n  forged.txt | binary | +1 -0`+"\n", "a newline in a name forges no line")
	require.Contains(t, stdout, `capture: \x1b[2J\u202ewarning`)
	require.Contains(t, stdout, `artifact invoice\u202efdp.sh (`)
	require.Contains(t, stdout, `artifact tab\tname.txt (`)
	require.Contains(t, stdout, "  empty.txt | +0 -0\n", "a text file with no lines changed")

	// --json decodes to exactly the names the run chose, and shows inert.
	code, stdout, stderr = cli(t, url, "result", "--json", "hostile")
	require.Equal(t, 0, code, stderr)
	requireInert(t, stdout, "result --json")
	var res messages.WorkspaceResult
	require.NoError(t, json.Unmarshal([]byte(stdout), &res))
	require.Equal(t, []string{nameBidi, nameC1, nameOSC, nameNL, "empty.txt"},
		[]string{res.Files[0].Path, res.Files[1].Path, res.Files[2].Path, res.Files[3].Path, res.Files[4].Path})
	require.Equal(t, nameTab, res.Artifacts[1].Name)

	code, stdout, stderr = cli(t, url, "artifacts", "hostile")
	require.Equal(t, 0, code, stderr)
	requireInert(t, strings.ReplaceAll(stdout, "\t", " "), "artifacts")
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Len(t, lines, 3, stdout)
	for _, l := range lines {
		require.Len(t, strings.Split(l, "\t"), 3, "a tab in a name forges no column: %q", l)
	}
	require.Equal(t, `invoice\u202efdp.sh`+"\t"+strings.Split(lines[0], "\t")[1], strings.Join(strings.Split(lines[0], "\t")[:2], "\t"))
	require.Contains(t, stdout, `tab\tname.txt`+"\t2\t")

	// Piped, the bytes stay exact.
	code, stdout, stderr = cli(t, url, "diff", "hostile")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, hostilePatch, stdout, "git apply reads the patch as the run made it")
	code, stdout, stderr = cli(t, url, "artifacts", "hostile", "--get", nameBidi)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, hostileArtifact, stdout)
	out := filepath.Join(t.TempDir(), "a")
	code, _, stderr = cli(t, url, "artifacts", "hostile", "--get", nameBidi, "-o", out)
	require.Equal(t, 0, code, stderr)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, hostileArtifact, string(b))

	// On a terminal, escaped.
	onTTY := func(args ...string) string {
		term, written := tty(t)
		a := newTestApp(map[string]string{"NATS_URL": url}, nil)
		a.app.stdout = term
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		require.Equal(t, 0, a.run(ctx, args), a.stderr.String())
		return written()
	}
	got := onTTY("diff", "hostile")
	requireInert(t, strings.ReplaceAll(got, "\t", " "), "diff on a terminal")
	require.Contains(t, got, `+\x1b]0;pwned\a\u009b2J\u202eevil`+"\n")
	require.Contains(t, got, `diff --git a/invoice\u202efdp.sh b/invoice\u202efdp.sh`+"\n")
	got = onTTY("artifacts", "hostile", "--get", nameBidi)
	requireInert(t, got, "artifact on a terminal")
	require.Equal(t, `#!/bin/sh`+"\n"+`\x1b]0;pwned\a\u202e`+"\n", got)
}

// result prints refused names quoted, never a raw control character.
func TestPrintResultQuotesRefused(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	st := messages.RunState{ID: "r1", State: messages.StateSucceeded, WorkspaceResult: &messages.WorkspaceResult{
		Head: "4dc2d701adfec4f756e7b0e8f3d55c1c4de8b364", Error: "2 paths left out",
		Refused: []string{"esc\x1b[31mred.txt"}, RefusedCount: 2,
	}}
	require.NoError(t, printResult(&b, st))
	require.Contains(t, b.String(), "refused \"esc\\x1b[31mred.txt\"\n")
	require.Contains(t, b.String(), "refused: 1 more\n")
	require.NotContains(t, b.String(), "\x1b")
}
