package worker

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/jetcrew/jetcrew/messages"
)

// Bounds and refusals the profile loader applies (issue 13). Each is checked
// when the file is loaded, and the error names the file, the profile and the
// key.

// MaxID is the largest uid or gid a profile's user may name: the largest
// positive 32-bit signed value, which every runtime (runc, gVisor) and every
// image tool carries; larger ids fail only when a run starts.
const MaxID = 1<<31 - 1

// HomePrefixes are the directories a profile's home (and workdir) must be
// at or under: a writable tmpfs is mounted at home, and mounted over a
// system directory (/etc, /usr, /bin, ...) it would let the run replace what
// the image's programs trust.
var HomePrefixes = []string{"/home", "/work", "/workspace"}

// workerEnvPrefixes are the prefixes of the worker's own connection
// variables (NATS URL, credentials, nkeys and contexts; the Docker endpoint
// and its TLS material), compared without regard to case. A profile may not
// copy them into a run with env_from_host.
var workerEnvPrefixes = []string{"NATS_", "DOCKER_"}

// deniedEnv names the variables no request may set, whatever the profile's
// request_env lists, compared without regard to case: the dynamic loader's,
// language runtimes' start-up hooks and search paths, proxies and trust
// stores, and what the worker sets itself.
var deniedEnv = []string{
	"PATH", "HOME", "SHELL", "IFS", "ENV", "BASH_ENV", "CDPATH", "PS4", "PROMPT_COMMAND",
	"GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "HOSTALIASES", "RES_OPTIONS", "TZDIR", "TMPDIR",
	"NODE_OPTIONS", "NODE_PATH", "NODE_EXTRA_CA_CERTS", "NODE_TLS_REJECT_UNAUTHORIZED",
	"PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONINSPECT",
	"PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYOPT", "RUBYLIB", "GEM_HOME", "GEM_PATH",
	"JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH",
	"GOFLAGS", "GOPROXY", "GONOSUMDB", "GOPRIVATE", "CARGO_HOME", "RUSTFLAGS",
	"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "FTP_PROXY", "RSYNC_PROXY",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_NO_VERIFY",
	"GIT_SSH_COMMAND", "GIT_SSH", "GIT_ASKPASS", "GIT_EXEC_PATH", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM",
	"SSH_AUTH_SOCK",
}

// deniedEnvPrefixes are prefixes of variables no request may set: the
// loader's (LD_*), the allocator's (MALLOC_*), git's config injection
// (GIT_CONFIG_*), jetcrew's own and the worker's connection variables.
var deniedEnvPrefixes = []string{"LD_", "MALLOC_", "GIT_CONFIG_", "DYLD_", "NATS_", "JETCREW_", "DOCKER_"}

// DeniedRequestEnv reports whether a request may never set variable name
// (see deniedEnv): a loader, runtime, proxy or trust-store variable, or one
// the worker owns. The comparison ignores case (curl reads http_proxy).
func DeniedRequestEnv(name string) bool {
	u := strings.ToUpper(name)
	if slices.Contains(deniedEnv, u) {
		return true
	}
	for _, p := range deniedEnvPrefixes {
		if strings.HasPrefix(u, p) {
			return true
		}
	}
	return false
}

// validateHardening checks the keys issue 13 bounds: request_env,
// env_from_host, home and workdir, and the user's id range.
func (p Profile) validateHardening() error {
	for _, name := range p.RequestEnv {
		pat := strings.TrimSuffix(name, "*")
		if pat != "" && !messages.ValidEnvName(pat) {
			return fmt.Errorf("request_env %q is neither a variable name nor a prefix ending in '*'", name)
		}
		if pat == name && DeniedRequestEnv(name) {
			return fmt.Errorf("request_env %q is a loader, runtime, proxy or worker variable, which a request may never set", name)
		}
	}
	for _, name := range p.EnvFromHost {
		for _, pre := range workerEnvPrefixes {
			if strings.HasPrefix(strings.ToUpper(name), pre) {
				return fmt.Errorf("env_from_host %q is one of the worker's own connection variables (%s*): it never reaches a run", name, pre)
			}
		}
	}
	for _, d := range []struct{ key, path string }{{"home", p.Home}, {"workdir", p.WorkDir}} {
		if !underHomePrefixes(d.path) {
			return fmt.Errorf("%s %q must be at or under one of %s", d.key, d.path, strings.Join(HomePrefixes, ", "))
		}
	}
	uid, gid, err := parseUser(p.User)
	if err != nil {
		return err
	}
	if uid > MaxID || gid > MaxID {
		return fmt.Errorf("user %q: uid and gid must be 1 to %d", p.User, MaxID)
	}
	return nil
}

