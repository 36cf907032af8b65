package workertest

import (
	"bufio"
	"bytes"
	"context"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
)

// labelKey is the goroutine label Label sets: the test's name.
const labelKey = "jetcrew-test"

// Label runs f with the goroutine label jetcrew-test=<the test's name>.
// Every goroutine started while f runs, and every goroutine those start,
// carries the label (goroutines inherit their creator's labels), so
// Parked can tell a worker started in f from the workers of the tests
// running beside this one in the same process.
func Label(t testing.TB, f func()) {
	t.Helper()
	pprof.Do(context.Background(), pprof.Labels(labelKey, t.Name()), func(context.Context) { f() })
}

// Parked returns how many goroutines started under Label(t, ...) are
// parked in a select or a channel operation written in function fn (its
// full name as a stack trace prints it, such as
// "github.com/jetcrew/jetcrew/worker/stage/tree.(*gitFlight).acquireFetch").
// A test polls it to learn that the code under test has reached a wait it
// does not expose (every run waits for a shared resolution, say) instead
// of sleeping and hoping; a wrong name never matches, so the poll fails
// rather than passes.
func Parked(t testing.TB, fn string) int {
	t.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		t.Fatalf("goroutine profile: %v", err)
	}
	// debug=1 groups identical stacks: "<count> @ <pc> <pc> ...", then
	// "# labels: {...}" when the goroutines have labels, then the frames
	// without the runtime's; records end with a blank line.
	labels := "# labels: {" + strconv.Quote(labelKey) + ":" + strconv.Quote(t.Name()) + "}"
	n := 0
	sc := bufio.NewScanner(&buf)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var count int
	var pcs []uintptr
	for sc.Scan() {
		line := sc.Text()
		if c, stack, ok := strings.Cut(line, " @ "); ok {
			count, pcs = 0, pcs[:0]
			if v, err := strconv.Atoi(c); err == nil {
				count = v
			}
			for f := range strings.FieldsSeq(stack) {
				if pc, err := strconv.ParseUint(f, 0, 64); err == nil {
					pcs = append(pcs, uintptr(pc))
				}
			}
			continue
		}
		if line == labels && parkedIn(pcs, fn) {
			n += count
		}
	}
	return n
}

// parkedIn reports whether the stack pcs (innermost first, return PCs) is
// that of a goroutine parked by a select or a channel operation whose
// innermost frame outside the runtime is fn.
func parkedIn(pcs []uintptr, fn string) bool {
	frames := runtime.CallersFrames(pcs)
	var names []string
	for {
		f, more := frames.Next()
		names = append(names, f.Function)
		if !strings.HasPrefix(f.Function, "runtime.") || !more {
			break
		}
	}
	if len(names) < 3 || names[0] != "runtime.gopark" || names[len(names)-1] != fn {
		return false
	}
	op := names[len(names)-2]
	return op == "runtime.selectgo" || strings.HasPrefix(op, "runtime.chanrecv") || strings.HasPrefix(op, "runtime.chansend")
}
