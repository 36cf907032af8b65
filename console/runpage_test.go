package console

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"html"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// hostilePrompt is a prompt (and a patch line) that would be markup, move
// text around or talk to a terminal if shown as itself.
const hostilePrompt = "out <script>window.pwned=1</script><img src=x onerror=window.pwned=2>\x1b[2J\u202e;sleep 1h"

// Issue 27: a run's page shows first what it was asked, escaped and made
// visible, from its request in JETCREW_RUNS while it runs, from its dead
// letter once it failed, and says when neither keeps it any more; the
// jetcrew commands to copy follow its state.
func TestRunPageAsked(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	id := b.submit(t, messages.RunRequest{Prompt: hostilePrompt, Timeout: messages.Duration(time.Hour), Env: map[string]string{"MODE": "x"}})
	b.waitState(t, id, messages.StateRunning)
	code, body := b.get(t, "/runs/"+id)
	require.Equal(t, http.StatusOK, code)
	asked := between(body, `<section id="asked"`, "</section>")
	require.Contains(t, asked, `<pre class="prompt" id="prompt">out &lt;script&gt;window.pwned=1&lt;/script&gt;&lt;img src=x onerror=window.pwned=2&gt;␛[2J&lt;U&#43;202E&gt;;sleep 1h</pre>`)
	require.NotContains(t, asked, "<script>")
	require.NotContains(t, asked, "\u202e")
	require.Contains(t, asked, "From its request in JETCREW_RUNS.")
	require.Contains(t, asked, "<dt>Timeout</dt><dd class=\"mono\">1h0m0s</dd>")
	require.Contains(t, asked, "<dt>Env</dt><dd class=\"mono\">MODE</dd>", "names, not values")
	require.Contains(t, asked, `<code id="cmd-watch">jetcrew watch `+id+`</code>`)
	require.Contains(t, asked, `<li data-cmd="cancel" ><code id="cmd-cancel">jetcrew cancel `+id+`</code>`)
	require.Contains(t, asked, `<li data-cmd="replay" hidden>`)
	require.Less(t, strings.Index(body, `id="asked"`), strings.Index(body, `<dl class="facts">`+"\n<dt>Pool</dt>"), "what it was asked comes first")
	// Its queue wait is over, its run time counts on.
	require.Contains(t, body, `<dd class="mono" id="ran" title="from its start to its end"><span class="dur" data-from="`)

	// Cancelled: the request left JETCREW_RUNS, and no dead letter keeps
	// it: the prompt its worker recorded on its started event is shown.
	_, err := b.d.Cancel(t.Context(), id)
	require.NoError(t, err)
	b.waitState(t, id, messages.StateCancelled)
	require.Eventually(t, func() bool {
		_, body = b.get(t, "/runs/"+id)
		return strings.Contains(body, "From its started event in JETCREW_EVENTS")
	}, 10*time.Second, 20*time.Millisecond, "once the worker removed the request, the recorded prompt")
	require.Contains(t, body, `<pre class="prompt" id="prompt">out &lt;script&gt;window.pwned=1&lt;/script&gt;&lt;img src=x onerror=window.pwned=2&gt;␛[2J&lt;U&#43;202E&gt;;sleep 1h</pre>`)
	require.NotContains(t, body, "\u202e")
	require.Contains(t, body, `<li data-cmd="cancel" hidden>`)
	require.Contains(t, body, `<p class="command">Command: <code id="argv">`, "the receipt's command is still shown")
	require.Contains(t, body, "&lt;prompt&gt;")

	// Succeeded: the same.
	ok := b.submit(t, messages.RunRequest{Prompt: "out done"})
	b.waitState(t, ok, messages.StateSucceeded)
	require.Eventually(t, func() bool {
		_, body = b.get(t, "/runs/"+ok)
		return strings.Contains(body, `<pre class="prompt" id="prompt">out done</pre>`)
	}, 10*time.Second, 20*time.Millisecond, "a succeeded run's page shows its prompt")
	require.Contains(t, body, "From its started event in JETCREW_EVENTS")

	// Neither a request nor a started event (it never started, or its
	// events expired): the page says so.
	now := time.Now().UTC()
	b.putStates(t, messages.RunState{ID: "gone-1", State: messages.StateCancelled, Pool: "default", Profile: "shell", QueuedAt: now, UpdatedAt: now})
	_, body = b.get(t, "/runs/gone-1")
	require.Contains(t, body, `id="asked-missing"`)
	require.Contains(t, body, "Its request is no longer kept")

	// Failed: its dead letter keeps it.
	f := b.submit(t, messages.RunRequest{Prompt: "out <b>no</b>;exit 3"})
	b.waitState(t, f, messages.StateFailed)
	require.Eventually(t, func() bool { _, err := b.d.LastDeadLetter(t.Context(), f); return err == nil }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		_, body = b.get(t, "/runs/"+f)
		return strings.Contains(body, "From its dead letter in JETCREW_FAILED.")
	}, 10*time.Second, 20*time.Millisecond, "once its worker removed the request, from its dead letter")
	require.Contains(t, body, `<pre class="prompt" id="prompt">out &lt;b&gt;no&lt;/b&gt;;exit 3</pre>`)
	require.Contains(t, body, `<li data-cmd="replay" ><code id="cmd-replay">jetcrew replay `+f+`</code>`)
}

