#!/usr/bin/env bash
# build.sh builds the jetcrew jail-test image (default jetcrew-testimg:latest)
# from scratch: the sandbox image's static busybox and /etc (built first with
# deploy/sandbox/build.sh when needed), plus /bin/suidprobe, a static Go
# program (CGO_ENABLED=0) installed setuid root, mode 4755, owner 0:0. The
# jail tests (tests/jail_test.go) run in it to prove that a setuid-root binary
# does not raise a jailed process's privileges.
#
# No registry and no network are needed: busybox comes from the local sandbox
# image and suidprobe is compiled here. The build context is staged in a
# temporary directory that is removed on exit; nothing is written into the
# repository.
#
# It is idempotent: the image carries the label io.jetcrew.testimage.inputs,
# a hash of its inputs (this script, the Dockerfile, suidprobe's source, the
# Go version and the sandbox image's id). When an image with an equal hash
# exists the script exits at once. FORCE=1 rebuilds anyway.
#
# Environment:
#   TEST_IMAGE     image reference to build (default jetcrew-testimg:latest)
#   SANDBOX_IMAGE  sandbox image to take busybox from (default jetcrew-sandbox:latest)
#   FORCE=1        rebuild even when the image is up to date
#   DOCKER         docker CLI to use (default docker)
#   GO             go command to use (default go)
set -euo pipefail

TEST_IMAGE=${TEST_IMAGE:-jetcrew-testimg:latest}
SANDBOX_IMAGE=${SANDBOX_IMAGE:-jetcrew-sandbox:latest}
DOCKER=${DOCKER:-docker}
GO=${GO:-go}
FORCE=${FORCE:-0}
INPUTS_LABEL=io.jetcrew.testimage.inputs

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

log() { printf 'testimage: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

if ! "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1; then
	die "cannot reach the Docker engine with '$DOCKER' (is dockerd running, is DOCKER_HOST right?)"
fi
command -v "$GO" >/dev/null 2>&1 || die "'$GO' not found (suidprobe is compiled with Go)"

# The sandbox image first (a no-op when it is up to date); it takes its own
# lock.
SANDBOX_IMAGE="$SANDBOX_IMAGE" DOCKER="$DOCKER" bash "$root/deploy/sandbox/build.sh"

# Serialise concurrent builds (parallel test binaries may all ask for the
# image); the second one then finds the image up to date.
if command -v flock >/dev/null 2>&1; then
	exec 9>"${TMPDIR:-/tmp}/jetcrew-testimage-build.lock"
	flock 9
fi

sandbox_id=$("$DOCKER" image inspect --format '{{.Id}}' "$SANDBOX_IMAGE")
inputs_hash() {
	{
		(cd "$here" && sha256sum build.sh Dockerfile suidprobe/main.go)
		"$GO" version
		echo "$sandbox_id"
	} | sha256sum | cut -c1-64
}
want=$(inputs_hash)
have=$("$DOCKER" image inspect --format "{{ index .Config.Labels \"$INPUTS_LABEL\" }}" "$TEST_IMAGE" 2>/dev/null || true)
if [[ "$FORCE" != 1 && "$have" == "$want" ]]; then
	log "$TEST_IMAGE is up to date (inputs ${want:0:12})"
	exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/jetcrew-testimage.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ctx"

(cd "$root" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags='-s -w' -o "$work/ctx/suidprobe" ./deploy/testimage/suidprobe)
cp "$here/Dockerfile" "$work/ctx/Dockerfile"

log "building $TEST_IMAGE from $SANDBOX_IMAGE + setuid-root suidprobe"
# The classic builder, as for the sandbox image (no buildx on our hosts).
DOCKER_BUILDKIT=0 "$DOCKER" build --quiet \
	--build-arg "SANDBOX_IMAGE=$SANDBOX_IMAGE" \
	--label "$INPUTS_LABEL=$want" \
	--tag "$TEST_IMAGE" \
	"$work/ctx" >&2

# Check what the tests rely on: the probe is setuid root in the image.
mode=$("$DOCKER" run --rm --network none --user 65532:65532 "$TEST_IMAGE" stat -c '%a %u:%g' /bin/suidprobe /home/agent | tr '\n' ' ')
[[ "$mode" == "4755 0:0 700 65532:65532 " ]] || die "/bin/suidprobe and /home/agent in $TEST_IMAGE are '$mode', want '4755 0:0 700 65532:65532 '"
log "built $TEST_IMAGE (inputs ${want:0:12})"
