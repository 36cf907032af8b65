package coordination_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/bridge"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

func claim(t *testing.T, cs *mcp.ClientSession, reason string, paths ...string) relay.ClaimResponse {
	t.Helper()
	return coordtest.Decode[relay.ClaimResponse](t, cs, "claim", map[string]any{"paths": paths, "reason": reason})
}

func claimsOf(t *testing.T, cs *mcp.ClientSession) []relay.Claim {
	t.Helper()
	return coordtest.Decode[relay.ClaimsResponse](t, cs, "claims", map[string]any{}).Claims
}

func patterns(cs []relay.Claim) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.RunID+":"+c.Pattern)
	}
	return out
}

// claimDoc reads the group's key in the claims bucket (nil when there is
// none).
func (b *bundle) claimDoc(t *testing.T, group string) *messages.CoordClaims {
	t.Helper()
	kv, err := b.js.KeyValue(t.Context(), coordination.BucketClaims)
	require.NoError(t, err)
	e, err := kv.Get(t.Context(), coordination.ClaimKey(coordtest.Group(group)))
	if err == jetstream.ErrKeyNotFound {
		return nil
	}
	require.NoError(t, err)
	var doc messages.CoordClaims
	require.NoError(t, json.Unmarshal(e.Value(), &doc))
	return &doc
}

func TestClaimConflictsAcrossRunsOfAGroup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Two workers, as on a cluster: the bucket is what they share.
	_, a := b.serve(t, b.host(t, coordination.Config{}), "run-a", "g1")
	_, c := b.serve(t, b.host(t, coordination.Config{}), "run-c", "g1")
	_, other := b.serve(t, b.host(t, coordination.Config{}), "run-x", "g2")

	got := claim(t, a, "refactoring the store", "internal/store/", "docs/*.md")
	require.Equal(t, []string{"run-a:docs/*.md", "run-a:internal/store"}, patterns(got.Claims))

	// A file under the claimed directory, a glob over it, a glob that
	// could name the same file: all refused, naming the holder.
	for _, p := range []string{"internal/store/kv.go", "internal/**", "**/*.go", "docs/intro.md", "*/store"} {
		msg := toolError(t, c, "claim", map[string]any{"paths": []string{"cmd/x.go", p}, "reason": "mine"})
		require.Contains(t, msg, "claimed by run run-a since ", p)
		require.Contains(t, msg, `reason "refactoring the store"`)
		require.Contains(t, msg, "nothing was claimed")
	}
	// Nothing of a refused call was claimed.
	require.Equal(t, []string{"run-a:docs/*.md", "run-a:internal/store"}, patterns(claimsOf(t, c)))

	// Disjoint paths are fine; so is the same path in another group.
	claim(t, c, "cli", "cmd/x.go", "docs/*.txt", "internal/storage")
	claim(t, other, "elsewhere", "internal/store")
	list := claimsOf(t, a)
	require.Equal(t, []string{"run-a:docs/*.md", "run-a:internal/store", "run-c:cmd/x.go", "run-c:docs/*.txt", "run-c:internal/storage"}, patterns(list))
	require.Equal(t, "refactoring the store", list[0].Reason)
	require.False(t, list[0].Since.IsZero())
	require.GreaterOrEqual(t, list[0].AgeSeconds, int64(0))

	// Claiming again what one holds keeps it, since and all.
	again := claim(t, a, "still at it", "internal/store")
	require.Equal(t, list[1].Since, again.Claims[1].Since)
	require.Equal(t, "still at it", again.Claims[1].Reason)

	require.NotEmpty(t, b.eventsOf("run-a", coordination.EventClaimed))
	refused := b.eventsOf("run-c", coordination.EventRefused)
	require.NotEmpty(t, refused)
	require.Contains(t, refused[0].Reason, "claimed by run run-a")
}

func TestReleaseRefusesWhatIsNotHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, a := b.serve(t, h, "run-a", "g1")
	_, c := b.serve(t, h, "run-c", "g1")
	claim(t, a, "", "src/a.go", "src/b.go")

	msg := toolError(t, c, "release", map[string]any{"paths": []string{"src/a.go"}})
	require.Contains(t, msg, `"src/a.go" is held by run run-a, not by you`)
	msg = toolError(t, a, "release", map[string]any{"paths": []string{"src/a.go", "src/nothing.go"}})
	require.Contains(t, msg, `you hold no claim "src/nothing.go"`)
	require.Contains(t, msg, "nothing was released")
	toolError(t, a, "release", map[string]any{"paths": []string{}})
	// A glob is released by its own name only, not by what it covers.
	msg = toolError(t, a, "release", map[string]any{"paths": []string{"src"}})
	require.Contains(t, msg, `you hold no claim "src"`)
	require.Len(t, claimsOf(t, a), 2)

	rel := coordtest.Decode[relay.ReleaseResponse](t, a, "release", map[string]any{"paths": []string{"./src/a.go"}})
	require.Equal(t, []string{"src/a.go"}, rel.Released)
	require.Equal(t, []string{"run-a:src/b.go"}, patterns(rel.Claims))
	// Released twice: the second says so.
	toolError(t, a, "release", map[string]any{"paths": []string{"src/a.go"}})
	claim(t, c, "", "src/a.go")
	require.Len(t, b.eventsOf("run-a", coordination.EventReleased), 1)
}

func TestClaimsEndWithTheRunsSession(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	sa, a := b.serve(t, h, "run-a", "g1")
	_, c := b.serve(t, h, "run-c", "g1")
	claim(t, a, "", "src/**")
	claim(t, c, "", "docs")
	toolError(t, c, "claim", map[string]any{"paths": []string{"src/main.go"}, "reason": ""})

	require.NoError(t, sa.Close(t.Context()))
	require.Equal(t, []string{"run-c:docs"}, patterns(claimsOf(t, c)))
	doc := b.claimDoc(t, "g1")
	require.NotNil(t, doc)
	require.Len(t, doc.Claims, 1, "the worker removed the ended run's claims from the bucket")
	claim(t, c, "", "src/main.go")
	ended := b.eventsOf("run-a", coordination.EventReleased)
	require.Len(t, ended, 1)
	require.Equal(t, []string{"src/**"}, ended[0].Paths)
	require.Equal(t, "run ended", ended[0].Reason)
}

func TestDetachKeepsClaimsAndStaleHoldersDoNotCount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	sa, a := b.serve(t, h, "run-a", "g1")
	_, c := b.serve(t, h, "run-c", "g1")
	claim(t, a, "", "src")

	// Handed back for another delivery: the run lives on, and so do its
	// claims.
	require.NoError(t, sa.Detach(t.Context()))
	toolError(t, c, "claim", map[string]any{"paths": []string{"src/x"}, "reason": ""})

	// Its presence gone (a dead worker's key expires): its claims are
	// stale, counted by nobody, and dropped by the next write.
	kv, err := b.js.KeyValue(t.Context(), coordination.BucketPeers)
	require.NoError(t, err)
	require.NoError(t, kv.Delete(t.Context(), coordination.PeerKey(coordtest.Group("g1"), "run-a")))
	require.Empty(t, claimsOf(t, c))
	claim(t, c, "", "src/x")
	require.Equal(t, []string{"run-c:src/x"}, patterns(claimsOf(t, c)))
	require.Len(t, b.claimDoc(t, "g1").Claims, 1)
	_ = a
}

// A later attempt of a run (a new session, after its worker died) does
// not inherit the claims of the earlier one: that agent is gone, and
// nobody would release them.
func TestClaimsBelongToTheSessionThatMadeThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sa, a := b.serve(t, b.host(t, coordination.Config{}), "run-a", "g1")
	_, c := b.serve(t, b.host(t, coordination.Config{}), "run-c", "g1")
	claim(t, a, "", "src")
	toolError(t, c, "claim", map[string]any{"paths": []string{"src/x"}, "reason": ""})
	require.NoError(t, sa.Detach(t.Context())) // the worker dies, as far as NATS can tell

	// The run is served again, by another worker: a session of its own.
	dir := coordtest.SocketDir(t)
	s2, err := b.host(t, coordination.Config{}).Serve(t.Context(), coordination.RunInfo{RunID: "run-a", Group: "g1", Profile: "shell"}, coordtest.SocketPath(dir, "run-a"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s2.Close(context.Background()) })
	a2 := coordtest.Bridge(t, coordtest.SocketPath(dir, "run-a"))
	require.Empty(t, claimsOf(t, a2))
	msg := toolError(t, a2, "release", map[string]any{"paths": []string{"src"}})
	require.Contains(t, msg, `you hold no claim "src"`)
	claim(t, c, "", "src/x")
}

