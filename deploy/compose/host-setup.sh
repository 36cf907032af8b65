#!/usr/bin/env bash
# host-setup.sh prepares a Docker host, once, for deploy/compose's workers.
# Run it as root from the repository, after `make build`:
#
#   sudo deploy/compose/host-setup.sh
#
# The workers run in containers but start run containers through the host's
# Docker engine, which resolves bind-mount sources on the host. So:
#   - the bridge binary the workers mount into run containers must exist on
#     the host at the path the workers use, /opt/jetcrew/bin/jetcrew-bridge
#     (the compose file also mounts this very file into the workers, so what
#     they check is what the engine mounts);
#   - the workers' state directory (per-run directories with the bridge
#     socket) is a host directory mounted into them at the same path,
#     $JETCREW_STATE_DIR (default /var/lib/jetcrew), owned by the workers'
#     user 65532.
# It also writes deploy/compose/.env with DOCKER_GID, the group of the
# host's Docker socket, which the workers join (see docs/deploy.md for what
# holding that socket means).
#
# Environment: JETCREW_STATE_DIR (default /var/lib/jetcrew), BIN (default
# bin), DOCKER_SOCKET (default /var/run/docker.sock).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
BIN=${BIN:-$root/bin}
STATE_DIR=${JETCREW_STATE_DIR:-/var/lib/jetcrew}
DOCKER_SOCKET=${DOCKER_SOCKET:-/var/run/docker.sock}
WORKER_UID=65532

log() { printf 'host-setup: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $(id -u) == 0 ]] || die "run as root (it writes /opt/jetcrew/bin and $STATE_DIR)"
[[ -x "$BIN/jetcrew-bridge" ]] || die "$BIN/jetcrew-bridge is missing: run 'make build' first"
[[ -S "$DOCKER_SOCKET" ]] || die "$DOCKER_SOCKET is not a socket"
[[ "$STATE_DIR" == /* ]] || die "JETCREW_STATE_DIR must be absolute"

install -d -m 0755 /opt/jetcrew/bin
install -m 0555 "$BIN/jetcrew-bridge" /opt/jetcrew/bin/jetcrew-bridge
log "installed /opt/jetcrew/bin/jetcrew-bridge"

install -d -o "$WORKER_UID" -g "$WORKER_UID" -m 0700 "$STATE_DIR"
log "state directory $STATE_DIR (owner $WORKER_UID, mode 0700)"

gid=$(stat -c %g "$DOCKER_SOCKET")
{
	echo "# Written by deploy/compose/host-setup.sh."
	echo "DOCKER_GID=$gid"
	echo "JETCREW_STATE_DIR=$STATE_DIR"
} >"$here/.env"
log "wrote $here/.env (DOCKER_GID=$gid)"
