#!/usr/bin/env bash
# build.sh builds the jetcrew sandbox image (default jetcrew-sandbox:latest)
# from scratch: a static busybox from Debian's busybox-static package, one
# symlink per applet in /bin, etc/passwd + etc/group from this directory, and
# the agent's empty home directory (/home/agent, 65532:65532, mode 0700).
#
# No registry is needed: busybox comes through apt ("apt-get download"; the
# package lists are refreshed with "apt-get update" only when that fails). The
# build context is staged in a temporary directory that is removed on exit, so
# no binary is ever written into the repository.
#
# It is idempotent: the image carries the label io.jetcrew.sandbox.inputs, a
# hash of the files the image is made from (this script, the Dockerfile,
# etc/passwd, etc/group). When an image with an equal hash exists the script
# exits at once without touching apt or the build. FORCE=1 rebuilds anyway,
# for example to pick up a newer busybox-static.
#
# Environment:
#   SANDBOX_IMAGE  image reference to build (default jetcrew-sandbox:latest)
#   FORCE=1        rebuild even when the image is up to date
#   DOCKER         docker CLI to use (default docker)
set -euo pipefail

SANDBOX_IMAGE=${SANDBOX_IMAGE:-jetcrew-sandbox:latest}
DOCKER=${DOCKER:-docker}
FORCE=${FORCE:-0}
INPUTS_LABEL=io.jetcrew.sandbox.inputs
BUSYBOX_LABEL=io.jetcrew.sandbox.busybox

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { printf 'sandbox: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

if ! "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1; then
	die "cannot reach the Docker engine with '$DOCKER' (is dockerd running, is DOCKER_HOST right?)"
fi

# Serialise concurrent builds (parallel test binaries may all ask for the
# image); the second one then finds the image up to date.
if command -v flock >/dev/null 2>&1; then
	exec 9>"${TMPDIR:-/tmp}/jetcrew-sandbox-build.lock"
	flock 9
fi

inputs_hash() {
	(cd "$here" && sha256sum build.sh Dockerfile etc/passwd etc/group) | sha256sum | cut -c1-64
}
want=$(inputs_hash)
have=$("$DOCKER" image inspect --format "{{ index .Config.Labels \"$INPUTS_LABEL\" }}" "$SANDBOX_IMAGE" 2>/dev/null || true)
if [[ "$FORCE" != 1 && "$have" == "$want" ]]; then
	log "$SANDBOX_IMAGE is up to date (inputs ${want:0:12})"
	exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/jetcrew-sandbox.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/deb" "$work/x" "$work/ctx/bin" "$work/ctx/etc" "$work/ctx/home"

# APT::Sandbox::User=root: apt would otherwise drop to _apt, which cannot
# write to our private temp dir (harmless, but it warns).
apt_download() {
	(cd "$work/deb" && apt-get -q -o APT::Sandbox::User=root download busybox-static)
}
if ! apt_download >"$work/apt.log" 2>&1; then
	log "apt-get download failed; refreshing package lists with apt-get update"
	apt-get -q update >&2 || die "apt-get update failed"
	apt_download >&2 || die "apt-get download busybox-static failed"
fi
deb=$(ls "$work"/deb/busybox-static_*.deb)
version=$(dpkg-deb --field "$deb" Version)
dpkg-deb -x "$deb" "$work/x"
[[ -x "$work/x/bin/busybox" ]] || die "$deb has no bin/busybox"

install -m 0755 "$work/x/bin/busybox" "$work/ctx/bin/busybox"
n=0
for applet in $("$work/ctx/bin/busybox" --list); do
	[[ "$applet" == busybox ]] && continue
	ln -s busybox "$work/ctx/bin/$applet"
	n=$((n + 1))
done
install -m 0644 "$here/etc/passwd" "$here/etc/group" "$work/ctx/etc/"
# The agent's home directory, mode 0700. The worker mounts a tmpfs there,
# and runc gives a tmpfs mounted on an existing directory that directory's
# mode, whatever the tmpfs's mode= option says; without it in the image,
# Docker would create it (it is the working directory) with mode 0755.
install -d -m 0700 "$work/ctx/home/agent"
cp "$here/Dockerfile" "$work/ctx/Dockerfile"

log "building $SANDBOX_IMAGE: busybox-static $version, $n applets"
# buildx is not installed on our hosts; the classic builder is enough for
# FROM scratch + COPY.
DOCKER_BUILDKIT=0 "$DOCKER" build --quiet \
	--label "$INPUTS_LABEL=$want" \
	--label "$BUSYBOX_LABEL=$version" \
	--tag "$SANDBOX_IMAGE" \
	"$work/ctx" >&2
log "built $SANDBOX_IMAGE (inputs ${want:0:12})"
