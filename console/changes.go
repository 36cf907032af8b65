package console

import (
	"archive/tar"
	"cmp"
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// maxPatchShown is the most bytes of a run's patch its page shows; a
// longer patch is cut at the last whole line before it, and the page links
// to the whole one.
const maxPatchShown = 256 << 10

// patchReadTimeout bounds reading the patch for a page.
const patchReadTimeout = 5 * time.Second

// results serves what a workspace run left: its changes and its downloads.
// Its changesView is the run page's "Changes" section and each attempt's
// on the group page; the downloads are its result objects and artifacts.
type results struct {
	*core
	cache *cache
}

// changesView is what a workspace run changed, as its page shows it:
// every text a run chose made visible.
type changesView struct {
	// Shown is true for a run with a workspace result.
	Shown bool
	// Key changes when the result does (a replay's): the page's script
	// fetches the section again when the run's state brings another.
	Key string
	// Source is the git remote and ref the workspace came from.
	Source string
	// Base and Head are the commits; Commits counts the run's.
	Base, Head string
	Commits    int
	// Stat is the diffstat's summary; Files its lines (at most
	// messages.MaxResultFiles), FilesMore the files past them.
	Stat      string
	Files     []fileRow
	FilesMore int
	// Error and Full: why the result is partial, and whether the
	// workspace was full.
	Error string
	Full  bool
	// Refused are the paths left out, quoted; RefusedMore those past
	// the list.
	Refused     []string
	RefusedMore int
	// Patch is the patch (or its first maxPatchShown bytes) as lines;
	// PatchSize its whole size, PatchCut whether it was cut, PatchErr why
	// it could not be read.
	Patch     []diffLine
	PatchSize int64
	PatchCut  bool
	PatchErr  string
	// Downloads are the stored objects (patch, bundle, artifacts tar).
	Downloads []download
	// Artifacts are the files the run left in .jetcrew/artifacts.
	Artifacts []download
	// Apply is `jetcrew apply ID` when the run has a bundle.
	Apply string
}

// fileRow is one line of a diffstat.
type fileRow struct {
	Path       string
	Ins, Del   int
	Binary     bool
	Plus, Less string // the bar: one mark per line, at most 40 in all
}

// diffLine is one line of a patch with its class: add, del, hunk, meta or
// none.
type diffLine struct {
	Class, Text string
}

// download is one file the page links to.
type download struct {
	Name, Href string
	Size       int64
}

// resultKinds are the result objects a page links to, and their file
// names' ends.
var resultKinds = map[string]string{
	messages.ResultPatch:     ".patch",
	messages.ResultBundle:    ".bundle",
	messages.ResultArtifacts: "-artifacts.tar",
}

// changes returns what run st changed in its workspace, reading the first
// maxPatchShown bytes of its patch.
func (rs *results) changes(ctx context.Context, st *messages.RunState) changesView {
	return rs.changesUpTo(ctx, st, maxPatchShown)
}

// changesUpTo is changes, reading at most limit bytes of the patch.
func (rs *results) changesUpTo(ctx context.Context, st *messages.RunState, limit int64) changesView {
	r := st.WorkspaceResult
	if r == nil {
		return changesView{}
	}
	v := changesView{Shown: true, Base: r.Base, Head: r.Head, Commits: r.Commits, Error: visible(r.Error), Full: r.WorkspaceFull,
		Stat:      fmt.Sprintf("%s changed, %s(+), %s(-)", plural(int64(r.FilesChanged), "file"), plural(int64(r.Insertions), "insertion"), plural(int64(r.Deletions), "deletion")),
		FilesMore: r.FilesChanged - len(r.Files), RefusedMore: r.RefusedCount - len(r.Refused)}
	v.Key = changesKey(st)
	if g := st.WorkspaceGit; g != nil {
		v.Source = visible(g.URL + " " + cmp.Or(g.Ref, "HEAD"))
	}
	most := 1
	for _, f := range r.Files {
		most = max(most, f.Insertions+f.Deletions)
	}
	for _, f := range r.Files {
		row := fileRow{Path: visible(f.Path), Ins: f.Insertions, Del: f.Deletions, Binary: f.Binary}
		if n := f.Insertions + f.Deletions; n > 0 {
			marks := max(1, min(n, 40*n/most))
			plus := marks * f.Insertions / n
			row.Plus, row.Less = strings.Repeat("+", plus), strings.Repeat("-", marks-plus)
		}
		v.Files = append(v.Files, row)
	}
	for _, p := range r.Refused {
		v.Refused = append(v.Refused, strconv.Quote(p))
	}
	base := "/runs/" + url.PathEscape(st.ID) + "/result/"
	for _, o := range r.Objects {
		for kind := range resultKinds {
			if strings.HasSuffix(o.Name, "/"+kind) {
				v.Downloads = append(v.Downloads, download{Name: kind, Href: base + kind, Size: o.Size})
				if kind == messages.ResultBundle {
					v.Apply = "jetcrew apply " + st.ID
				}
			}
		}
	}
	for _, a := range r.Artifacts {
		v.Artifacts = append(v.Artifacts, download{Name: visible(a.Name), Href: "/runs/" + url.PathEscape(st.ID) + "/artifacts/" + escapePath(a.Name), Size: a.Size})
	}
	for _, dl := range v.Downloads {
		if dl.Name == messages.ResultPatch {
			v.readPatch(ctx, rs.d, st, limit)
		}
	}
	return v
}

// changesKey identifies st's workspace result: "" when it has none.
func changesKey(st *messages.RunState) string {
	r := st.WorkspaceResult
	if r == nil {
		return ""
	}
	k := r.Head + "|" + r.Error
	for _, o := range r.Objects {
		k += "|" + o.SHA256
	}
	return k
}

// readPatch reads the first limit bytes of st's patch into v.
func (v *changesView) readPatch(ctx context.Context, d *dispatcher.Dispatcher, st *messages.RunState, limit int64) {
	ctx, cancel := context.WithTimeout(ctx, patchReadTimeout)
	defer cancel()
	rr, err := d.OpenResult(ctx, st, messages.ResultPatch)
	if err != nil {
		v.PatchErr = visible(err.Error())
		return
	}
	defer rr.Close()
	v.PatchSize = rr.Object.Size
	// Read one byte past a patch that fits, so its check runs at the end.
	b, err := io.ReadAll(io.LimitReader(rr, min(rr.Object.Size, limit)+1))
	if err != nil {
		v.PatchErr = visible(err.Error())
		return
	}
	if int64(len(b)) > limit {
		b = b[:limit]
	}
	if v.PatchCut = rr.Object.Size > int64(len(b)); v.PatchCut {
		if i := strings.LastIndexByte(string(b), '\n'); i >= 0 {
			b = b[:i+1]
		}
	}
	v.Patch = diffLines(string(b))
}

// diffLines splits a patch into its lines, each made visible and classed
// for the page: what a run wrote is text, never markup.
func diffLines(p string) []diffLine {
	var out []diffLine
	for line := range strings.Lines(p) {
		cls := ""
		switch {
		case strings.HasPrefix(line, "+++ "), strings.HasPrefix(line, "--- "), strings.HasPrefix(line, "diff "),
			strings.HasPrefix(line, "index "), strings.HasPrefix(line, "new file"), strings.HasPrefix(line, "deleted file"),
			strings.HasPrefix(line, "rename "), strings.HasPrefix(line, "similarity "), strings.HasPrefix(line, "old mode"),
			strings.HasPrefix(line, "new mode"), strings.HasPrefix(line, "GIT binary patch"), strings.HasPrefix(line, "Binary files"):
			cls = "meta"
		case strings.HasPrefix(line, "@@"):
			cls = "hunk"
		case strings.HasPrefix(line, "+"):
			cls = "add"
		case strings.HasPrefix(line, "-"):
			cls = "del"
		}
		out = append(out, diffLine{Class: cls, Text: visible(line)})
	}
	return out
}

// escapePath escapes each element of a slash-separated path for a URL.
func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}