// underHomePrefixes reports whether path, cleaned of "." and ".." steps, is
// one of HomePrefixes or under one.
func underHomePrefixes(path string) bool {
	if strings.Contains("/"+path+"/", "/../") || strings.Contains("/"+path+"/", "/./") || strings.Contains(path, "//") {
		return false
	}
	path = strings.TrimSuffix(path, "/")
	for _, pre := range HomePrefixes {
		if path == pre || strings.HasPrefix(path, pre+"/") {
			return true
		}
	}
	return false
}

// allowsRequestEnv reports whether the profile accepts variable name from a
// request: listed in request_env, exactly or by a prefix ending in '*', and
// not denied (DeniedRequestEnv).
func (p Profile) allowsRequestEnv(name string) bool {
	if DeniedRequestEnv(name) {
		return false
	}
	for _, pat := range p.RequestEnv {
		if pre, ok := strings.CutSuffix(pat, "*"); ok && strings.HasPrefix(name, pre) || pat == name {
			return true
		}
	}
	return false
}

// checkRequest refuses, before anything is staged, a request the profile
// cannot carry: a variable the profile does not accept (request_env), a
// git remote it does not allow (git_remotes), or a NUL byte in a prompt
// the profile passes as a command-line argument (argv cannot hold one;
// stdin and {prompt_file} can). The error says which.
func (p Profile) checkRequest(r messages.RunRequest) error {
	names := make([]string, 0, len(r.Env))
	for k := range r.Env {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if !p.allowsRequestEnv(k) {
			if DeniedRequestEnv(k) {
				return fmt.Errorf("request env %s is refused: loader, runtime, proxy and worker variables are never taken from a request", k)
			}
			return fmt.Errorf("request env %s is refused: profile %q accepts %s from a request (its request_env)", k, p.Name, describeAllow(p.RequestEnv))
		}
	}
	if err := p.checkGitSource(r.Workspace); err != nil {
		return err
	}
	if i := strings.IndexByte(r.Prompt, 0); i >= 0 && p.promptInArgv() {
		return fmt.Errorf("prompt has a NUL byte at byte %d, which a command-line argument cannot carry: profile %q passes the prompt as an argument (use a profile with prompt_stdin or {prompt_file})", i, p.Name)
	}
	return nil
}

func describeAllow(list []string) string {
	if len(list) == 0 {
		return "no variables"
	}
	return "only " + strings.Join(list, ", ")
}

// promptInArgv reports whether the prompt becomes (part of) an argument:
// the command backend substituting "{prompt}" in its command (prompt_stdin
// or not). Agent backends feed it on stdin.
func (p Profile) promptInArgv() bool {
	if p.Backend != BackendCommand {
		return false
	}
	for _, a := range p.Command {
		if strings.Contains(a, "{prompt}") {
			return true
		}
	}
	return false
}

// checkExactKeys refuses a key of the profile file that is not exactly one of
// the documented names: the TOML decoder matches "Image" or "IMAGE" to
// "image" (and keeps one of two such keys silently).
func checkExactKeys(md toml.MetaData) error {
	known := profileKeys()
	for _, k := range md.Keys() {
		switch {
		case len(k) >= 1 && k[0] != "profiles":
			return fmt.Errorf("key %q is not %q: keys are matched exactly, case included", k[0], "profiles")
		case len(k) >= 3 && !known[k[2]]:
			return fmt.Errorf("profile %q: key %q is not a profile key (keys are matched exactly, case included)", k[1], k[2])
		}
	}
	return nil
}

// profileKeys returns the TOML key of every Profile field.
func profileKeys() map[string]bool {
	t := reflect.TypeFor[Profile]()
	m := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("toml"), ","); name != "" && name != "-" {
			m[name] = true
		}
	}
	return m
}