func TestClaimCaps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{MaxClaimsPerRun: 4, MaxClaimsPerGroup: 6, ClaimRate: -1})
	_, a := b.serve(t, h, "run-a", "g1")
	_, c := b.serve(t, h, "run-c", "g1")
	claim(t, a, "", "a/1", "a/2", "a/3")
	msg := toolError(t, a, "claim", map[string]any{"paths": []string{"a/4", "a/5"}, "reason": ""})
	require.Contains(t, msg, "at most 4 claims")
	claim(t, a, "", "a/1", "a/4") // a repeat does not count twice
	claim(t, c, "", "c/1", "c/2")
	msg = toolError(t, c, "claim", map[string]any{"paths": []string{"c/3"}, "reason": ""})
	require.Contains(t, msg, "a group may hold at most 6 claims")

	// Sizes and shapes the bridge and the worker both refuse.
	for _, args := range []map[string]any{
		{"paths": []string{"/etc/passwd"}, "reason": ""},
		{"paths": []string{"../x"}, "reason": ""},
		{"paths": []string{"."}, "reason": ""},
		{"paths": []string{"a/[x"}, "reason": ""},
		{"paths": []string{"a\\b"}, "reason": ""},
		{"paths": []string{string(make([]byte, relay.MaxPatternBytes+1))}, "reason": ""},
		{"paths": []string{"x"}, "reason": string(make([]byte, relay.MaxReasonBytes+1))},
		{"paths": make([]string, relay.MaxClaimPaths+1), "reason": ""},
	} {
		toolError(t, c, "claim", args)
	}
	for _, body := range []string{`{"paths":["/x"],"reason":""}`, `{"paths":["x"],"reason":"","run_id":"run-a"}`} {
		resp, err := socketHTTP(coordtest.SocketPath(b.dir, "run-c")).Post("http://jetcrew"+relay.PathClaim, "application/json", stringsReader(body))
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, 400, resp.StatusCode, body)
	}
}

func TestClaimRateLimited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{ClaimRate: 0.001, ClaimBurst: 2})
	_, a := b.serve(t, h, "run-a", "g1")
	claim(t, a, "", "x")
	claim(t, a, "", "y")
	msg := toolError(t, a, "release", map[string]any{"paths": []string{"x"}})
	require.Contains(t, msg, "rate limited: a run may make claim and release calls")
	// The list is a read, with its own bucket.
	require.Len(t, claimsOf(t, a), 2)
}

// Concurrent claims of overlapping patterns by runs on different workers:
// exactly one wins, whatever the interleaving (compare-and-set on one key
// per group).
func TestConcurrentOverlappingClaimsOneWins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 6
	clients := make([]*mcp.ClientSession, n)
	for i := range n {
		_, clients[i] = b.serve(t, b.host(t, coordination.Config{}), fmt.Sprintf("run-%d", i), "g1")
	}
	var wg sync.WaitGroup
	wins := make([]bool, n)
	for i, cs := range clients {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "claim", Arguments: map[string]any{
				"paths": []string{fmt.Sprintf("pkg/f%d.go", i), "pkg/**"}[i%2:], "reason": "race"}})
			require.NoError(t, err)
			wins[i] = !res.IsError
			if res.IsError {
				require.Contains(t, coordtest.Text(res), "claimed by run run-")
			}
		})
	}
	wg.Wait()
	won := 0
	for _, w := range wins {
		if w {
			won++
		}
	}
	require.Equal(t, 1, won, "%v", wins)
}

