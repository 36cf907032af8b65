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
#   - the cluster's TLS and users, under $JETCREW_AUTH_DIR (default
#     /etc/jetcrew): tls/ (a private CA and the nodes' certificate,
#     make-certs.sh), users/<role>.nk (one NKey user seed per role, `jetcrew
#     roles users`; worker.nk owned by the workers' user, the others by the
#     user who ran sudo, all 0600) and nats/ (users.conf and permissions.conf
#     for the nodes). Existing files are kept.
# It also writes deploy/compose/.env with DOCKER_GID, the group of the
# host's Docker socket, which the workers join (see docs/deploy.md for what
# holding that socket means).
#
# Environment: JETCREW_STATE_DIR (default /var/lib/jetcrew), JETCREW_AUTH_DIR
# (default /etc/jetcrew), BIN (default bin), DOCKER_SOCKET (default
# /var/run/docker.sock).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
BIN=${BIN:-$root/bin}
STATE_DIR=${JETCREW_STATE_DIR:-/var/lib/jetcrew}
AUTH_DIR=${JETCREW_AUTH_DIR:-/etc/jetcrew}
DOCKER_SOCKET=${DOCKER_SOCKET:-/var/run/docker.sock}
WORKER_UID=65532

log() { printf 'host-setup: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $(id -u) == 0 ]] || die "run as root (it writes /opt/jetcrew/bin and $STATE_DIR)"
[[ -x "$BIN/jetcrew-bridge" ]] || die "$BIN/jetcrew-bridge is missing: run 'make build' first"
[[ -x "$BIN/jetcrew" ]] || die "$BIN/jetcrew is missing: run 'make build' first"
command -v openssl >/dev/null || die "openssl is needed for the cluster's certificates"
[[ -S "$DOCKER_SOCKET" ]] || die "$DOCKER_SOCKET is not a socket"
[[ "$STATE_DIR" == /* ]] || die "JETCREW_STATE_DIR must be absolute"
[[ "$AUTH_DIR" == /* ]] || die "JETCREW_AUTH_DIR must be absolute"

install -d -m 0755 /opt/jetcrew/bin
install -m 0555 "$BIN/jetcrew-bridge" /opt/jetcrew/bin/jetcrew-bridge
log "installed /opt/jetcrew/bin/jetcrew-bridge"

install -d -o "$WORKER_UID" -g "$WORKER_UID" -m 0700 "$STATE_DIR"
log "state directory $STATE_DIR (owner $WORKER_UID, mode 0700)"

# TLS and per-role users (docs/security.md).
install -d -m 0755 "$AUTH_DIR"
bash "$here/make-certs.sh" "$AUTH_DIR/tls"
chown "$WORKER_UID:$WORKER_UID" "$AUTH_DIR/tls/server-key.pem"
"$BIN/jetcrew" roles users "$AUTH_DIR/users" >/dev/null
install -d -m 0755 "$AUTH_DIR/nats"
install -m 0644 "$AUTH_DIR/users/users.conf" "$AUTH_DIR/users/permissions.conf" "$AUTH_DIR/nats/"
chmod 0755 "$AUTH_DIR/users"
chown "$WORKER_UID:$WORKER_UID" "$AUTH_DIR/users/worker.nk"
for role in submitter operator observer; do
	chown "${SUDO_UID:-0}:${SUDO_GID:-0}" "$AUTH_DIR/users/$role.nk"
done
log "TLS in $AUTH_DIR/tls, role users in $AUTH_DIR/users (seeds 0600), node files in $AUTH_DIR/nats"

gid=$(stat -c %g "$DOCKER_SOCKET")
{
	echo "# Written by deploy/compose/host-setup.sh."
	echo "DOCKER_GID=$gid"
	echo "JETCREW_STATE_DIR=$STATE_DIR"
	echo "JETCREW_AUTH_DIR=$AUTH_DIR"
} >"$here/.env"
log "wrote $here/.env (DOCKER_GID=$gid)"
