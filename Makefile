# jetcrew Makefile.
#
#   make demo    build everything, start NATS + a worker, submit real runs
#   make test    the whole test suite, Docker and NATS tests included
#   make check   the tests that need neither Docker nor chromium, in a minute
#   make bench   benchmarks against same-run baselines, into BENCHMARKS.md
#
# Every target does its own set-up: it builds the binaries and images and
# installs the NATS CLI where tests use it.

.DEFAULT_GOAL := build

# Make sure go (and tools installed with go install) are found even when the
# caller's PATH lacks them.
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin

# ---------------------------------------------------------------------------
# Images
#
# images builds the sandbox image run containers use. It needs a reachable
# Docker engine and apt (busybox-static, curl and its libraries,
# ca-certificates); no registry. It is a no-op when
# the image is already built from the current inputs (FORCE=1 rebuilds).
# ---------------------------------------------------------------------------

SANDBOX_IMAGE ?= jetcrew-sandbox:latest

.PHONY: images
images:
	SANDBOX_IMAGE='$(SANDBOX_IMAGE)' bash deploy/sandbox/build.sh

# ---------------------------------------------------------------------------
# Build, tools, test, demo
# ---------------------------------------------------------------------------

GO ?= go
NATS_CLI_VERSION := v0.5.0
BIN := bin
TEST_FLAGS ?=
TEST_TIMEOUT ?= 14m
# COMMIT is stamped into `jetcrew --version` and the bridge's MCP serverInfo
# version (else "dev").
COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo +dirty)

.PHONY: build
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.commit=$(COMMIT)" -o $(BIN)/jetcrew ./cmd/jetcrew
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(or $(COMMIT),dev)" -o $(BIN)/jetcrew-bridge ./cmd/jetcrew-bridge
	chmod 0555 $(BIN)/jetcrew-bridge

# tools installs the stock NATS CLI that tests and the README use, at the
# exact version we test against.
.PHONY: tools
tools:
	@if command -v nats >/dev/null 2>&1 && nats --version 2>&1 | grep -q '$(NATS_CLI_VERSION:v%=%)'; then \
		echo "nats CLI $(NATS_CLI_VERSION) present"; \
	else \
		echo "installing nats CLI $(NATS_CLI_VERSION)"; \
		$(GO) install github.com/nats-io/natscli/nats@$(NATS_CLI_VERSION); \
	fi

# chromium installs Debian's chromium package, which the web console's
# browser test (console/browser_test.go) drives headless with chromedp. It is
# a no-op when chromium is already installed; the test fails without it.
# The package lists are refreshed only when the install fails without; apt
# waits for another apt run's lock rather than failing.
.PHONY: chromium
chromium:
	@if command -v chromium >/dev/null 2>&1; then \
		echo "chromium present"; \
	else \
		echo "installing chromium (apt)"; \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		install="$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 install -y chromium"; \
		$$install || { $$SUDO apt-get -q -o DPkg::Lock::Timeout=600 update && $$install; }; \
	fi

# test runs every test: unit, NATS (embedded server), real Docker tests and
# the console's real-browser test, every package under the race detector.
# Docker tests fail, never skip, when the engine is unreachable; the browser
# test fails when chromium is missing. One go test runs every package, the
# end-to-end ones (tests/, bench/, console/) named first so that the longest,
# tests/ (about 7 of the suite's minutes, mostly waiting on containers),
# starts at once and the unit packages fill the cores beside it (two runs of
# go test, one after the other, took 705 s where one takes less: issue 37).
# The gVisor suite (tests/gvisor_test.go) runs when the engine has the
# "runsc" runtime (scripts/install-runtimes.sh registers it; .ci/run always
# does, and sets JETCREW_REQUIRE_GVISOR=1 so that a missing runsc fails);
# otherwise it is skipped and gvisor-status says so plainly, before and
# after the tests.
UNIT_PKGS = $(shell $(GO) list ./... | grep -v -e '/tests' -e '/bench' -e '/console')
E2E_PKGS = ./tests/... ./bench/... ./console/...

.PHONY: test
test: tools images build agent-images chromium
	$(GO) vet ./...
	@$(MAKE) --no-print-directory gvisor-status
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(TEST_FLAGS) $(E2E_PKGS) $(UNIT_PKGS)
	@$(MAKE) --no-print-directory gvisor-status

