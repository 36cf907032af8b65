package coordination_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/jetcrew/jetcrew/internal/leaktest"
)

// TestMain fails the package's tests when a goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Known()...)
}