// The runs list says when each run was queued relative to now, with the
// absolute time on hover, and how long it waited and ran.
func TestRunsListTimes(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	q := time.Now().UTC().Add(-3 * time.Minute).Truncate(time.Millisecond)
	b.putStates(t, messages.RunState{ID: "timed-1", State: messages.StateSucceeded, Pool: "default", Profile: "shell",
		QueuedAt: q, StartedAt: q.Add(1500 * time.Millisecond), FinishedAt: q.Add(62 * time.Second), UpdatedAt: q.Add(62 * time.Second)})
	_, body := b.get(t, "/runs")
	row := between(body, `<tr data-id="timed-1"`, "</tr>")
	require.Contains(t, row, `<time class="rel" datetime="`+isoTime(q)+`" title="`+clock(q)+` UTC">3 min ago</time>`)
	require.Contains(t, row, `<td class="mono"><span class="dur">1s</span></td><td class="mono"><span class="dur">1m0s</span></td>`)
	require.Contains(t, body, "<th>Queued</th>")
}

// resultFixture stores objects under run id's names in jetcrew-results and
// returns the workspace result recording them.
func resultFixture(t *testing.T, js jetstream.JetStream, id string, objects map[string][]byte) *messages.WorkspaceResult {
	t.Helper()
	obs, err := js.CreateOrUpdateObjectStore(t.Context(), jetstream.ObjectStoreConfig{Bucket: messages.BucketResults})
	require.NoError(t, err)
	r := &messages.WorkspaceResult{Base: strings.Repeat("a", 40), Head: strings.Repeat("b", 40), Commits: 1,
		FilesChanged: 2, Insertions: 3, Deletions: 1,
		Files: []messages.FileStat{{Path: "src/<i>x</i>.go", Insertions: 3, Deletions: 1}, {Path: "logo.png", Binary: true}}}
	for _, kind := range []string{messages.ResultPatch, messages.ResultBundle, messages.ResultArtifacts} {
		data, ok := objects[kind]
		if !ok {
			continue
		}
		name := messages.ResultObjectName(id, 1, 1, kind)
		_, err := obs.PutBytes(t.Context(), name, data)
		require.NoError(t, err)
		sum := sha256.Sum256(data)
		r.Objects = append(r.Objects, messages.ResultObject{Name: name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])})
	}
	return r
}

func tarOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

// hostilePatch changes a file with lines that would be markup or talk to a
// terminal if shown as themselves.
const hostilePatch = "diff --git a/src/x.go b/src/x.go\nindex 1..2 100644\n--- a/src/x.go\n+++ b/src/x.go\n@@ -1,2 +1,4 @@\n" +
	" package x\n-// old\n+// <script>window.pwned=1</script>\n+// \x1b[31mred\u202e\n+// \xff\xfe\n"