# check is the edit-test loop: vet and every test that needs neither Docker
# nor chromium (the unit, NATS and fake-runtime tests, the layer check),
# without the race detector, in about a minute on two cores (57–71 s on a
# quiet machine with a warm build cache): four packages and eight of a
# package's parallel tests at once, since most of them wait on NATS or the
# fake runtime's timers rather than compute. `make test` stays the whole
# suite.
.PHONY: check
check:
	$(GO) vet ./...
	JETCREW_SKIP_DOCKER=1 $(GO) test -count=1 -p 4 -parallel 8 -skip 'TestBrowser' $(UNIT_PKGS) ./console/...

# gvisor-status prints whether the engine offers runsc, so the gVisor suite
# runs, or does NOT run.
.PHONY: gvisor-status
gvisor-status:
	@if docker info --format '{{range $$k, $$v := .Runtimes}}{{$$k}} {{end}}' 2>/dev/null | tr ' ' '\n' | grep -qx runsc; then \
		echo "gVisor suite: the engine has runsc, so the gVisor tests (tests/gvisor_test.go) run"; \
	else \
		echo "*** gVisor suite DID NOT RUN: the Docker engine has no runsc runtime; only the runc suite runs. Run scripts/install-runtimes.sh as root (docs/jail.md) ***"; \
	fi

# test-race runs the unit half of test alone.
.PHONY: test-race
test-race: tools images
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(UNIT_PKGS)

.PHONY: demo
demo: tools images build agent-images
	bash scripts/demo.sh $(BIN)/jetcrew

.PHONY: clean
clean:
	rm -rf $(BIN) .jetcrew

# ---------------------------------------------------------------------------
# Jail test image
#
# testimage builds jetcrew-testimg:latest, the image tests/jail_test.go runs
# its jailed processes in: the sandbox image's busybox plus /bin/suidprobe, a
# static Go program installed setuid root (deploy/testimage). The jail tests
# build it themselves when it is missing or stale; this target builds it by
# hand. It needs Docker and Go, no registry and no network; it is a no-op when
# the image is up to date (FORCE=1 rebuilds).
# ---------------------------------------------------------------------------

TEST_IMAGE ?= jetcrew-testimg:latest

.PHONY: testimage
testimage: images
	TEST_IMAGE='$(TEST_IMAGE)' SANDBOX_IMAGE='$(SANDBOX_IMAGE)' GO='$(GO)' bash deploy/testimage/build.sh

# ---------------------------------------------------------------------------
# Agents test image
#
# agent-images builds jetcrew-agents:latest, the image the coordination tests
# (tests/coord_test.go) and the demo run agents in: the sandbox image's
# busybox plus /usr/local/bin/mcp-agent, the fixture MCP client
# (tests/fixtures/agent), static. The tests build it themselves when it is
# missing or stale; `make test` and `make demo` build it first. It needs
# Docker and Go, no registry; it is a no-op when the image is up to date
# (FORCE=1 rebuilds).
# ---------------------------------------------------------------------------

AGENTS_IMAGE ?= jetcrew-agents:latest

.PHONY: agent-images
agent-images: images
	AGENTS_IMAGE='$(AGENTS_IMAGE)' SANDBOX_IMAGE='$(SANDBOX_IMAGE)' GO='$(GO)' bash deploy/agents/build.sh

# ---------------------------------------------------------------------------
# Scale-out deployment images
#
# deploy-images builds, from scratch and from our own static binaries (no
# registry): jetcrew-nats:v2.15.2 (nats-server, built with go install into
# bin/nats-server, and deploy/nats/cluster.conf) and jetcrew-worker:latest
# (bin/jetcrew + bin/jetcrew-bridge), for deploy/compose/docker-compose.yml.
# docs/deploy.md has the rest (host set-up, systemd units).
# ---------------------------------------------------------------------------

.PHONY: deploy-images
deploy-images: build
	BIN='$(BIN)' GO='$(GO)' bash deploy/compose/build-images.sh

# ---------------------------------------------------------------------------
# Benchmarks
#
# bench measures throughput, start latency, coordination round trips, worker
# memory and scaling, each against a baseline measured in the same run, and
# writes bench/results.json and the results table of BENCHMARKS.md; CPU
# profiles of the hot paths go to bench/*.prof. The benchmarks are tests
# behind the build tag "bench" (bench/), so `make test` never runs them. They
# need Docker and take about 5 minutes on 2 cores; the OCI runtime comparison
# (bench/runtimes_test.go) needs runsc registered (scripts/install-runtimes.sh)
# and says so when it is not.
# ---------------------------------------------------------------------------

BENCH_TIMEOUT ?= 15m

.PHONY: bench
bench: images build
	$(GO) test -tags bench -count=1 -timeout $(BENCH_TIMEOUT) -v ./bench
