package coordination

// WaitingPolls returns how many long polls (the launcher's steer/next, the
// bridge's notice) wait on s's steering for a wake: a test waits for one
// before it sends the steer that must wake it.
func WaitingPolls(s *Session) int {
	s.steer.mu.Lock()
	defer s.steer.mu.Unlock()
	return s.steer.polls
}

// RelayEndpoints returns the "METHOD path" patterns of the relay's
// endpoint table, in the order the session's features added them.
func RelayEndpoints() []string { return relayEndpoints().patterns }
