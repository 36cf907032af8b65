package live

import "sync"

// Holds is the registry as one owner holds into it. It is what a stage is
// given: a run's stages hold as the run (stage.Run.Holds), the stages'
// factories as the worker. What it asks (Held, IfUnheld, Keys) it asks of the whole
// registry, every owner's holds counted. Safe for concurrent use; the zero
// value holds as Worker into a registry of its own (for tests).
type Holds struct {
	once  sync.Once
	reg   *Registry
	owner Owner
}

// init sets the zero value's registry and owner.
func (h *Holds) init() {
	h.once.Do(func() {
		if h.reg == nil {
			h.reg, h.owner = &Registry{}, Worker
		}
	})
}

// Hold holds key as the view's owner until the returned release runs. The
// release is safe to call more than once.
func (h *Holds) Hold(key string) (release func()) {
	h.init()
	return h.reg.Hold(h.owner, key)
}

// Held reports whether any owner, not only the view's, holds key.
func (h *Holds) Held(key string) bool {
	h.init()
	return h.reg.Held(key)
}

// IfUnheld calls f under the registry's lock when nobody holds key. It
// reports whether it did (Registry.IfUnheld).
func (h *Holds) IfUnheld(key string, f func()) bool {
	h.init()
	return h.reg.IfUnheld(key, f)
}

// Keys returns the held keys that start with prefix, the prefix removed.
// Every owner's holds count.
func (h *Holds) Keys(prefix string) map[string]bool {
	h.init()
	return h.reg.Keys(prefix)
}

// Owner returns the owner the view holds every key as.
func (h *Holds) Owner() Owner {
	h.init()
	return h.owner
}

// Registry returns the registry of what is live the view holds into.
func (h *Holds) Registry() *Registry {
	h.init()
	return h.reg
}
