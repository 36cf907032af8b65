package worker_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/jetcrew/jetcrew/internal/leaktest"
)

// TestMain fails the package's tests when a goroutine outlives them: every
// service, run, watchdog and container stop the worker starts must end by
// the time Stop returns (and each test's server and connection are closed
// by its cleanup).
//
// The goroutines of nats.go and nats-server that leaktest.Known names are
// let through.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Known()...)
}
