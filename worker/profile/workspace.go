package profile

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// WorkspaceConfig is the profile facet of a run's workspace and its sources.
//
// The workspace (tree) stage reads it: the size of the workspace's volume
// (which a warm_workspace container is made with, warm.Fixed), and which
// git remotes and earlier runs a request's workspace may start from.
type WorkspaceConfig struct {
	// WorkspaceMiB is the size, in MiB, of the workspace of a run (a
	// request with a workspace): a tmpfs volume of the engine's, so the
	// kernel bounds what the run can write there (ENOSPC), and its pages
	// count against the run's memory limit, as /tmp's and home's do.
	// Default half of what MemoryMiB leaves beside TmpMiB and HomeMiB (192
	// for the defaults), at least 1; a value set must leave room beside
	// them (checkWorkspaceMiB). See docs/workspaces.md.
	WorkspaceMiB int64 `toml:"workspace_mib" json:"workspace_mib,omitempty"`
	// GitRemotes lists the git remotes a request's workspace may name
	// instead of a snapshot: each an http(s) URL, exact or ending in "*"
	// after a '/' (any path below). Empty (default): git sources are
	// refused. See validateGitRemotes and docs/workspaces.md.
	GitRemotes []string `toml:"git_remotes" json:"git_remotes,omitempty"`
	// FromProfiles names the profiles whose runs a run of this profile may
	// start from (a request's workspace.from, docs/workspaces.md, "Start
	// from a result"): profile names, or "*" for any. Absent (nil): this
	// profile alone, so no run's result feeds another profile unless that
	// profile says so. Empty ([]): requests with workspace.from are
	// refused.
	FromProfiles *[]string `toml:"from_profiles" json:"from_profiles,omitempty"`
	// Feeds names the profiles whose runs may start from a run of this
	// profile: profile names, or "*" for any. Absent (nil): any profile
	// whose from_profiles accepts this one. Empty ([]): no run starts from
	// this profile's runs.
	Feeds *[]string `toml:"feeds" json:"feeds,omitempty"`
}

// resolve defaults workspace_mib from the jail's memory, tmp and home
// sizes (defaulted), or checks the one set leaves room beside them.
func (w *WorkspaceConfig) resolve(j JailConfig) error {
	if w.WorkspaceMiB == 0 {
		w.WorkspaceMiB = defaultWorkspaceMiB(j)
		return nil
	}
	return w.checkWorkspaceMiB(j)
}

// validate checks the profile's workspace keys: workspace_mib,
// git_remotes, from_profiles and feeds.
func (w WorkspaceConfig) validate() error {
	if w.WorkspaceMiB < 0 {
		return errors.New("workspace_mib is negative")
	}
	if err := w.validateGitRemotes(); err != nil {
		return err
	}
	return w.validateFrom()
}

// defaultWorkspaceMiB returns the default workspace_mib beside jail j (its
// memory, tmp and home sizes defaulted): half of what memory_mib leaves
// beside the /tmp and home tmpfs, at least 1 MiB.
func defaultWorkspaceMiB(j JailConfig) int64 {
	return max(1, (j.MemoryMiB-j.TmpMiB-j.HomeMiB)/2)
}

// checkWorkspaceMiB refuses a workspace_mib that, with the jail's tmp_mib
// and home_mib, leaves the run no memory of its own: the three are tmpfs
// whose pages count against memory_mib, so the run would meet the OOM
// killer before ENOSPC.
func (w WorkspaceConfig) checkWorkspaceMiB(j JailConfig) error {
	if w.WorkspaceMiB > 0 && w.WorkspaceMiB+j.TmpMiB+j.HomeMiB >= j.MemoryMiB {
		return fmt.Errorf("workspace_mib %d with tmp_mib %d and home_mib %d leaves nothing of memory_mib %d: the three are tmpfs whose pages count against the run's memory limit, so a run would meet the OOM killer before ENOSPC; raise memory_mib or lower workspace_mib",
			w.WorkspaceMiB, j.TmpMiB, j.HomeMiB, j.MemoryMiB)
	}
	return nil
}