func TestPatternsOverlap(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"a", "a", true},
		{"a", "b", false},
		{"src", "src/a.go", true},
		{"src/a.go", "src", true},
		{"src/a.go", "src/b.go", false},
		{"src", "srcx", false},
		{"src/*.go", "src/a.go", true},
		{"src/*.go", "src/a.txt", false},
		{"src/*.go", "src/sub/a.go", false},
		{"src/*", "src/sub/a.go", true}, // src/sub is matched, and covers its tree
		{"**", "anything/at/all", true},
		{"**/*.go", "cmd/x/main.go", true},
		// README.md could be a directory holding x.go: which names are
		// files is not known, so this is an overlap.
		{"**/*.go", "README.md", true},
		{"src/**/*.go", "docs", false},
		{"a/**/z", "a/b/c/z", true},
		{"a/**/z", "a/z", true},
		{"a/**/z", "a/b/y", true}, // a/b/y/z
		{"a/**/z", "b/z", false},
		{"*.go", "*_test.go", true},
		{"a*", "b*", false},
		{"*.go", "*.md", false},
		{"x?", "*.go", true}, // conservative: no name matches both
		{"[ab]", "c", false},
		{"[ab]", "a", true},
		{"docs/*.md", "docs/*.txt", false},
		{"docs/*.md", "*/intro.md", true},
		{"*/store", "internal/store/kv.go", true},
		{"a/**/b/**/c", "a/x/b/y/c/d", true},
		// Names that differ in case or Unicode normalisation only are one
		// file on case-insensitive or normalising hosts (macOS, Windows)
		// where results are applied: they overlap.
		{"Src/A.go", "src/a.go", true},
		{"SRC", "src/a.go", true},
		{"src/*.GO", "src/a.go", true},
		{"src/[A-C].go", "src/b.go", true},
		{"caf\u00e9.go", "cafe\u0301.go", true}, // NFC and NFD
		{"\u00c9t\u00e9/x", "e\u0301te\u0301/x", true},
		{"\u00e4", "a", false}, // no accent is dropped
		{"src/a.go", "src/b.go", false},
	} {
		require.Equal(t, tc.want, coordination.PatternsOverlap(tc.a, tc.b), "%s vs %s", tc.a, tc.b)
		require.Equal(t, tc.want, coordination.PatternsOverlap(tc.b, tc.a), "%s vs %s", tc.b, tc.a)
	}
}

// FuzzPatternsOverlap checks soundness: when a path matches both patterns
// (as the claims define matching), the check must say they overlap.
func FuzzPatternsOverlap(f *testing.F) {
	f.Add("src/*.go", "src/a.go", "src/a.go")
	f.Add("**/x", "a/**", "a/b/x")
	f.Add("a*b", "*c", "abc")
	f.Fuzz(func(t *testing.T, a, b, p string) {
		ca, err1 := relay.ValidatePattern(a)
		cb, err2 := relay.ValidatePattern(b)
		cp, err3 := relay.ValidatePattern(p)
		if err1 != nil || err2 != nil || err3 != nil || containsGlob(cp) {
			return
		}
		if covers(ca, cp) && covers(cb, cp) && !coordination.PatternsOverlap(ca, cb) {
			t.Fatalf("%q and %q both cover %q, but were said not to overlap", ca, cb, cp)
		}
	})
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }

func containsGlob(p string) bool { return strings.ContainsAny(p, "*?[") }

// covers is the reference meaning of a claim: pattern matches file or one
// of its parent directories, segment by segment, "**" standing for any
// number of segments.
func covers(pattern, file string) bool {
	ps, fs := strings.Split(pattern, "/"), strings.Split(file, "/")
	var match func(i, j int) bool
	match = func(i, j int) bool {
		if i == len(ps) {
			return true // a parent directory of file, or file itself
		}
		if ps[i] == "**" {
			for k := j; k <= len(fs); k++ {
				if match(i+1, k) {
					return true
				}
			}
			return false
		}
		if j == len(fs) {
			return false
		}
		ok, _ := path.Match(ps[i], fs[j])
		return ok && match(i+1, j+1)
	}
	return match(0, 0)
}

// workspaceWithLinks makes a workspace with symlinks: lnk → src,
// src/b.go → a.go, docs/src → ../src, out → / (outside), abs → the
// workspace's own src by absolute path, and self → . (the workspace).
func workspaceWithLinks(t *testing.T) string {
	t.Helper()
	ws := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "src", "sub"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "docs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "src", "a.go"), []byte("package a\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(ws, "docs", "intro.md"), []byte("#\n"), 0o644))
	for link, target := range map[string]string{
		"lnk": "src", "src/b.go": "a.go", "docs/src": "../src", "out": "/",
		"abs": filepath.Join(ws, "src"), "self": ".", "src/sub/up": "../../docs",
	} {
		require.NoError(t, os.Symlink(target, filepath.Join(ws, link)))
	}
	return ws
}

