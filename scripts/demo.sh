#!/usr/bin/env bash
# demo.sh shows jetcrew end to end on this machine: it starts `jetcrew up`
# (an embedded NATS server and a worker) on a free loopback port with its
# data in a temporary directory, submits real runs to it, shows what they
# did, and stops it again.
#
# It needs a built jetcrew binary (default bin/jetcrew) with jetcrew-bridge
# beside it, a reachable Docker engine and the sandbox image (make images).
# The coordination part needs the agents image (make agent-images) and is
# skipped without it: two runs of one group exchange messages through their
# MCP bridges, and an operator's message sent with the nats CLI reaches
# them. The raw-publish and operator parts need the nats CLI on PATH and are
# skipped without it. `make demo` builds and installs all of these first.
#
# It exits 0 when every run behaved as expected, 1 otherwise.
#
# Environment:
#   JETCREW        jetcrew binary to run (default bin/jetcrew)
#   AGENTS_IMAGE   image of the coordination agents (default jetcrew-agents:latest)
set -euo pipefail

JETCREW=${JETCREW:-bin/jetcrew}
AGENTS_IMAGE=${AGENTS_IMAGE:-jetcrew-agents:latest}

if [[ -t 1 ]]; then bold=$'\033[1m' plain=$'\033[0m'; else bold= plain=; fi
say() { printf '\n%s==> %s%s\n' "$bold" "$*" "$plain"; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }

[[ -x "$JETCREW" ]] || die "$JETCREW is not an executable; build it with 'go build -o bin/jetcrew ./cmd/jetcrew' (or set JETCREW)"
JETCREW=$(cd "$(dirname "$JETCREW")" && pwd)/$(basename "$JETCREW")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/jetcrew-demo.XXXXXX")
up_pid=
sub_pid=

