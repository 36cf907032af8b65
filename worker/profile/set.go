package profile

import "sync/atomic"

// Set holds a worker's profiles in use, one value every part reads. The
// worker makes one (NewSet) and hands it to every part that reads profiles
// (the run engine, the warm pool, the workspace and egress stages); a
// reload stores the new profiles once (Store), and a part reads the set as
// it is when it needs it (Load): a run admitted keeps the profile it was
// admitted with, a copy, to its end. Safe for concurrent use.
type Set struct {
	p atomic.Pointer[Profiles]
}

// NewSet returns a Set holding ps, the profiles a worker starts with.
func NewSet(ps Profiles) *Set {
	s := &Set{}
	s.Store(ps)
	return s
}

// Load returns the profiles in use; nil for a nil Set.
func (s *Set) Load() Profiles {
	if s == nil {
		return nil
	}
	if p := s.p.Load(); p != nil {
		return *p
	}
	return nil
}

// Store replaces the profiles in use with ps (resolved and validated:
// LoadProfiles).
func (s *Set) Store(ps Profiles) { s.p.Store(&ps) }
