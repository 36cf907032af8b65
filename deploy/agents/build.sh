#!/usr/bin/env bash
# build.sh builds the jetcrew agents test image (default
# jetcrew-agents:latest) from scratch: the sandbox image's static busybox,
# /etc and /home (built first with deploy/sandbox/build.sh when needed, from
# Debian's busybox-static fetched with "apt-get download"), plus the fixture
# agent tests/fixtures/agent, compiled static (CGO_ENABLED=0), at
# /usr/local/bin/mcp-agent, hard-linked as claude, codex, gemini, opencode,
# kimi and pi. tests/coord_test.go and scripts/demo.sh run it as the profile
# "agent": ["/usr/local/bin/mcp-agent", "{prompt}"]; tests/backends_test.go
# runs it as each agent CLI.
#
# No registry is needed: busybox comes from the local sandbox image and
# mcp-agent is compiled here (its modules from the Go module cache or
# proxy, like any build of this repository). The build context is staged in
# a temporary directory that is removed on exit; nothing is written into the
# repository.
#
# It is idempotent: the image carries the label io.jetcrew.agents.inputs, a
# hash of its inputs (this script, the Dockerfile, the fixture's non-test Go
# files, go.mod, go.sum, the Go version and the sandbox image's id). When an
# image with an equal hash exists the script exits at once. FORCE=1 rebuilds
# anyway. Concurrent runs are serialised with flock.
#
# Environment:
#   AGENTS_IMAGE   image reference to build (default jetcrew-agents:latest)
#   SANDBOX_IMAGE  sandbox image to take busybox from (default jetcrew-sandbox:latest)
#   FORCE=1        rebuild even when the image is up to date
#   DOCKER         docker CLI to use (default docker)
#   GO             go command to use (default go)
set -euo pipefail

AGENTS_IMAGE=${AGENTS_IMAGE:-jetcrew-agents:latest}
SANDBOX_IMAGE=${SANDBOX_IMAGE:-jetcrew-sandbox:latest}
DOCKER=${DOCKER:-docker}
GO=${GO:-go}
FORCE=${FORCE:-0}
INPUTS_LABEL=io.jetcrew.agents.inputs
FIXTURE=tests/fixtures/agent

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

log() { printf 'agents: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

if ! "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1; then
	die "cannot reach the Docker engine with '$DOCKER' (is dockerd running, is DOCKER_HOST right?)"
fi
command -v "$GO" >/dev/null 2>&1 || die "'$GO' not found (mcp-agent is compiled with Go)"

# The sandbox image first (a no-op when it is up to date); it takes its own
# lock.
SANDBOX_IMAGE="$SANDBOX_IMAGE" DOCKER="$DOCKER" bash "$root/deploy/sandbox/build.sh"

# Serialise concurrent builds (parallel test binaries may all ask for the
# image); the second one then finds the image up to date.
if command -v flock >/dev/null 2>&1; then
	exec 9>"${TMPDIR:-/tmp}/jetcrew-agents-build.lock"
	flock 9
fi

sandbox_id=$("$DOCKER" image inspect --format '{{.Id}}' "$SANDBOX_IMAGE")
inputs_hash() {
	{
		(cd "$here" && sha256sum build.sh Dockerfile)
		(cd "$root" && find "$FIXTURE" -maxdepth 1 -name '*.go' ! -name '*_test.go' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
		(cd "$root" && sha256sum go.mod go.sum)
		"$GO" version
		echo "$sandbox_id"
	} | sha256sum | cut -c1-64
}
want=$(inputs_hash)
have=$("$DOCKER" image inspect --format "{{ index .Config.Labels \"$INPUTS_LABEL\" }}" "$AGENTS_IMAGE" 2>/dev/null || true)
if [[ "$FORCE" != 1 && "$have" == "$want" ]]; then
	log "$AGENTS_IMAGE is up to date (inputs ${want:0:12})"
	exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/jetcrew-agents.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ctx"

(cd "$root" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags='-s -w' -o "$work/ctx/mcp-agent" "./$FIXTURE")
cp "$here/Dockerfile" "$work/ctx/Dockerfile"

log "building $AGENTS_IMAGE from $SANDBOX_IMAGE + mcp-agent"
# The classic builder, as for the sandbox image (no buildx on our hosts).
DOCKER_BUILDKIT=0 "$DOCKER" build --quiet \
	--build-arg "SANDBOX_IMAGE=$SANDBOX_IMAGE" \
	--label "$INPUTS_LABEL=$want" \
	--tag "$AGENTS_IMAGE" \
	"$work/ctx" >&2

# Check what the tests rely on: the agent runs as 65532 in a jail like the
# worker's, and without an MCP configuration it says so and exits 2.
mode=$("$DOCKER" run --rm --network none --read-only --cap-drop ALL --user 65532:65532 "$AGENTS_IMAGE" \
	stat -c '%a %u:%g' /usr/local/bin/mcp-agent /home/agent | tr '\n' ' ')
[[ "$mode" == "755 0:0 700 65532:65532 " ]] || die "/usr/local/bin/mcp-agent and /home/agent in $AGENTS_IMAGE are '$mode', want '755 0:0 700 65532:65532 '"
# One file under every name (overlayfs may show the links' inodes apart:
# compare contents, modes and owners).
clis="/usr/local/bin/mcp-agent /usr/local/bin/claude /usr/local/bin/codex /usr/local/bin/gemini /usr/local/bin/opencode /usr/local/bin/kimi /usr/local/bin/pi"
sums=$("$DOCKER" run --rm --network none --read-only --cap-drop ALL --user 65532:65532 "$AGENTS_IMAGE" \
	sh -c "sha256sum $clis | cut -d' ' -f1 | sort -u | wc -l; stat -c '%a %u:%g' $clis | sort -u" | tr '\n' ' ')
[[ "$sums" == "1 755 0:0 " ]] || die "the CLI names in $AGENTS_IMAGE are not all the fixture, mode 755, owned by root (distinct contents, modes: $sums)"
rc=0
out=$(printf 'say hi' | "$DOCKER" run -i --rm --network none --read-only --cap-drop ALL --user 65532:65532 "$AGENTS_IMAGE" \
	claude -p 2>&1 >/dev/null) || rc=$?
[[ "$rc" == 1 && "$out" == *--mcp-config* ]] || die "claude (the fixture) with no MCP configuration exited $rc, want 1 and a word on --mcp-config: $out"
rc=0
out=$("$DOCKER" run --rm --network none --read-only --cap-drop ALL --user 65532:65532 "$AGENTS_IMAGE" \
	/usr/local/bin/mcp-agent status 2>&1 >/dev/null) || rc=$?
[[ "$rc" == 2 && "$out" == *JETCREW_MCP_CONFIG* ]] || die "mcp-agent without an MCP configuration exited $rc, want 2 and a word on JETCREW_MCP_CONFIG: $out"
log "built $AGENTS_IMAGE (inputs ${want:0:12})"
