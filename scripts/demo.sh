#!/usr/bin/env bash
# demo.sh shows jetcrew end to end on this machine: it starts `jetcrew up`
# (an embedded NATS server and a worker) on a free loopback port with its
# data in a temporary directory, submits real runs to it, shows what they
# did, and stops it again.
#
# It needs a built jetcrew binary (default bin/jetcrew), a reachable Docker
# engine and the sandbox image (make images). `make demo` builds both first.
# The raw-publish part needs the nats CLI on PATH and is skipped without it.
#
# It exits 0 when every run behaved as expected, 1 otherwise.
#
# Environment:
#   JETCREW   jetcrew binary to run (default bin/jetcrew)
set -euo pipefail

JETCREW=${JETCREW:-bin/jetcrew}

if [[ -t 1 ]]; then bold=$'\033[1m' plain=$'\033[0m'; else bold= plain=; fi
say() { printf '\n%s==> %s%s\n' "$bold" "$*" "$plain"; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }

[[ -x "$JETCREW" ]] || die "$JETCREW is not an executable; build it with 'go build -o bin/jetcrew ./cmd/jetcrew' (or set JETCREW)"
JETCREW=$(cd "$(dirname "$JETCREW")" && pwd)/$(basename "$JETCREW")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/jetcrew-demo.XXXXXX")
up_pid=

# stop_up stops `jetcrew up` gracefully (SIGTERM), waits for it, and removes
# the temporary directory.
stop_up() {
	if [[ -n "$up_pid" ]] && kill -0 "$up_pid" 2>/dev/null; then
		kill -TERM "$up_pid" 2>/dev/null || true
		wait "$up_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap stop_up EXIT

say "starting: jetcrew up --listen 127.0.0.1:0 --data $tmp/data"
"$JETCREW" up --listen 127.0.0.1:0 --data "$tmp/data" >"$tmp/up.out" 2>"$tmp/up.log" &
up_pid=$!

# Wait for the NATS_URL line: up prints it once the server and the worker
# are ready.
NATS_URL=
for _ in $(seq 300); do
	NATS_URL=$(sed -n 's/^NATS_URL=//p' "$tmp/up.out")
	[[ -n "$NATS_URL" ]] && break
	if ! kill -0 "$up_pid" 2>/dev/null; then
		cat "$tmp/up.log" >&2
		die "jetcrew up exited before it was ready (log above)"
	fi
	sleep 0.1
done
[[ -n "$NATS_URL" ]] || { cat "$tmp/up.log" >&2; die "jetcrew up was not ready within 30s"; }
export NATS_URL
echo "jetcrew is up: NATS_URL=$NATS_URL"

failures=0
# check NAME WANT GOT: counts a failure when GOT differs from WANT.
check() {
	if [[ "$2" == "$3" ]]; then
		printf 'ok: %s\n' "$1"
	else
		printf 'FAIL: %s: want %q, got %q\n' "$1" "$2" "$3"
		failures=$((failures + 1))
	fi
}
# check_has NAME NEEDLE HAYSTACK: counts a failure when NEEDLE is missing.
check_has() {
	if [[ "$3" == *"$2"* ]]; then
		printf 'ok: %s\n' "$1"
	else
		printf 'FAIL: %s: %q not found in output\n' "$1" "$2"
		failures=$((failures + 1))
	fi
}

# submit_wait ARGS...: jetcrew submit --wait ARGS, its stdout shown and kept
# in $out, its exit code in $rc; its stderr (the run's, and a line per
# lifecycle event) passes through.
out=
rc=0
submit_wait() {
	rc=0
	out=$("$JETCREW" submit --wait "$@") || rc=$?
	printf '%s\n' "$out"
}

say "a run as a non-root user: uname -a; echo hello from \$(id -u)"
submit_wait 'uname -a; echo hello from $(id -u)'
check "exit code" 0 "$rc"
check_has "runs as uid 65532" "hello from 65532" "$out"

say "what the sandbox allows: capabilities, no_new_privs, a read-only /"
submit_wait '
grep -E "^(CapEff|NoNewPrivs):" /proc/self/status
if touch /probe 2>/dev/null; then echo "/ is writable"; else echo "/ is read-only"; fi
if touch /tmp/probe; then echo "/tmp is writable (tmpfs)"; fi'
check "exit code" 0 "$rc"
check_has "no effective capabilities" "0000000000000000" "$(grep CapEff <<<"$out" || true)"
check_has "no_new_privs is set" "1" "$(grep NoNewPrivs <<<"$out" || true)"
check_has "/ is read-only" "/ is read-only" "$out"

fail_id="demo-fail-$$"
say "a run that fails with exit code 3 (expected), id $fail_id"
submit_wait --id "$fail_id" --label demo=yes 'echo about to fail; echo "this goes to stderr" >&2; exit 3'
check "submit --wait exits with the run's exit code" 3 "$rc"
say "jetcrew status --json $fail_id"
state=$("$JETCREW" status --json "$fail_id")
printf '%s\n' "$state"
check_has "state is failed" '"state": "failed"' "$state"
check_has "exit code is recorded" '"exit_code": 3' "$state"

if command -v nats >/dev/null 2>&1; then
	raw_id="demo-raw-$$"
	request="{\"id\":\"$raw_id\",\"profile\":\"shell\",\"prompt\":\"echo hello from a raw publish\"}"
	say "a run published with the nats CLI: nats pub --jetstream jetcrew.runs.default '$request'"
	nats --server "$NATS_URL" pub --jetstream jetcrew.runs.default "$request"
	say "jetcrew watch $raw_id"
	rc=0
	out=$("$JETCREW" watch "$raw_id") || rc=$?
	printf '%s\n' "$out"
	check "exit code" 0 "$rc"
	check "output" "hello from a raw publish" "$out"
else
	say "skipping the raw publish: the nats CLI is not on PATH"
fi

say "stopping jetcrew up"
kill -TERM "$up_pid"
up_rc=0
wait "$up_pid" || up_rc=$?
up_pid=
check "jetcrew up stops cleanly on SIGTERM" 0 "$up_rc"

echo
if ((failures > 0)); then
	printf 'demo: %d check(s) failed; the log of jetcrew up follows\n' "$failures" >&2
	cat "$tmp/up.log" >&2
	exit 1
fi
echo "demo: every run behaved as expected"
