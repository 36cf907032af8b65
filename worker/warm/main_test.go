package warm_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/jetcrew/jetcrew/internal/leaktest"
)

// TestMain fails the package's tests when a goroutine outlives them: a
// pool's background work and every container's watch end with Stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Known()...)
}
