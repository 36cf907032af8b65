#!/usr/bin/env bash
# install-runtimes.sh installs Debian's runsc (gVisor) and crun, registers
# them with the Docker engine and reloads the engine WITHOUT restarting it.
#
# It is what .ci/run does before `make test`, so that CI (a throwaway root
# machine) always proves the gVisor path; an operator can run it as root on a
# worker host too (docs/jail.md, "Installing runsc and crun").
#
# Registered runtimes (the names profiles use with `runtime = "..."`):
#   runsc      /usr/bin/runsc --network=none --host-uds=open
#              gVisor for runs with network "none" (the default); the bridge
#              reaches the worker through the host unix socket (--host-uds=open)
#   runsc-net  /usr/bin/runsc --network=host --host-uds=open
#              gVisor for profiles whose network is "bridge" or a named
#              network: the Sentry uses the container's network namespace
#              through the host kernel's stack (Debian's runsc cannot use its
#              own network stack on 6.x kernels; docs/jail.md)
#   crun       /usr/bin/crun
#
# What it changes: it ADDS (or updates) these three entries under "runtimes"
# in /etc/docker/daemon.json and keeps every other key and every other
# runtime as it was; then it sends SIGHUP to dockerd (the engine reloads
# "runtimes" on SIGHUP) and polls `docker info` until the runtimes are listed.
# It never restarts dockerd.
#
# Idempotent: with the packages installed and daemon.json already holding
# the entries, it neither calls apt nor signals dockerd. It fails loudly
# (non-zero exit, a message on stderr) when anything does not work.
#
# Environment: DAEMON_JSON (default /etc/docker/daemon.json),
# RUNTIMES_TIMEOUT (seconds to wait for `docker info`, default 60).
set -euo pipefail

DAEMON_JSON=${DAEMON_JSON:-/etc/docker/daemon.json}
RUNTIMES_TIMEOUT=${RUNTIMES_TIMEOUT:-60}
WANT=(runsc runsc-net crun)

die() { echo "install-runtimes: $*" >&2; exit 1; }
say() { echo "install-runtimes: $*"; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and edits $DAEMON_JSON)"
command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "the Docker engine is not reachable"

# 1. Packages (python3 edits daemon.json below; jq may not be there).
missing=()
command -v python3 >/dev/null || missing+=(python3-minimal)
for pkg in runsc crun; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
	say "installing ${missing[*]} from apt"
	export DEBIAN_FRONTEND=noninteractive
	apt-get -o DPkg::Lock::Timeout=300 update -qq || die "apt-get update failed"
	apt-get -o DPkg::Lock::Timeout=300 install -y -qq "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
fi
[ -x /usr/bin/runsc ] || die "/usr/bin/runsc missing after install"
[ -x /usr/bin/crun ] || die "/usr/bin/crun missing after install"

# 2. daemon.json: add the runtimes, keep everything else.
command -v python3 >/dev/null || die "python3 is needed to edit $DAEMON_JSON"
changed=$(DAEMON_JSON="$DAEMON_JSON" python3 - <<'EOF'
import json, os, sys
path = os.environ["DAEMON_JSON"]
try:
    with open(path) as f:
        text = f.read()
    cfg = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    cfg = {}
if not isinstance(cfg, dict):
    sys.exit(f"{path}: not a JSON object")
want = {
    "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--host-uds=open"]},
    "runsc-net": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host", "--host-uds=open"]},
    "crun": {"path": "/usr/bin/crun"},
}
runtimes = cfg.setdefault("runtimes", {})
if all(runtimes.get(k) == v for k, v in want.items()):
    print("no")
    sys.exit(0)
runtimes.update(want)
tmp = path + ".jetcrew.tmp"
with open(tmp, "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
print("yes")
EOF
) || die "could not update $DAEMON_JSON"

listed() {
	local info
	info=$(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}' 2>/dev/null) || return 1
	for r in "${WANT[@]}"; do
		[[ " $info " == *" $r "* ]] || return 1
	done
}

# 3. Reload (SIGHUP, never a restart) when the file changed or the engine
# does not list the runtimes yet, then poll until it does.
if [ "$changed" = yes ] || ! listed; then
	pid=$(pidof dockerd || pgrep -x dockerd) || die "dockerd is not running on this machine; register the runtimes in $DAEMON_JSON and reload it by hand"
	say "registered ${WANT[*]} in $DAEMON_JSON; reloading dockerd (SIGHUP to $pid)"
	kill -HUP $pid || die "could not signal dockerd"
	deadline=$((SECONDS + RUNTIMES_TIMEOUT))
	until listed; do
		[ $SECONDS -lt $deadline ] || die "dockerd did not list ${WANT[*]} within ${RUNTIMES_TIMEOUT}s after SIGHUP; see its log"
		sleep 0.5
	done
fi
say "runtimes ready: $(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}')"