// state returns the state of run id for a download: the cache's,
// else the bucket's.
func (rs *results) state(w http.ResponseWriter, r *http.Request) (messages.RunState, bool) {
	id := r.PathValue("id")
	if err := messages.ValidateToken("run id", id); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return messages.RunState{}, false
	}
	if st, ok := rs.cache.get(id); ok {
		return st, true
	}
	st, err := rs.d.Status(r.Context(), id)
	if err != nil {
		http.Error(w, err.Error(), readStatus(err, dispatcher.ErrRunNotFound))
		return st, false
	}
	return st, true
}

// attachment sets the headers of a download named name, size bytes:
// always saved, never shown by the browser.
func attachment(w http.ResponseWriter, name string, size int64) {
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	h.Set("Cache-Control", "no-store")
}

// open opens result object kind of run st for a download, or answers 404
// (the run stored no such object: dispatcher.ErrNoResult) or 502 and
// returns false.
func (rs *results) open(w http.ResponseWriter, r *http.Request, st *messages.RunState, kind string) (*dispatcher.ResultReader, bool) {
	rr, err := rs.d.OpenResult(r.Context(), st, kind)
	if err != nil {
		http.Error(w, err.Error(), readStatus(err, dispatcher.ErrNoResult))
		return nil, false
	}
	return rr, true
}

