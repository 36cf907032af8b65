package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// Adopt serves the adopted run's egress proxy again on the socket in the
// directory its container mounts (the dead worker's socket there is
// stale: replaced), once this worker's proof passed, with the profile's
// policy, injections (their values from this worker's environment),
// metering, budgets and egress_ask, as Prestart does; the container
// keeps the environment and the CA files it was started with. The
// session goes on from the run's record (egress.Session.Carry): its
// egress totals and model usage end as everything the run did under both
// workers, and its own budgets count what was spent before (a run's
// grants, cumulative, are applied before its first request here). A
// budget the record says the run reached ends it failed, as it would
// have. A worker that left the run settled its requests in flight into
// the record (Release); one that died wrote the usage at most
// CheckEvery before it died: what it counted after, and its requests in
// flight, are missing from the run's own totals (its shared budgets hold
// them: sharedBudgets). The in-jail relay reconnects on its own; an
// answer to egress_ask given for the run only is asked again.
//
// With injections, the container trusts the egress CA staged in its run
// directory: a run whose staged CA certificate is not this worker's
// cannot be adopted (every TLS connection of the agent to an injected
// host would fail), and runs again. Workers that adopt each other's runs
// keep one CA: the default directory (<user config dir>/jetcrew/
// egress-ca/<installation>) serves a worker restarted as the same user on
// the same host; else --egress-ca-dir names one that persists.
func (s *Stage) Adopt(ctx context.Context, req *stage.AdoptRequest, _ *stage.PrestartResponse) error {
	if req.Dir == nil {
		return errors.New("egress needs the run's directory")
	}
	req.Dir.Taint()
	if err := s.p.awaitProof(ctx); err != nil {
		return err
	}
	inj, err := s.p.injections(req.Run.Profile)
	if err != nil {
		return err
	}
	if len(inj) > 0 {
		if err := s.p.sameCA(req.Dir.Path()); err != nil {
			return err
		}
	}
	var c egress.Carried
	if req.State.Egress != nil {
		c.Egress = *req.State.Egress
	}
	if req.State.Usage != nil {
		c.Usage = *req.State.Usage
	}
	if b := req.State.Budget; b != "" && !strings.HasPrefix(b, pausedPrefix) {
		s.reachedBefore = b
	}
	s.failed, s.seen = c.Egress.UpstreamFailed, c.Usage
	return s.open(ctx, req.Run, req.Dir.Path(), inj, &c)
}

// pausedPrefix opens the record's budget while the run's requests are
// held at it (on_budget = "pause").
const pausedPrefix = "paused: "

// sameCA returns an error unless the egress CA certificate staged in the
// run directory dir is this worker's.
func (p *Proxies) sameCA(dir string) error {
	staged, err := os.ReadFile(filepath.Join(dir, profile.EgressCAName))
	if err != nil {
		return fmt.Errorf("the run's egress CA: %w", err)
	}
	if !bytes.Equal(staged, p.caPEM) {
		return fmt.Errorf("the run's container trusts another egress CA than this worker's (in %s): its TLS connections to egress_inject hosts would fail here; "+
			"workers that adopt each other's egress runs keep one CA (--egress-ca-dir)", p.caDir)
	}
	return nil
}

// reached returns the budget the run reached, as the record says it: under
// this session, or before the adoption.
func (s *Stage) reached() (string, bool) {
	if b, ok := s.sess.Reached(); ok {
		return b.String(), true
	}
	return s.reachedBefore, s.reachedBefore != ""
}

// noteBudget writes the run's budget into st: the one it reached, else
// the one its requests are held at, else none.
func (s *Stage) noteBudget(st *messages.RunState) {
	st.Budget = ""
	if b, paused := s.sess.Paused(); paused {
		st.Budget = pausedPrefix + b.String() + " (jetcrew budget raises it)"
	}
	if b, ok := s.reached(); ok {
		st.Budget = b
	}
}
