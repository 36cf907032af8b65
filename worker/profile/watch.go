package profile

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// WatchConfig is the profile facet the worker's watch of a run reads.
//
// The runner reads its timeout, output budget and retries, the stall stage
// its stall timeout; a warm container takes all of it from its run.
type WatchConfig struct {
	// StallTimeout stops a run that shows no progress (no output, no
	// coordination traffic) for this long, ending it "stalled"; a Go
	// duration string. Default: 10m for agent backends, off for command.
	StallTimeout string `toml:"stall_timeout" json:"stall_timeout,omitempty"`
	// Timeout is the default run timeout, a Go duration string. Empty means
	// the worker's default.
	Timeout string `toml:"timeout" json:"timeout,omitempty"`
	// Retries is how many times a run whose process exits non-zero (not
	// OOM-killed, not stopped by a watchdog) is tried again, with backoff,
	// before it ends failed; bounded by the consumer's max deliver. Default
	// 0: an agent's failure is final.
	Retries int `toml:"retries" json:"retries,omitempty"`
	// MaxOutputMiB is the run's output budget: the most bytes of stdout and
	// stderr together, in MiB, published as output events. Past it the run
	// goes on and its output is counted (RunState.OutputDroppedBytes) and
	// dropped. Default DefaultMaxOutputMiB (64); -1 means unlimited.
	MaxOutputMiB int64 `toml:"max_output_mib" json:"max_output_mib"`

	timeout      time.Duration
	stallTimeout time.Duration
}

// DefaultMaxOutputMiB is a profile's default output budget (max_output_mib):
// the most bytes of stdout and stderr together, in MiB, a run publishes as
// output events. Past it the run goes on, its output is counted
// (RunState.OutputDroppedBytes) and dropped.
const DefaultMaxOutputMiB = 64

// defaultStallTimeout is the stall timeout of an agent backend's runs; the
// command backend's default is off.
const defaultStallTimeout = 10 * time.Minute

// resolve applies the watch's defaults (the stall timeout's by backend)
// and parses its durations.
func (w *WatchConfig) resolve(backend string) error {
	w.MaxOutputMiB = cmp.Or(w.MaxOutputMiB, DefaultMaxOutputMiB)
	stallDefault := defaultStallTimeout
	if backend == BackendCommand {
		stallDefault = 0
	}
	var err error
	if w.timeout, err = parseDuration("timeout", w.Timeout, 0); err != nil {
		return err
	}
	w.stallTimeout, err = parseDuration("stall_timeout", w.StallTimeout, stallDefault)
	return err
}

// validate checks the watch: durations not negative, retries 0 to 10, an
// output budget positive or -1.
func (w WatchConfig) validate() error {
	if w.Retries < 0 || w.Retries > 10 {
		return fmt.Errorf("retries %d must be between 0 and 10", w.Retries)
	}
	if w.stallTimeout < 0 {
		return errors.New("stall_timeout and bridge_deadline must not be negative")
	}
	if w.timeout < 0 {
		return errors.New("timeout is negative")
	}
	if w.MaxOutputMiB < -1 {
		return fmt.Errorf("max_output_mib %d must be positive, or -1 for unlimited", w.MaxOutputMiB)
	}
	return nil
}

// TimeoutDuration returns the profile's run timeout (the timeout key).
// 0 means the worker's default.
func (w WatchConfig) TimeoutDuration() time.Duration { return w.timeout }

// StallTimeoutDuration returns the stall watchdog's bound; 0 means off.
// It is the stall_timeout key, or its backend's default: 10 minutes for
// agent CLIs, off for the command backend.
func (w WatchConfig) StallTimeoutDuration() time.Duration { return w.stallTimeout }

// MaxOutputBytes returns the profile's output budget in bytes; 0 means
// unlimited (max_output_mib = -1).
func (w WatchConfig) MaxOutputBytes() int64 {
	if w.MaxOutputMiB < 0 {
		return 0
	}
	return w.MaxOutputMiB << 20
}