// object serves GET /runs/{id}/result/{kind}: the run's patch,
// bundle or artifacts tar, streamed as stored. A body that turns out not
// to match the run's record (checked at its end) is cut short: the
// download fails instead of ending as if whole.
func (rs *results) object(w http.ResponseWriter, r *http.Request) {
	kind := r.PathValue("kind")
	ext, ok := resultKinds[kind]
	if !ok {
		http.Error(w, "no such result object (patch, bundle, artifacts.tar)", http.StatusNotFound)
		return
	}
	st, ok := rs.state(w, r)
	if !ok {
		return
	}
	rr, ok := rs.open(w, r, &st, kind)
	if !ok {
		return
	}
	defer rr.Close()
	attachment(w, st.ID+ext, rr.Object.Size)
	if _, err := io.Copy(w, rr); err != nil {
		rs.cfg.Log.Warn().Err(err).Str("run", st.ID).Str("kind", kind).Msg("console: result download")
		panic(http.ErrAbortHandler)
	}
}

// artifact serves GET /runs/{id}/artifacts/{name...}: one file the run
// left in .jetcrew/artifacts (one the run's state lists), read from the
// artifacts tar as it streams by. The rest of the tar is read too, so its
// check runs: a tar that does not match the run's record cuts the
// download short.
func (rs *results) artifact(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	st, ok := rs.state(w, r)
	if !ok {
		return
	}
	listed := false
	for _, a := range resultArtifacts(&st) {
		listed = listed || a.Name == name
	}
	if !listed {
		http.Error(w, "the run left no such artifact", http.StatusNotFound)
		return
	}
	rr, ok := rs.open(w, r, &st, messages.ResultArtifacts)
	if !ok {
		return
	}
	defer rr.Close()
	tr := tar.NewReader(rr)
	for {
		h, err := tr.Next()
		if err != nil {
			http.Error(w, "the artifacts tar holds no such file", http.StatusNotFound)
			return
		}
		if h.Name != name || h.Typeflag != tar.TypeReg {
			continue
		}
		attachment(w, path.Base(name), h.Size)
		_, err = io.Copy(w, tr)
		if err == nil {
			_, err = io.Copy(io.Discard, rr)
		}
		if err != nil {
			rs.cfg.Log.Warn().Err(err).Str("run", st.ID).Msg("console: artifact download")
			panic(http.ErrAbortHandler)
		}
		return
	}
}

func resultArtifacts(st *messages.RunState) []messages.ResultObject {
	if st.WorkspaceResult == nil {
		return nil
	}
	return st.WorkspaceResult.Artifacts
}

// fragment serves GET /runs/{id}/changes: the run page's "Changes"
// section alone, which its script fetches when the run's state brings a
// workspace result (the run ended, or a replay ended).
func (rs *results) fragment(w http.ResponseWriter, r *http.Request) {
	st, ok := rs.state(w, r)
	if !ok {
		return
	}
	rs.renderStatus(w, r, http.StatusOK, "run", "changes", page{Data: runData{State: st, Changes: rs.changes(r.Context(), &st)}})
}