// Issue 27: a workspace run's page shows its commits, diffstat, its patch
// as inert text with each line classed, its downloads and artifacts, and
// `jetcrew apply ID`; downloads are the stored bytes, as attachments; a
// large patch is cut with a link to the whole one; an object that does not
// match the run's record is refused.
func TestRunPageChanges(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	now := time.Now().UTC().Truncate(time.Millisecond)
	arts := tarOf(t, map[string]string{"report.txt": "all good\n", "deep/<b>.txt": "x"})
	wr := resultFixture(t, b.js, "ws-1", map[string][]byte{messages.ResultPatch: []byte(hostilePatch),
		messages.ResultBundle: []byte("bundle-bytes"), messages.ResultArtifacts: arts})
	wr.Artifacts = []messages.ResultObject{{Name: "report.txt", Size: 9}, {Name: "deep/<b>.txt", Size: 1}}
	st := messages.RunState{ID: "ws-1", State: messages.StateSucceeded, Pool: "default", Profile: "shell", QueuedAt: now,
		StartedAt: now, FinishedAt: now.Add(time.Second), UpdatedAt: now.Add(time.Second), WorkspaceResult: wr,
		WorkspaceGit: &messages.GitSource{URL: "https://example.com/r.git", Ref: "main"}}
	b.putStates(t, st)

	code, body := b.get(t, "/runs/ws-1")
	require.Equal(t, http.StatusOK, code)
	ch := between(body, `<section id="changes"`, "</section>")
	require.Contains(t, ch, `<dd class="mono" id="base">`+wr.Base+`</dd>`)
	require.Contains(t, ch, `<dd class="mono" id="head">`+wr.Head+` (1 new commit(s))</dd>`)
	require.Contains(t, ch, "2 files changed, 3 insertions(&#43;), 1 deletion(-)")
	require.Contains(t, ch, "https://example.com/r.git main")
	require.Contains(t, ch, "src/&lt;i&gt;x&lt;/i&gt;.go")
	require.Contains(t, ch, `<span class="add">&#43;// &lt;script&gt;window.pwned=1&lt;/script&gt;`+"\n</span>")
	require.Contains(t, ch, `<span class="add">&#43;// ␛[31mred&lt;U&#43;202E&gt;`+"\n</span>")
	require.Contains(t, ch, `<span class="add">&#43;// `+"\uFFFD\n</span>")
	require.Contains(t, ch, `<span class="del">-// old`)
	require.Contains(t, ch, `<span class="hunk">@@ -1,2 &#43;1,4 @@`)
	require.Contains(t, ch, `<span class="meta">diff --git a/src/x.go b/src/x.go`)
	require.NotContains(t, ch, "<script>")
	require.NotContains(t, ch, "<i>")
	require.NotContains(t, ch, `id="patch-cut"`)
	require.Contains(t, ch, `<code id="cmd-apply">jetcrew apply ws-1</code>`)
	require.Contains(t, ch, `<a href="/runs/ws-1/result/patch" download>patch</a>`)
	require.Contains(t, ch, `<a href="/runs/ws-1/artifacts/deep/%3Cb%3E.txt" download>deep/&lt;b&gt;.txt</a>`)

	// The fragment the page fetches when a result arrives is the section.
	_, frag := b.get(t, "/runs/ws-1/changes")
	require.True(t, strings.HasPrefix(frag, `<section id="changes" data-key="`), frag[:min(80, len(frag))])

	// Downloads: the stored bytes, as attachments.
	resp := b.download(t, "/runs/ws-1/result/patch")
	require.Equal(t, http.StatusOK, resp.code)
	require.Equal(t, hostilePatch, resp.body)
	require.Equal(t, "application/octet-stream", resp.header.Get("Content-Type"))
	require.Equal(t, `attachment; filename=ws-1.patch`, resp.header.Get("Content-Disposition"))
	require.Equal(t, "all good\n", b.download(t, "/runs/ws-1/artifacts/report.txt").body)
	require.Equal(t, "x", b.download(t, "/runs/ws-1/artifacts/deep/%3Cb%3E.txt").body)
	require.Equal(t, http.StatusNotFound, b.download(t, "/runs/ws-1/artifacts/..%2F..%2Fetc%2Fpasswd").code, "only listed artifacts")
	require.Equal(t, http.StatusNotFound, b.download(t, "/runs/ws-1/result/secrets").code)
	require.Equal(t, arts, []byte(b.download(t, "/runs/ws-1/result/artifacts.tar").body))

	// A large patch: its first lines, a link to the whole.
	big := "diff --git a/big b/big\n" + strings.Repeat("+"+strings.Repeat("y", 99)+"\n", 5000)
	wr2 := resultFixture(t, b.js, "ws-big", map[string][]byte{messages.ResultPatch: []byte(big)})
	b.putStates(t, messages.RunState{ID: "ws-big", State: messages.StateSucceeded, Pool: "default", Profile: "shell", UpdatedAt: now, WorkspaceResult: wr2})
	_, body = b.get(t, "/runs/ws-big")
	require.Contains(t, body, `id="patch-cut"`)
	require.Contains(t, body, `<a href="/runs/ws-big/result/patch">download the whole patch</a>`)
	shown := html.UnescapeString(regexp.MustCompile(`</?span[^>]*>`).ReplaceAllString(between(body, `<pre class="diff" id="patch">`, "</pre>"), ""))
	require.LessOrEqual(t, len(shown), maxPatchShown, "the page holds at most the patch's first bytes")
	require.True(t, strings.HasPrefix(big, shown) && strings.HasSuffix(shown, "\n"), "cut at a whole line")
	require.Equal(t, big, b.download(t, "/runs/ws-big/result/patch").body)

	// Bytes that are not the recorded ones: not shown, download cut short.
	wr3 := resultFixture(t, b.js, "ws-bad", map[string][]byte{messages.ResultPatch: []byte(hostilePatch)})
	wr3.Objects[0].SHA256 = strings.Repeat("0", 64)
	b.putStates(t, messages.RunState{ID: "ws-bad", State: messages.StateSucceeded, Pool: "default", Profile: "shell", UpdatedAt: now, WorkspaceResult: wr3})
	_, body = b.get(t, "/runs/ws-bad")
	require.Contains(t, body, `id="patch-error"`)
	require.NotContains(t, body, `id="patch"`)
	require.Error(t, b.download(t, "/runs/ws-bad/result/patch").err, "the download fails rather than ending as if whole")
}

type downloaded struct {
	code   int
	header http.Header
	body   string
	err    error
}

// download GETs path and reads the whole body, keeping the error of a
// response cut short.
func (b *bundle) download(t *testing.T, path string) downloaded {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.srv.URL+path, nil)
	require.NoError(t, err)
	resp, err := noRedirect.Do(req)
	if err != nil {
		return downloaded{err: err} // cut before its headers
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return downloaded{code: resp.StatusCode, header: resp.Header, body: string(data), err: err}
}
