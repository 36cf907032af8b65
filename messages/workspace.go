package messages

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Object Store buckets of workspaces and results (see docs/workspaces.md).
const (
	// BucketWorkspaces is the Object Store bucket holding workspace
	// snapshots, each a tar named by its content digest (WorkspaceObjectName).
	// Only workers write it: a snapshot a submitter uploaded, once its bytes
	// were checked against its digest, and the snapshots of git sources.
	BucketWorkspaces = "jetcrew-workspaces"
	// BucketUploads is the Object Store bucket submitters upload snapshots
	// to, under the same names; any submitter may write any object there,
	// so a worker takes one only when its bytes hash to the request's
	// digest, and then stores it in BucketWorkspaces.
	BucketUploads = "jetcrew-uploads"
	// BucketResults is the Object Store bucket holding what runs changed,
	// under ResultObjectName.
	BucketResults = "jetcrew-results"
)

// WorkspaceDir is the path, inside a run's container, of the run's writable
// copy of its workspace; it is also the process's working directory.
const WorkspaceDir = "/workspace"

// ArtifactsDir is the directory, relative to WorkspaceDir, whose regular
// files are collected as the run's artifacts when it ends. It is never part
// of the captured commit or patch.
const ArtifactsDir = ".jetcrew/artifacts"

// digestRE is the form of WorkspaceRef.Digest: "sha256:" and 64 lowercase
// hex digits.
var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// objectNameRE bounds an object name in a request: printable ASCII without
// spaces, at most 255 bytes.
var objectNameRE = regexp.MustCompile(`^[A-Za-z0-9._:/-]{1,255}$`)

// WorkspaceRef names the workspace a run works on, one of three ways:
//   - a snapshot: an object in Object Store bucket Bucket (BucketWorkspaces
//     when empty) whose content is an uncompressed tar of the tree (see
//     docs/workspaces.md for the format), named by Name and Digest;
//   - a git remote (Git): the worker fetches the ref's commit into a
//     snapshot of that format itself, when the profile's git_remotes
//     allow the URL;
//   - an earlier run (From): the worker builds the snapshot of that run's
//     tree at its end, with its history, from the objects already stored
//     (its snapshot and its result's bundle), when the profiles allow it
//     (docs/workspaces.md, "Start from a result").
//
// Exactly one of the three is set: Git alone, From alone, or Name and
// Digest. A worker older than From refuses a request that sets it (the
// request's strict decoding refuses the unknown key).
type WorkspaceRef struct {
	// Bucket is the Object Store bucket; empty means BucketWorkspaces. A
	// worker refuses any bucket but its own workspace bucket.
	Bucket string `json:"bucket,omitempty"`
	// Name is the object's name. jetcrew submit names objects by digest
	// (WorkspaceObjectName); any name is accepted.
	Name string `json:"name,omitempty"`
	// Digest is the SHA-256 of the object's bytes, "sha256:<64 hex>". The
	// worker refuses to run on an object whose bytes do not match.
	Digest string `json:"digest,omitempty"`
	// Git, instead of Name and Digest, names a git remote and ref the
	// worker fetches (docs/workspaces.md, "From a git remote").
	Git *GitSource `json:"git,omitempty"`
	// From, instead of the others, names an earlier run (its id, a
	// ValidateName token) whose tree at its end the run starts from.
	From string `json:"from,omitempty"`
}

// FromSource is the earlier run a run's workspace was built from, recorded
// by the worker in the run's state and receipt (RunState.WorkspaceFrom,
// Receipt.WorkspaceFrom) for a request whose workspace names one (From).
type FromSource struct {
	// Run is the earlier run's id.
	Run string `json:"run"`
	// Commit is the snapshot's HEAD: the earlier run's result head (its
	// own commits, then the commit of what it left uncommitted; its base
	// when it changed nothing). It is the new run's result base.
	Commit string `json:"commit,omitempty"`
	// Digest is the "sha256:<hex>" of the snapshot the worker built.
	Digest string `json:"digest"`
}

// GitSource names a commit of a git remote. In a request it holds URL and
// Ref; in a run's state and receipt (RunState.WorkspaceGit,
// Receipt.WorkspaceGit) the worker adds the Commit the ref named when it
// was fetched and the Digest of the snapshot made from it.
type GitSource struct {
	// URL is the remote's http(s) URL, without credentials, query or
	// fragment; at most MaxGitURLBytes.
	URL string `json:"url"`
	// Ref is a branch or tag name ("main", "v1.2"), or a full reference
	// name ("refs/heads/main"); empty means the remote's HEAD.
	Ref string `json:"ref,omitempty"`
	// Commit is the commit id (40 hex digits) Ref named; set by the
	// worker, refused in a request.
	Commit string `json:"commit,omitempty"`
	// Digest is the "sha256:<hex>" of the snapshot made from Commit; set by
	// the worker, refused in a request.
	Digest string `json:"digest,omitempty"`
}