// validateGitRemotes checks the profile's git_remotes: each an http or
// https URL with a host, no credentials, query or fragment, either exact or
// ending in "/*" (any path below; the only wildcard). Plain http must be
// written as such: an https pattern never allows http. ssh, git://, file://,
// ext:: and local paths are refused: the worker fetches over http(s) only
// and sends no credentials.
func (w WorkspaceConfig) validateGitRemotes() error {
	for _, pat := range w.GitRemotes {
		base, wild := strings.CutSuffix(pat, "*")
		u, err := url.Parse(base)
		switch {
		case err != nil:
			return fmt.Errorf("git_remotes %q: %w", pat, err)
		case u.Scheme != "https" && u.Scheme != "http":
			return fmt.Errorf("git_remotes %q: only https:// and http:// remotes are fetched (no ssh, git://, file://, ext:: or local path)", pat)
		case u.Host == "" || u.Opaque != "":
			return fmt.Errorf("git_remotes %q has no host", pat)
		case u.User != nil:
			return fmt.Errorf("git_remotes %q holds credentials: the worker fetches without any", pat)
		case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
			return fmt.Errorf("git_remotes %q has a query or fragment", pat)
		case strings.Contains(base, "*") || wild && !strings.HasSuffix(u.Path, "/"):
			return fmt.Errorf("git_remotes %q: the only wildcard is a final \"*\" after a '/' (https://host/org/*)", pat)
		case hasDotSegment(u.Path):
			return fmt.Errorf("git_remotes %q has a . or .. path segment", pat)
		}
	}
	return nil
}

// hasDotSegment reports whether a URL path has a "." or ".." segment.
func hasDotSegment(p string) bool {
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// AllowsGitRemote reports whether a request's git URL matches git_remotes.
// raw matches a pattern with the same scheme, same host and port (case
// folded), and the same path, or a path below a pattern's "/*". A URL with
// a "." or ".." segment or an escaped path never matches.
func (w WorkspaceConfig) AllowsGitRemote(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.User != nil || u.RawPath != "" || hasDotSegment(u.Path) || u.RawQuery != "" || u.Fragment != "" {
		return false
	}
	for _, pat := range w.GitRemotes {
		base, wild := strings.CutSuffix(pat, "*")
		pu, err := url.Parse(base)
		if err != nil || pu.Scheme != u.Scheme || !strings.EqualFold(pu.Host, u.Host) {
			continue
		}
		if u.Path == pu.Path || wild && strings.HasPrefix(u.Path, pu.Path) && len(u.Path) > len(pu.Path) {
			return true
		}
	}
	return false
}

// CheckGitSource refuses a request's git workspace source the profile's
// git_remotes do not allow (checkRequest's part).
func (p Profile) CheckGitSource(ws *messages.WorkspaceRef) error {
	if ws == nil || ws.Git == nil {
		return nil
	}
	if len(p.GitRemotes) == 0 {
		return fmt.Errorf("workspace git remote %s is refused: profile %q takes no git sources (its git_remotes is empty)", ws.Git.URL, p.Name)
	}
	if !p.AllowsGitRemote(ws.Git.URL) {
		return fmt.Errorf("workspace git remote %s is refused: profile %q fetches only from %s (its git_remotes)", ws.Git.URL, p.Name, strings.Join(p.GitRemotes, ", "))
	}
	return nil
}

// validateFrom checks from_profiles and feeds: each entry a profile name
// (a token) or "*".
func (w WorkspaceConfig) validateFrom() error {
	for key, list := range map[string]*[]string{"from_profiles": w.FromProfiles, "feeds": w.Feeds} {
		if list == nil {
			continue
		}
		for _, n := range *list {
			if n == "*" {
				continue
			}
			if err := messages.ValidateToken(key, n); err != nil {
				return fmt.Errorf("%s %q: a profile name or \"*\": %w", key, n, err)
			}
		}
	}
	return nil
}

// listed reports whether name is in list or list holds "*".
func listed(list []string, name string) bool {
	for _, n := range list {
		if n == "*" || n == name {
			return true
		}
	}
	return false
}

// CheckFrom refuses a run of p starting from a run of profile src. src is
// nil when this worker does not know the earlier run's profile, srcName. p's
// from_profiles (absent: p alone) must accept srcName, and src's feeds
// (absent: any) must list p. The error says which key refused it.
func (p Profile) CheckFrom(srcName string, src *Profile) error {
	from := []string{p.Name}
	if p.FromProfiles != nil {
		from = *p.FromProfiles
	}
	switch {
	case len(from) == 0:
		return fmt.Errorf("profile %q starts no run from an earlier run's result (its from_profiles is empty)", p.Name)
	case !listed(from, srcName):
		return fmt.Errorf("profile %q starts runs only from runs of %s (its from_profiles), not of profile %q", p.Name, strings.Join(from, ", "), srcName)
	case src == nil:
		return fmt.Errorf("the earlier run's profile %q is not a profile of this worker: its feeds cannot be checked", srcName)
	case src.Feeds != nil && len(*src.Feeds) == 0:
		return fmt.Errorf("profile %q lets no run start from its runs (its feeds is empty)", srcName)
	case src.Feeds != nil && !listed(*src.Feeds, p.Name):
		return fmt.Errorf("profile %q lets only runs of %s start from its runs (its feeds), not of profile %q", srcName, strings.Join(*src.Feeds, ", "), p.Name)
	}
	return nil
}
