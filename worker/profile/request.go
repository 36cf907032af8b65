package profile

import (
	"fmt"
	"slices"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

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

// DeniedRequestEnv reports whether a request may never set variable name.
// Such a variable (deniedEnv) is a loader, runtime, proxy or trust-store
// variable, or one the worker owns. The comparison ignores case (curl reads
// http_proxy).
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

// CheckRequest refuses a request the profile cannot carry, before any
// staging. That is a request with a variable the profile does not accept
// (request_env), a git remote it does not allow (git_remotes), or a NUL byte
// in a prompt the profile passes as a command-line argument (argv cannot
// hold one; stdin and {prompt_file} can). The error says which.
func (p Profile) CheckRequest(r messages.RunRequest) error {
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
	if err := p.CheckGitSource(r.Workspace); err != nil {
		return err
	}
	if r.Workspace != nil && r.Workspace.From != "" && p.FromProfiles != nil && len(*p.FromProfiles) == 0 {
		return fmt.Errorf("workspace from run %s is refused: profile %q starts no run from an earlier run's result (its from_profiles is empty)", r.Workspace.From, p.Name)
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
