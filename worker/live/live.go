// Package live is the worker's one registry of what is live on its host:
// runs in flight, containers, volumes, directories, cached snapshots,
// staged binaries, warm containers and what is made beside them, each held
// under a key by an owner (a run, the warm pool, the worker). Whatever
// removes something the worker made asks it first: the reconciler ("is it
// held here? is the owner on its label alive?") and the stages' sweepers
// ("does a live run hold it?").
//
// The model is Kubernetes' owner references, kept in memory: an owner
// holds what it makes from before it makes it until after it removes it.
// The package imports nothing of the module.
package live

import (
	"strings"
	"sync"
)

// Owner names who holds a key: a run, the warm pool or the worker.
type Owner string

const (
	// Worker owns what the worker holds for itself or for runs to share:
	// staged binaries, cached snapshots, a git fetch's file.
	Worker Owner = "worker"
	// Pool owns the warm pool's containers until a run takes one over.
	// What is made beside one (its directory, its workspace) is the
	// pool's too.
	Pool Owner = "pool"
)

// Run returns the owner of what the run with this id holds.
func Run(id string) Owner { return Owner("run:" + id) }

// Prefixes of the keys the reconciler asks about: a key is its prefix
// followed by the name. Stages name their other keys themselves
// ("ws-dir:<path>", "bridge:<digest>", ...).
const (
	// RunKey prefixes a run id: a delivery of the run is in flight here.
	// What is labelled with the run's id and this worker's is held with
	// it (the delivery removes an earlier attempt's leftovers itself).
	RunKey = "run:"
	// ContainerKey prefixes a container's id, or its name before the
	// engine gives one.
	ContainerKey = "container:"
	// VolumeKey prefixes the name of a volume a run or the pool uses.
	VolumeKey = "volume:"
)

// Registry records which owner holds each key on this worker. Safe for
// concurrent use; the zero value is ready.
type Registry struct {
	mu sync.Mutex
	// held counts the holds of each key, by owner.
	held map[string]map[Owner]int
	// registered are the owners that hold everything of their own they
	// make (Register).
	registered map[Owner]bool
}

// Hold counts one more hold of key by owner and returns its release. The
// release is safe to call more than once.
func (r *Registry) Hold(owner Owner, key string) (release func()) {
	r.mu.Lock()
	if r.held == nil {
		r.held = map[string]map[Owner]int{}
	}
	if r.held[key] == nil {
		r.held[key] = map[Owner]int{}
	}
	r.held[key][owner]++
	r.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { r.release(owner, key) }) }
}

// release gives up one hold of key by owner.
func (r *Registry) release(owner Owner, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	by := r.held[key]
	if by[owner]--; by[owner] <= 0 {
		delete(by, owner)
	}
	if len(by) == 0 {
		delete(r.held, key)
	}
}

// Held reports whether any owner holds any of keys, under one lock. A
// container a run takes over from the pool (the run holds its id before
// the pool lets its name go) is held throughout.
func (r *Registry) Held(keys ...string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		if len(r.held[k]) > 0 {
			return true
		}
	}
	return false
}

// HeldBy reports whether owner itself holds key, whoever else holds it.
func (r *Registry) HeldBy(owner Owner, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held[key][owner] > 0
}

// IfUnheld calls f under the registry's lock when nobody holds key. It
// reports whether it did: a sweeper removes what it checked before an
// owner can take it (Hold waits meanwhile).
func (r *Registry) IfUnheld(key string, f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.held[key]) > 0 {
		return false
	}
	f()
	return true
}

// Keys returns the held keys that start with prefix, the prefix removed.
func (r *Registry) Keys(prefix string) map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]bool{}
	for k := range r.held {
		if rest, ok := strings.CutPrefix(k, prefix); ok {
			out[rest] = true
		}
	}
	return out
}

// Register records that owner holds everything of its own it makes here.
// It holds each from before it makes it until after it removes it, for
// the registry's life: what a label says is owner's on this worker but owner does not
// hold is an orphan at once, whatever its age (the warm pool registers;
// what its earlier process left is found when the worker starts).
func (r *Registry) Register(owner Owner) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.registered == nil {
		r.registered = map[Owner]bool{}
	}
	r.registered[owner] = true
}

// Registered reports whether owner registered as holding all it makes
// (Register).
func (r *Registry) Registered(owner Owner) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered[owner]
}

// For returns a view of the registry that holds as owner.
func (r *Registry) For(owner Owner) *Holds { return &Holds{reg: r, owner: owner} }