// A symlink inside the workspace is no second name for a claimed file: the
// bridge resolves the symlinks on a pattern's path against the workspace,
// and refuses a pattern that would reach a file through a symlink its
// claim does not cover by the file's own path.
func TestClaimsThroughSymlinks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{ClaimRate: -1})
	ws := workspaceWithLinks(t)
	sa, _ := b.serve(t, h, "run-a", "g1")
	sc, _ := b.serve(t, h, "run-c", "g1")
	a := coordtest.BridgeWith(t, sa.SocketPath(), bridge.Options{Version: "test", Workspace: ws})
	c := coordtest.BridgeWith(t, sc.SocketPath(), bridge.Options{Version: "test", Workspace: ws})

	claim(t, a, "the store", "src/a.go")
	// Other names of src/a.go: refused, naming run-a's claim.
	for _, p := range []string{"lnk/a.go", "src/b.go", "lnk/b.go", "abs/a.go", "self/src/a.go", "docs/src/a.go", "./lnk//a.go"} {
		msg := toolError(t, c, "claim", map[string]any{"paths": []string{p}, "reason": "mine"})
		require.Contains(t, msg, `overlaps "src/a.go", claimed by run run-a`, p)
	}
	// A claim through a symlink is stored by the target's path.
	got := claim(t, a, "", "lnk/new.go")
	require.Equal(t, []string{"run-a:src/a.go", "run-a:src/new.go"}, patterns(got.Claims))
	rel := coordtest.Decode[relay.ReleaseResponse](t, a, "release", map[string]any{"paths": []string{"lnk/new.go"}})
	require.Equal(t, []string{"src/new.go"}, rel.Released)

	// Patterns that reach files through a symlink they do not cover by the
	// target's path: refused, naming the symlink.
	for p, want := range map[string]string{
		"l*/a.go": `through the symlink "lnk" (to "src")`,
		"docs":    `through the symlink "docs/src" (to "src")`,
		"docs/*":  `through the symlink "docs/src" (to "src")`,
		"src/sub": `through the symlink "src/sub/up" (to "docs")`,
		"lnk":     `"lnk" ("src" through its symlinks) reaches files through the symlink "src/sub/up" (to "docs")`,
		"out/etc": `leads outside the workspace`,
		"out":     `leads outside the workspace`,
	} {
		msg := toolError(t, c, "claim", map[string]any{"paths": []string{p}, "reason": ""})
		require.Contains(t, msg, want, p)
		require.Contains(t, msg, "nothing was claimed", p)
	}
	// A glob that reaches outside the workspace through a symlink names no
	// file of the workspace there: "**/a.go" only meets run-a's claim.
	require.Contains(t, toolError(t, c, "claim", map[string]any{"paths": []string{"**/a.go"}, "reason": ""}), `claimed by run run-a`)

	// Claimed together with what their symlinks lead to, they are fine.
	coordtest.Decode[relay.ReleaseResponse](t, a, "release", map[string]any{"paths": []string{"src/a.go"}})
	claim(t, c, "", "docs", "src")
	require.Contains(t, toolError(t, a, "claim", map[string]any{"paths": []string{"lnk/b.go"}, "reason": ""}), `claimed by run run-c`)
	coordtest.Decode[relay.ReleaseResponse](t, c, "release", map[string]any{"paths": []string{"lnk", "docs"}})
	claim(t, a, "", "**")
}

// Spellings of one file, and its names in another case or Unicode
// normalisation, are one claim across runs; release takes any spelling of
// the pattern as claimed.
func TestClaimSpellingsAreOneClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{ClaimRate: -1})
	_, a := b.serve(t, h, "run-a", "g1")
	_, c := b.serve(t, h, "run-c", "g1")
	got := claim(t, a, "", "./src//a.go", "docs/caf\u00e9.md")
	require.Equal(t, []string{"run-a:docs/caf\u00e9.md", "run-a:src/a.go"}, patterns(got.Claims))
	for _, p := range []string{"src/a.go", "src/./a.go", "src/a.go/", "src/x/../a.go", "SRC/A.GO", "docs/cafe\u0301.md", "Docs/CAF\u00c9.md"} {
		require.Contains(t, toolError(t, c, "claim", map[string]any{"paths": []string{p}, "reason": ""}), "claimed by run run-a", p)
	}
	rel := coordtest.Decode[relay.ReleaseResponse](t, a, "release", map[string]any{"paths": []string{"src/./a.go/"}})
	require.Equal(t, []string{"src/a.go"}, rel.Released)
	claim(t, c, "", "src/a.go")
}
