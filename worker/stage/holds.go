package stage

import (
	"strings"
	"sync"
)

// Holds counts what the worker's live runs hold, by key: directories,
// volumes, cached snapshots, staged binaries (each stage names its keys,
// "volume:<name>", "dir:<path>", ...). It is the one registry the
// reconciler and the stages' sweepers consult before they remove
// anything. Safe for concurrent use; the zero value is ready.
type Holds struct {
	mu sync.Mutex
	n  map[string]int
}

// Hold counts one more holder of key and returns the function that gives
// it up (safe to call more than once).
func (h *Holds) Hold(key string) (release func()) {
	h.mu.Lock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	h.n[key]++
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			if h.n[key]--; h.n[key] <= 0 {
				delete(h.n, key)
			}
			h.mu.Unlock()
		})
	}
}

// Held reports whether any live run holds key.
func (h *Holds) Held(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[key] > 0
}

// IfUnheld calls f, holding the registry's lock, when no live run holds
// key, and reports whether it did: a sweeper removes what it checked
// before a run can take it (Hold waits meanwhile).
func (h *Holds) IfUnheld(key string, f func()) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n[key] > 0 {
		return false
	}
	f()
	return true
}

// Keys returns the held keys that start with prefix, the prefix removed.
func (h *Holds) Keys(prefix string) map[string]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]bool{}
	for k := range h.n {
		if rest, ok := strings.CutPrefix(k, prefix); ok {
			out[rest] = true
		}
	}
	return out
}
