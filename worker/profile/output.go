package profile

// DefaultMaxOutputMiB is a profile's default output budget (max_output_mib):
// the most bytes of stdout and stderr together, in MiB, a run publishes as
// output events. Past it the run goes on, its output is counted
// (RunState.OutputDroppedBytes) and dropped.
const DefaultMaxOutputMiB = 64

// MaxOutputBytes returns the profile's output budget in bytes; 0 means
// unlimited (max_output_mib = -1).
func (p Profile) MaxOutputBytes() int64 {
	if p.MaxOutputMiB < 0 {
		return 0
	}
	return p.MaxOutputMiB << 20
}