# stop_up stops the demo's `nats sub` and `jetcrew up` (gracefully:
# SIGTERM), waits for them, and removes the temporary directory.
stop_up() {
	if [[ -n "$sub_pid" ]] && kill -0 "$sub_pid" 2>/dev/null; then
		kill -TERM "$sub_pid" 2>/dev/null || true
		wait "$sub_pid" 2>/dev/null || true
	fi
	if [[ -n "$up_pid" ]] && kill -0 "$up_pid" 2>/dev/null; then
		kill -TERM "$up_pid" 2>/dev/null || true
		wait "$up_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap stop_up EXIT

have_nats=0
command -v nats >/dev/null 2>&1 && have_nats=1
have_agents=0
docker image inspect "$AGENTS_IMAGE" >/dev/null 2>&1 && have_agents=1

# The profile file adds "agent" (the fixture MCP client of the agents image)
# to the built-in shell profile.
cat >"$tmp/profiles.toml" <<TOML
[profiles.agent]
image   = "$AGENTS_IMAGE"
command = ["/usr/local/bin/mcp-agent", "{prompt}"]
timeout = "3m"

[profiles.claude]
backend = "claude"
image   = "$AGENTS_IMAGE"
timeout = "3m"
TOML

say "starting: jetcrew up --listen 127.0.0.1:0 --data $tmp/data --profiles $tmp/profiles.toml"
# The files exist before the loop below reads them: the background
# process's own redirections may not have created them yet.
: >"$tmp/up.out"
: >"$tmp/up.log"
"$JETCREW" up --listen 127.0.0.1:0 --data "$tmp/data" --profiles "$tmp/profiles.toml" >"$tmp/up.out" 2>"$tmp/up.log" &
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

if ((have_nats)); then
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

if command -v git >/dev/null 2>&1; then
	ws_id="demo-ws-$$"
	repo="$tmp/myrepo"
	say "a workspace run: a git repository in, its changes out (run $ws_id)"
	mkdir -p "$repo"
	g() { git -C "$repo" -c user.name=demo -c user.email=demo@localhost "$@"; }
	g init -q -b main
	printf 'package main\n\nfunc main() { println("foo") }\n' >"$repo/main.go"
	g add main.go
	g commit -qm "hello foo"
	echo "cd $repo; jetcrew submit --workspace . --wait 'sed -i s/foo/bar/ main.go'"
	rc=0
	out=$(cd "$repo" && "$JETCREW" submit --id "$ws_id" --workspace . --wait \
		'sed -i s/foo/bar/ main.go; mkdir -p .jetcrew/artifacts; echo "all good" >.jetcrew/artifacts/report.txt') || rc=$?
	check "exit code" 0 "$rc"
	say "jetcrew result $ws_id"
	"$JETCREW" result "$ws_id"
	say "jetcrew diff $ws_id"
	diff_out=$("$JETCREW" diff "$ws_id")
	printf '%s\n' "$diff_out"
	check_has "the diff has the run's change" '+func main() { println("bar") }' "$diff_out"
	say "jetcrew apply $ws_id (in $repo)"
	(cd "$repo" && "$JETCREW" apply "$ws_id")
	check "the current branch is untouched" main "$(g branch --show-current)"
	check "the work tree is untouched" "" "$(g status --porcelain)"
	say "git log --oneline jetcrew/$ws_id"
	g log --oneline "jetcrew/$ws_id"
	check_has "branch jetcrew/$ws_id has the change" 'println("bar")' "$(g show "jetcrew/$ws_id:main.go")"
	say "jetcrew artifacts $ws_id --get report.txt"
	check "the artifact" "all good" "$("$JETCREW" artifacts "$ws_id" --get report.txt)"
else
	say "skipping the workspace run: git is not on PATH"
fi

# wait_state ID STATE: waits up to 60s for run ID to reach STATE.
wait_state() {
	for _ in $(seq 600); do
		if "$JETCREW" status --json "$1" 2>/dev/null | grep -q "\"state\": \"$2\""; then
			return 0
		fi
		sleep 0.1
	done
	return 1
}

if ((have_agents)); then
	group="demo-crew-$$"
	alice="demo-alice-$$"
	bob="demo-bob-$$"
	# Each agent: wait for the other run of its group to appear, say hello
	# through the bridge (send), read the other's hello (inbox), then, when
	# the nats CLI is here, wait for the operator and answer them.
	script='wait-peers 1 60s; send @peer "hello from @self"; expect-from @peer 60s'
	if ((have_nats)); then
		script+='; expect-from operator 60s; send operator "thanks, @self is done"'
	fi
	say "coordination: runs $alice and $bob of group $group talk through their MCP bridges"
	echo "image $AGENTS_IMAGE, profile agent: /usr/local/bin/mcp-agent '<script>'"
	echo "script: $script"
	if ((have_nats)); then
		echo "the operator watches the group: nats sub 'jetcrew.coord.default.$group.>'"
		nats --server "$NATS_URL" sub "jetcrew.coord.default.$group.>" >"$tmp/conversation.out" 2>"$tmp/conversation.err" &
		sub_pid=$!
		for _ in $(seq 100); do
			grep -q "Subscribing on" "$tmp/conversation.err" 2>/dev/null && break
			sleep 0.1
		done
	fi
	"$JETCREW" submit --profile agent --group "$group" --id "$alice" "$script" >/dev/null
	"$JETCREW" submit --profile agent --group "$group" --id "$bob" "$script" >/dev/null
	if ((have_nats)); then
		ok=1
		wait_state "$alice" running && wait_state "$bob" running || ok=0
		check "both runs are running" 1 "$ok"
		for id in "$alice" "$bob"; do
			say "an operator message with the nats CLI: nats pub jetcrew.coord.default.$group.$id.operator 'hi $id, this is the operator'"
			nats --server "$NATS_URL" pub "jetcrew.coord.default.$group.$id.operator" "hi $id, this is the operator"
		done
	fi
	for pair in "$alice:$bob" "$bob:$alice"; do
		id=${pair%%:*} peer=${pair#*:}
		say "jetcrew watch $id (stderr: what the agent did; stdout: its JSON report, in $tmp/$id.json)"
		rc=0
		"$JETCREW" watch "$id" >"$tmp/$id.json" 2>"$tmp/$id.err" || rc=$?
		grep -v '^time=' "$tmp/$id.err" || true
		check "exit code" 0 "$rc"
		log=$(cat "$tmp/$id.err")
		check_has "$id received $peer's hello, sent by $peer (the worker stamps the sender)" "from $peer to $id: hello from $peer" "$log"
		if ((have_nats)); then
			check_has "$id received the operator's message, from operator" "from operator to $id: hi $id, this is the operator" "$log"
		fi
		check_has "$id ran as uid 65532" "running as uid 65532 gid 65532" "$log"
		check_has "/run/jetcrew/mcp.json is mode 0444 inside" "/run/jetcrew/mcp.json: file, mode 0444" "$log"
		check_has "/run/jetcrew and /opt/jetcrew/bridge are read-only mounts" "mounts: /run/jetcrew ro, /opt/jetcrew/bridge ro" "$log"
		check_has "its own bridge.sock is the only socket it sees, and no Docker socket" "sockets in the filesystem: /run/jetcrew/bridge.sock; docker sockets: none" "$log"
		check_has "its JSON report is on stdout" '"mode": "mcp-agent"' "$(cat "$tmp/$id.json")"
		state=$("$JETCREW" status --json "$id")
		check_has "state: coordination available" '"coordination": "available"' "$state"
		check_has "state: the bridge connected" '"bridge_connected": true' "$state"
	done
	if ((have_nats)); then
		sleep 0.5 # let the last message reach the subscriber
		kill -TERM "$sub_pid" 2>/dev/null || true
		wait "$sub_pid" 2>/dev/null || true
		sub_pid=
		say "what the operator's nats sub 'jetcrew.coord.default.$group.>' saw"
		cat "$tmp/conversation.out"
		conversation=$(cat "$tmp/conversation.out")
		check_has "the operator saw $alice's hello, from $alice" "$(printf 'Jetcrew-From: %s\n\nhello from %s' "$alice" "$alice")" "$conversation"
		check_has "the operator saw $bob's answer to them" "thanks, $bob is done" "$conversation"
	fi
else
	say "skipping coordination: image $AGENTS_IMAGE is missing (make agent-images builds it)"
fi

if ((have_agents)) && [[ -n "${repo:-}" ]]; then
	fu_a="demo-claude-$$"
	fu_b="demo-followup-$$"
	say "a follow-up: run $fu_a (the agents image's fixture claude CLI) edits main.go; jetcrew followup $fu_b resumes its session"
	echo "cd $repo; jetcrew submit --profile claude --workspace . --wait 'Make main say hello.'"
	rc=0
	(cd "$repo" && "$JETCREW" submit --id "$fu_a" --profile claude --workspace . --wait -q \
		$'Make main say hello.\nfixture: write main.go package main // hello' >/dev/null) || rc=$?
	check "exit code" 0 "$rc"
	echo "jetcrew followup --wait $fu_a 'Now check main.go.'   # profile claude, from $fu_a's tree and session"
	rc=0
	"$JETCREW" followup --id "$fu_b" --wait -q "$fu_a" $'Now check main.go.\nfixture: cat main.go' >/dev/null || rc=$?
	check "exit code" 0 "$rc"
	state=$("$JETCREW" status --json "$fu_b")
	printf '%s\n' "$state" | grep -E '"(result|resumed|id|from)":' | sed 's/^ *//'
	check_has "the follow-up saw $fu_a's edit" 'main.go=package main // hello' "$state"
	check_has "the follow-up's claude resumed $fu_a's session" 'resumed (1 earlier turns)' "$state"
	check_has "state: session resumed" '"resumed": true' "$state"
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