// MaxGitURLBytes bounds GitSource.URL and MaxGitRefBytes GitSource.Ref.
const (
	MaxGitURLBytes = 2048
	MaxGitRefBytes = 255
)

// gitRefRE bounds a ref in a request: what git check-ref-format accepts
// for common names, conservatively (no "..", no leading '-' or '/').
var gitRefRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._/+-]*$`)

// Validate returns an error wrapping ErrInvalidRequest when g, a request's
// git source, is malformed: a URL that is not http(s) with a host, holds
// credentials, a query or a fragment; a ref that is not a plain ref name;
// a Commit or Digest set (only the worker sets them). Whether a worker
// fetches the URL is its profile's decision (git_remotes).
func (g GitSource) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: workspace git "+format, append([]any{ErrInvalidRequest}, args...)...)
	}
	if len(g.URL) > MaxGitURLBytes {
		return bad("url is %d bytes, most allowed is %d", len(g.URL), MaxGitURLBytes)
	}
	u, err := url.Parse(g.URL)
	switch {
	case err != nil:
		return bad("url %q: %v", g.URL, err)
	case u.Scheme != "https" && u.Scheme != "http":
		return bad("url %q: only https:// and http:// remotes are fetched", g.URL)
	case u.Host == "" || u.Opaque != "":
		return bad("url %q has no host", g.URL)
	case u.User != nil:
		return bad("url %q holds credentials: a request never carries secrets", g.URL)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return bad("url %q has a query or fragment", g.URL)
	}
	if g.Ref != "" && (len(g.Ref) > MaxGitRefBytes || !gitRefRE.MatchString(g.Ref) || strings.Contains(g.Ref, "..") ||
		strings.Contains(g.Ref, "//") || strings.HasSuffix(g.Ref, "/") || strings.HasSuffix(g.Ref, ".lock") || strings.HasSuffix(g.Ref, ".")) {
		return bad("ref %q is not a branch, tag or reference name", g.Ref)
	}
	if g.Commit != "" || g.Digest != "" {
		return bad("commit and digest are set by the worker, not by a request")
	}
	return nil
}

// Validate returns an error wrapping ErrInvalidRequest when a field of w is
// malformed, or when w sets more or fewer than one of From, Git and
// Name/Digest.
func (w WorkspaceRef) Validate() error {
	if w.From != "" {
		if w.Git != nil || w.Bucket != "" || w.Name != "" || w.Digest != "" {
			return fmt.Errorf("%w: workspace names an earlier run (from) and another source (git, bucket, name, digest): exactly one", ErrInvalidRequest)
		}
		if err := ValidateName("workspace from", w.From); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		return nil
	}
	if w.Git != nil {
		if w.Bucket != "" || w.Name != "" || w.Digest != "" {
			return fmt.Errorf("%w: workspace names a git remote and a snapshot (bucket, name, digest): exactly one of the two", ErrInvalidRequest)
		}
		return w.Git.Validate()
	}
	if w.Bucket != "" && !bucketRE.MatchString(w.Bucket) {
		return fmt.Errorf("%w: workspace bucket %q is not a bucket name ([A-Za-z0-9_-]{1,64})", ErrInvalidRequest, w.Bucket)
	}
	if !objectNameRE.MatchString(w.Name) {
		return fmt.Errorf("%w: workspace name %q must be 1 to 255 of [A-Za-z0-9._:/-]", ErrInvalidRequest, w.Name)
	}
	if !digestRE.MatchString(w.Digest) {
		return fmt.Errorf("%w: workspace digest %q must be sha256:<64 lowercase hex digits>", ErrInvalidRequest, w.Digest)
	}
	return nil
}

var bucketRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// BucketOrDefault returns w.Bucket, or BucketWorkspaces when it is empty.
func (w WorkspaceRef) BucketOrDefault() string {
	if w.Bucket == "" {
		return BucketWorkspaces
	}
	return w.Bucket
}

// WorkspaceObjectName returns the name jetcrew submit gives a snapshot
// whose digest is digest ("sha256:<hex>"): "sha256-<hex>.tar".
func WorkspaceObjectName(digest string) string {
	if len(digest) > 7 && digest[:7] == "sha256:" {
		return "sha256-" + digest[7:] + ".tar"
	}
	return digest + ".tar"
}

// Kinds of result objects, the last part of ResultObjectName.
const (
	// ResultPatch is a binary-safe git patch (`git apply` reads it) from the
	// workspace as submitted to the run's head.
	ResultPatch = "patch"
	// ResultBundle is a git bundle (v2) holding the run's commits on top of
	// the submitted HEAD, with ref refs/heads/jetcrew/<run id>.
	ResultBundle = "bundle"
	// ResultArtifacts is a tar of the regular files the run left under
	// ArtifactsDir.
	ResultArtifacts = "artifacts.tar"
)

// ResultObjectName returns the name, in BucketResults, of one result object
// of run runID's request at stream sequence seq, delivery attempt:
// "<run id>/<seq>-<attempt>/<kind>". One delivery always writes the same
// names, so a repeated capture replaces rather than adds, and a replay (a
// new request message) never overwrites its predecessor's results.
func ResultObjectName(runID string, seq uint64, attempt int, kind string) string {
	return fmt.Sprintf("%s/%d-%d/%s", runID, seq, attempt, kind)
}

// WorkspaceResult is what a run changed in its workspace, recorded in
// RunState.WorkspaceResult and on the finished event when the request named
// a workspace. The objects are in BucketResults.
type WorkspaceResult struct {
	// Base is the commit the submitted snapshot's HEAD named; empty when the
	// snapshot was not a git repository.
	Base string `json:"base,omitempty"`
	// Head is the run's final commit: the run's own commits plus, when it
	// left changes uncommitted, one more commit holding them. Equals Base
	// when the run changed nothing.
	Head string `json:"head,omitempty"`
	// Commits counts the commits from Base to Head.
	Commits int `json:"commits"`
	// FilesChanged, Insertions and Deletions are the diffstat from the
	// workspace as submitted (Base plus the submitter's uncommitted
	// changes) to Head; binary files count as changed with no lines.
	FilesChanged int `json:"files_changed"`
	Insertions   int `json:"insertions"`
	Deletions    int `json:"deletions"`
	// Files is the per-file diffstat, at most MaxResultFiles entries.
	Files []FileStat `json:"files,omitempty"`
	// Objects lists the stored result objects (patch, bundle, artifacts).
	Objects []ResultObject `json:"objects,omitempty"`
	// Artifacts lists the files of the artifacts tar.
	Artifacts []ResultObject `json:"artifacts,omitempty"`
	// Error says why the result is missing or partial (capture or upload
	// failed, the workspace was too large to capture).
	Error string `json:"error,omitempty"`
	// WorkspaceFull is true when the run's workspace had no space left
	// when it was captured, whether the capture succeeded or not: the run
	// wrote up to the profile's workspace_mib (and got ENOSPC there).
	WorkspaceFull bool `json:"workspace_full,omitempty"`
	// Refused lists the paths, relative to the workspace, that the
	// capture left out of the commits, patch, diffstat and artifacts
	// because their names cannot be held safely: a name holding a C0
	// control character (U+0000 to U+001F) or DEL anywhere, and in a
	// commit also a path component git refuses to check out ("." or "..",
	// ".git" in any case or spelling HFS+ or NTFS treat as it, such as
	// "git~1"). A directory so named is listed once, for everything under
	// it. Sorted, at most MaxRefused entries (RefusedCount counts all); a
	// name that is not valid UTF-8 has U+FFFD for each byte JSON cannot
	// carry. Everything else of the run is captured, and Error says that
	// paths were left out. Absent when none was.
	Refused []string `json:"refused,omitempty"`
	// RefusedCount counts the paths left out (Refused lists at most
	// MaxRefused of them).
	RefusedCount int `json:"refused_count,omitempty"`
	// Snapshot is the "sha256:<hex>" digest of the snapshot the run
	// started from (in BucketWorkspaces): with the bundle, what a run
	// started from this one (WorkspaceRef.From) is built from. Absent in
	// results recorded before it existed.
	Snapshot string `json:"snapshot,omitempty"`
	// SessionError says why the agent CLI's session files (SessionDir)
	// were not kept as the ResultSession object: over MaxSessionBytes,
	// a name that cannot be held, an entry name or a SQLite file holding
	// a secret value of the run. Absent when kept or when there were
	// none.
	SessionError string `json:"session_error,omitempty"`
}

// MaxResultFiles bounds WorkspaceResult.Files.
const MaxResultFiles = 200

// MaxRefused bounds WorkspaceResult.Refused.
const MaxRefused = 100

// FileStat is one file's line of a diffstat.
type FileStat struct {
	// Path is the file's path in the tree.
	Path string `json:"path"`
	// Insertions and Deletions count lines added and removed.
	Insertions int `json:"insertions"`
	Deletions  int `json:"deletions"`
	// Binary is true when the file is not text (no line counts).
	Binary bool `json:"binary,omitempty"`
}

// ResultObject names one stored object (or one file of the artifacts tar).
type ResultObject struct {
	// Name is the object's name in BucketResults (for an artifact: its path
	// under ArtifactsDir).
	Name string `json:"name"`
	// Size is its length in bytes.
	Size int64 `json:"size"`
	// SHA256 is the hex SHA-256 of its bytes.
	SHA256 string `json:"sha256"`
}
