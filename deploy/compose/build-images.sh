#!/usr/bin/env bash
# build-images.sh builds the images of deploy/compose from scratch, from our
# own static binaries; nothing is pulled from a registry:
#
#   jetcrew-nats:v2.15.2 (and :latest)  nats-server, built here with
#       CGO_ENABLED=0 go install github.com/nats-io/nats-server/v2@v2.15.2
#       into bin/nats-server, plus deploy/nats/cluster.conf
#   jetcrew-worker:latest               bin/jetcrew and bin/jetcrew-bridge
#                                       (make build), deploy/compose/worker.Dockerfile
#
# `make deploy-images` runs it after `make build`. Each build context is
# staged in a temporary directory (removed on exit) holding just the files
# its Dockerfile copies. The classic builder is enough for FROM scratch +
# COPY, so DOCKER_BUILDKIT=0.
#
# Environment:
#   NATS_SERVER_VERSION  nats-server version to build (default v2.15.2)
#   NATS_IMAGE           default jetcrew-nats
#   WORKER_IMAGE         default jetcrew-worker:latest
#   BIN                  directory of jetcrew, jetcrew-bridge (default bin)
#   GO                   go command (default go)
#   DOCKER               docker CLI (default docker)
set -euo pipefail

NATS_SERVER_VERSION=${NATS_SERVER_VERSION:-v2.15.2}
NATS_IMAGE=${NATS_IMAGE:-jetcrew-nats}
WORKER_IMAGE=${WORKER_IMAGE:-jetcrew-worker:latest}
GO=${GO:-go}
DOCKER=${DOCKER:-docker}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
BIN=$(cd "${BIN:-$root/bin}" && pwd)

log() { printf 'deploy-images: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

"$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
	die "cannot reach the Docker engine with '$DOCKER'"
for b in jetcrew jetcrew-bridge; do
	[[ -x "$BIN/$b" ]] || die "$BIN/$b is missing: run 'make build' first"
done

# nats-server: a static binary of the pinned version, built once.
nats="$BIN/nats-server"
if [[ ! -x "$nats" ]] || [[ "$("$nats" --version 2>/dev/null)" != "nats-server: $NATS_SERVER_VERSION" ]]; then
	log "building nats-server $NATS_SERVER_VERSION (go install, CGO_ENABLED=0)"
	CGO_ENABLED=0 GOBIN="$BIN" "$GO" install -trimpath -ldflags "-s -w" \
		"github.com/nats-io/nats-server/v2@$NATS_SERVER_VERSION"
fi
"$nats" --version >&2
if command -v file >/dev/null 2>&1; then
	file "$nats" | grep -q 'statically linked' || die "$nats is not statically linked"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/jetcrew-deploy.XXXXXX")
trap 'rm -rf "$work"' EXIT

# jetcrew-nats
mkdir -p "$work/nats/data"
install -m 0755 "$nats" "$work/nats/nats-server"
install -m 0644 "$root/deploy/nats/cluster.conf" "$work/nats/cluster.conf"
cp "$root/deploy/nats/Dockerfile" "$work/nats/Dockerfile"
# The config must parse before it is baked in: against throwaway users and
# certificates in place of the host's (/etc/nats/ is mounted at run time).
check="$work/check"
"$BIN/jetcrew" roles users "$check/auth" >/dev/null
bash "$here/make-certs.sh" "$check/tls"
sed "s#/etc/nats/#$check/#g" "$work/nats/cluster.conf" >"$check/cluster.conf"
NATS_SERVER_NAME=check "$nats" --config "$check/cluster.conf" -t >&2
log "building $NATS_IMAGE:$NATS_SERVER_VERSION"
DOCKER_BUILDKIT=0 "$DOCKER" build --quiet \
	--label "io.jetcrew.nats-server=$NATS_SERVER_VERSION" \
	--tag "$NATS_IMAGE:$NATS_SERVER_VERSION" --tag "$NATS_IMAGE:latest" \
	"$work/nats" >&2

# jetcrew-worker
mkdir -p "$work/worker"
install -m 0755 "$BIN/jetcrew" "$work/worker/jetcrew"
# The bridge is mounted read-only into run containers, which need it 0555.
install -m 0555 "$BIN/jetcrew-bridge" "$work/worker/jetcrew-bridge"
cp "$here/worker.Dockerfile" "$work/worker/Dockerfile"
version=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)
log "building $WORKER_IMAGE (jetcrew $version)"
DOCKER_BUILDKIT=0 "$DOCKER" build --quiet \
	--label "io.jetcrew.version=$version" \
	--tag "$WORKER_IMAGE" \
	"$work/worker" >&2

"$DOCKER" image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E "^($NATS_IMAGE|${WORKER_IMAGE%%:*}):" >&2 || true
log "done; before 'docker-compose up', prepare the host once: sudo deploy/compose/host-setup.sh"
