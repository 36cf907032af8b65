#!/usr/bin/env bash
# build.sh builds the jetcrew sandbox image (default jetcrew-sandbox:latest)
# from scratch: a static busybox from Debian's busybox-static package, one
# symlink per applet in /bin; Debian's curl in /usr/bin with the shared
# libraries it needs (from the packages of its dependency closure, as apt
# computes it) and Debian's CA roots (ca-certificates) as
# /etc/ssl/certs/ca-certificates.crt; etc/passwd, etc/group and
# etc/nsswitch.conf from this directory; and the agent's empty home
# directory (/home/agent, 65532:65532, mode 0700).
#
# curl is the image's HTTP client because busybox's wget cannot be one:
# Debian builds busybox-static without FEATURE_WGET_TIMEOUT, and busybox
# 1.35's option parser then stores -T's value through the NULL pointer wget
# passes for it, so `wget -T N` (or --timeout) dies of SIGSEGV before any
# network use; its TLS checks no certificate and fails the handshake with
# today's servers; and it asks a proxy for an https URL with a GET instead
# of CONNECT, which the egress proxy refuses. The applet cannot be left out
# either: busybox's sh (built standalone) runs its applets before it looks
# at PATH, link or no link. curl does all of it right and honours the proxy
# and CA variables jetcrew sets (docs/profiles.md). Debian has no static
# curl, hence its libraries.
#
# No registry is needed: the packages come through apt ("apt-get download";
# the package lists are refreshed with "apt-get update" only when that
# fails). The build context is staged in a temporary directory that is
# removed on exit, so no binary is ever written into the repository.
#
# It is idempotent: the image carries the label io.jetcrew.sandbox.inputs, a
# hash of the files the image is made from (this script, the Dockerfile,
# etc/passwd, etc/group, etc/nsswitch.conf). When an image with an equal hash
# exists the script exits at once without touching apt or the build. FORCE=1
# rebuilds anyway, for example to pick up newer packages.
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
CURL_LABEL=io.jetcrew.sandbox.curl

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
	(cd "$here" && sha256sum build.sh Dockerfile etc/passwd etc/group etc/nsswitch.conf) | sha256sum | cut -c1-64
}
want=$(inputs_hash)
have=$("$DOCKER" image inspect --format "{{ index .Config.Labels \"$INPUTS_LABEL\" }}" "$SANDBOX_IMAGE" 2>/dev/null || true)
if [[ "$FORCE" != 1 && "$have" == "$want" ]]; then
	log "$SANDBOX_IMAGE is up to date (inputs ${want:0:12})"
	exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/jetcrew-sandbox.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/deb" "$work/x" "$work/root" "$work/ctx/bin" "$work/ctx/etc/ssl/certs" "$work/ctx/home" "$work/ctx/curl/usr/bin"

# curl's dependency closure (Depends and Pre-Depends, recursively; no
# Recommends): the packages whose shared libraries it loads.
curl_closure() {
	apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
		--no-breaks --no-replaces --no-enhances curl | grep '^[a-z0-9]' | sort -u
}
# APT::Sandbox::User=root: apt would otherwise drop to _apt, which cannot
# write to our private temp dir (harmless, but it warns).
apt_download() {
	local pkgs
	pkgs=$(curl_closure) && [[ -n "$pkgs" ]] || return 1
	# shellcheck disable=SC2086 # one word per package
	(cd "$work/deb" && apt-get -q -o APT::Sandbox::User=root download busybox-static ca-certificates $pkgs)
}
if ! apt_download >"$work/apt.log" 2>&1; then
	log "apt-get download failed; refreshing package lists with apt-get update"
	apt-get -q update >&2 || die "apt-get update failed"
	rm -f "$work"/deb/*.deb
	apt_download >&2 || die "apt-get download of busybox-static, ca-certificates and curl's closure failed"
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

# curl and its libraries: every package of the closure extracted into one
# tree, then curl and the shared objects at the top of the library
# directories (lib/<triplet>, usr/lib/<triplet>, lib64: where the dynamic
# loader looks without an ld.so.cache) copied, links kept. Nothing else of
# those packages (no gconv modules, no plugins, no docs) goes in.
curl_version=""
for d in "$work"/deb/*.deb; do
	case "$(basename "$d")" in busybox-static_* | ca-certificates_*) continue ;; esac
	dpkg-deb -x "$d" "$work/root"
	if [[ "$(basename "$d")" == curl_* ]]; then
		curl_version=$(dpkg-deb --field "$d" Version)
	fi
done
[[ -n "$curl_version" && -x "$work/root/usr/bin/curl" ]] || die "curl was not among the downloaded packages"
install -m 0755 "$work/root/usr/bin/curl" "$work/ctx/curl/usr/bin/curl"
(
	cd "$work/root"
	find lib usr/lib lib64 -mindepth 1 -maxdepth 2 \( -type f -o -type l \) -name '*.so*' \
		\( -path 'lib64/*' -o -path 'lib/*-linux-*/*' -o -path 'usr/lib/*-linux-*/*' \) 2>/dev/null |
		while read -r f; do
			mkdir -p "$work/ctx/curl/$(dirname "$f")"
			cp -P "$f" "$work/ctx/curl/$f"
		done
)
# The loader must be there, and curl must find every library it needs in
# what was copied (ldd, the host's loader, answers "not found" otherwise).
ls "$work"/ctx/curl/lib*/ld-linux* "$work"/ctx/curl/lib/*/ld-linux* >/dev/null 2>&1 || die "no dynamic loader among curl's libraries"
if command -v ldd >/dev/null 2>&1; then
	libpath=$(find "$work/ctx/curl" -mindepth 2 -type d | paste -sd:)
	missing=$(LD_LIBRARY_PATH="$libpath" ldd "$work/ctx/curl/usr/bin/curl" | grep 'not found' || true)
	[[ -z "$missing" ]] || die "curl needs libraries its packages did not bring: $missing"
fi

# The CA roots, as update-ca-certificates would bundle them.
cadeb=$(ls "$work"/deb/ca-certificates_*.deb)
dpkg-deb -x "$cadeb" "$work/ca"
awk 1 "$work"/ca/usr/share/ca-certificates/mozilla/*.crt >"$work/ctx/etc/ssl/certs/ca-certificates.crt"
[[ -s "$work/ctx/etc/ssl/certs/ca-certificates.crt" ]] || die "$cadeb has no CA certificates"

install -m 0644 "$here/etc/passwd" "$here/etc/group" "$here/etc/nsswitch.conf" "$work/ctx/etc/"
# The agent's home directory, mode 0700. The worker mounts a tmpfs there,
# and runc gives a tmpfs mounted on an existing directory that directory's
# mode, whatever the tmpfs's mode= option says; without it in the image,
# Docker would create it (it is the working directory) with mode 0755.
install -d -m 0700 "$work/ctx/home/agent"
cp "$here/Dockerfile" "$work/ctx/Dockerfile"

log "building $SANDBOX_IMAGE: busybox-static $version, $n applets, curl $curl_version"
# buildx is not installed on our hosts; the classic builder is enough for
# FROM scratch + COPY.
DOCKER_BUILDKIT=0 "$DOCKER" build --quiet \
	--label "$INPUTS_LABEL=$want" \
	--label "$BUSYBOX_LABEL=$version" \
	--label "$CURL_LABEL=$curl_version" \
	--tag "$SANDBOX_IMAGE" \
	"$work/ctx" >&2
log "built $SANDBOX_IMAGE (inputs ${want:0:12})"
