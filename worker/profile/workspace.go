package profile

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// validateWorkspace checks the profile's workspace keys: workspace_mib and
// git_remotes.
func (p Profile) validateWorkspace() error {
	if p.WorkspaceMiB < 0 {
		return errors.New("workspace_mib is negative")
	}

	if err := p.validateGitRemotes(); err != nil {
		return err
	}
	return p.validateFrom()
}

// defaultWorkspaceMiB returns the default workspace_mib of p (its memory,
// tmp and home sizes defaulted): half of what memory_mib leaves beside the
// /tmp and home tmpfs, at least 1 MiB.
func defaultWorkspaceMiB(p Profile) int64 {
	return max(1, (p.MemoryMiB-p.TmpMiB-p.HomeMiB)/2)
}

// checkWorkspaceMiB refuses a workspace_mib that, with tmp_mib and
// home_mib, leaves the run no memory of its own: the three are tmpfs whose
// pages count against memory_mib, so the run would meet the OOM killer
// before ENOSPC.
func (p Profile) checkWorkspaceMiB() error {
	if p.WorkspaceMiB > 0 && p.WorkspaceMiB+p.TmpMiB+p.HomeMiB >= p.MemoryMiB {
		return fmt.Errorf("workspace_mib %d with tmp_mib %d and home_mib %d leaves nothing of memory_mib %d: the three are tmpfs whose pages count against the run's memory limit, so a run would meet the OOM killer before ENOSPC; raise memory_mib or lower workspace_mib",
			p.WorkspaceMiB, p.TmpMiB, p.HomeMiB, p.MemoryMiB)
	}
	return nil
}

// validateGitRemotes checks the profile's git_remotes: each an http or
// https URL with a host, no credentials, query or fragment, either exact or
// ending in "/*" (any path below; the only wildcard). Plain http must be
// written as such: an https pattern never allows http. ssh, git://, file://,
// ext:: and local paths are refused: the worker fetches over http(s) only
// and sends no credentials.
func (p Profile) validateGitRemotes() error {
	for _, pat := range p.GitRemotes {
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

// AllowsGitRemote reports whether raw, a request's git URL, matches one of
// the profile's git_remotes: same scheme, same host and port (case
// folded), and the same path, or a path below a pattern's "/*". A URL with
// a "." or ".." segment or an escaped path never matches.
func (p Profile) AllowsGitRemote(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.User != nil || u.RawPath != "" || hasDotSegment(u.Path) || u.RawQuery != "" || u.Fragment != "" {
		return false
	}
	for _, pat := range p.GitRemotes {
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
func (p Profile) validateFrom() error {
	for key, list := range map[string]*[]string{"from_profiles": p.FromProfiles, "feeds": p.Feeds} {
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

// CheckFrom refuses a run of profile p starting from a run of profile src
// (nil when this worker does not know the earlier run's profile, srcName):
// p's from_profiles (absent: p alone) must accept srcName, and src's feeds
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
