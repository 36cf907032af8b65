package main

import (
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/pflag"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
)

// streamCapFlags are the byte caps of jetcrew's streams, in MiB (-1: no
// cap), and JETCREW_RUNS' other limits, flags of `up` and `worker`.
type streamCapFlags struct {
	runsMiB, eventsMiB, failedMiB int64
	runsMaxAge                    time.Duration
	runsPerPool                   int64
}

func (f *streamCapFlags) add(fs *pflag.FlagSet) {
	fs.Int64Var(&f.runsMiB, "runs-max-mib", worker.DefaultRunsMaxBytes>>20,
		"byte cap of JETCREW_RUNS in MiB; when full, submits are refused and no queued request is lost (-1: no cap)")
	fs.Int64Var(&f.eventsMiB, "events-max-mib", worker.DefaultEventsMaxBytes>>20,
		"byte cap of JETCREW_EVENTS (run events and output) in MiB; when full, the oldest events go first (-1: no cap)")
	fs.Int64Var(&f.failedMiB, "failed-max-mib", worker.DefaultFailedMaxBytes>>20,
		"byte cap of JETCREW_FAILED (dead letters) in MiB; when full, the oldest go first (-1: no cap)")
	fs.DurationVar(&f.runsMaxAge, "runs-max-age", worker.DefaultRunsMaxAge,
		"how long a request stays in JETCREW_RUNS, taken or not: requests for a pool no worker serves are removed then; at least 24h, and longer than a request may wait plus all its attempts (every worker must use the same)")
	fs.Int64Var(&f.runsPerPool, "runs-max-per-pool", worker.DefaultRunsMaxPerPool,
		"most requests one pool holds in JETCREW_RUNS, queued and running; past it a submit to the pool is refused, none is dropped; keep it above the pool's total --concurrency (-1: no limit; every worker must use the same)")
}

// check refuses a cap of 0 or below -1.
func (f streamCapFlags) check() error {
	for _, c := range []struct {
		name string
		v    int64
	}{{"--runs-max-mib", f.runsMiB}, {"--events-max-mib", f.eventsMiB}, {"--failed-max-mib", f.failedMiB}} {
		if c.v == 0 || c.v < -1 {
			return usageError(fmt.Errorf("%s %d: must be positive, or -1 for no cap", c.name, c.v))
		}
	}
	if f.runsPerPool == 0 || f.runsPerPool < -1 {
		return usageError(fmt.Errorf("--runs-max-per-pool %d: must be positive, or -1 for no limit", f.runsPerPool))
	}
	if f.runsMaxAge < messages.MaxTimeout {
		return usageError(fmt.Errorf("--runs-max-age %s: must be at least %s, the longest run timeout a request may ask for (a request removed while it runs is not redelivered)", f.runsMaxAge, messages.MaxTimeout))
	}
	return nil
}

// apply sets the caps, in bytes, and the limits on pc.
func (f streamCapFlags) apply(pc *worker.ProvisionConfig) {
	bytes := func(mib int64) int64 {
		if mib < 0 {
			return -1
		}
		return mib << 20
	}
	pc.RunsMaxBytes, pc.EventsMaxBytes, pc.FailedMaxBytes = bytes(f.runsMiB), bytes(f.eventsMiB), bytes(f.failedMiB)
	pc.RunsMaxAge, pc.RunsMaxPerPool = f.runsMaxAge, f.runsPerPool
}

// defaultStoreMaxMiB is `jetcrew up`'s default --store-max-mib: room for
// every stream at its default cap (1.75 GiB together) and the buckets.
const defaultStoreMaxMiB = 4096

// embeddedServerOptions returns the options of `jetcrew up`'s embedded
// nats-server: JetStream with file storage under dataDir, limited to
// storeMiB MiB on disk (JetStreamMaxStore).
func embeddedServerOptions(host string, port int, dataDir string, storeMiB int64) *server.Options {
	return &server.Options{
		ServerName:        "jetcrew",
		Host:              host,
		Port:              port,
		JetStream:         true,
		StoreDir:          dataDir,
		JetStreamMaxStore: storeMiB << 20,
		NoSigs:            true,
	}
}
