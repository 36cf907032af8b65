# jetcrew Makefile.

# Make sure go (and tools installed with go install) are found even when the
# caller's PATH lacks them.
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin

# ---------------------------------------------------------------------------
# Images
#
# images builds the sandbox image run containers use. It needs a reachable
# Docker engine and apt (for busybox-static); no registry. It is a no-op when
# the image is already built from the current inputs (FORCE=1 rebuilds).
# ---------------------------------------------------------------------------

SANDBOX_IMAGE ?= jetcrew-sandbox:latest

.PHONY: images
images:
	SANDBOX_IMAGE='$(SANDBOX_IMAGE)' bash deploy/sandbox/build.sh

# ---------------------------------------------------------------------------
