package console

import (
	"context"
	"sync"
	"time"
)

// memoMaxAge is how long one read of what many pages show (the queue's
// requests, the open questions) serves them: however many pages are open,
// the console reads it at most once per memoMaxAge.
const memoMaxAge = time.Second

// memoReadTimeout bounds one such read.
const memoReadTimeout = 3 * time.Second

// memo is the latest read of something every open page shows.
// It reads again once its read is memoMaxAge old or forgotten, and keeps
// why a read failed. The zero value is ready; the value it holds is
// shared, read only.
type memo[T any] struct {
	mu  sync.Mutex
	at  time.Time
	v   T
	err error
}

// get returns the latest read, reading it with read (its context bounded
// by memoReadTimeout) when it is memoMaxAge old or was forgotten. Callers
// wait for one another's read.
func (m *memo[T]) get(ctx context.Context, read func(context.Context) (T, error)) (T, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if time.Since(m.at) >= memoMaxAge {
		rctx, cancel := context.WithTimeout(ctx, memoReadTimeout)
		m.v, m.err = read(rctx)
		cancel()
		m.at = time.Now()
	}
	return m.v, m.err
}

// forget makes the next get read again.
func (m *memo[T]) forget() {
	m.mu.Lock()
	m.at = time.Time{}
	m.mu.Unlock()
}
