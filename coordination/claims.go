package coordination

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// claimAttempts is how many times a claim, release or end-of-run removal
// reads the group's claims and writes them back when another worker wrote
// them in between (compare-and-set).
const claimAttempts = 8

// groupClaims is a group's claims as read from BucketClaims: the document
// and the revision to write over (0: no key, or a deleted one).
type groupClaims struct {
	doc messages.CoordClaims
	rev uint64
}

// claimBucket returns the claims bucket, looking it up once.
func (h *Host) claimBucket(ctx context.Context) (jetstream.KeyValue, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.claimKV != nil {
		return h.claimKV, nil
	}
	kv, err := h.js.KeyValue(ctx, BucketClaims)
	if err != nil {
		return nil, fmt.Errorf("bucket %s (run coordination.Provision first): %w", BucketClaims, err)
	}
	h.claimKV = kv
	return kv, nil
}

// loadClaims reads the group's claims and drops the stale ones: those not
// made by this session, nor by a session that is queued or running in the
// presence list (see messages.CoordClaims).
func (s *Session) loadClaims(ctx context.Context, kv jetstream.KeyValue) (groupClaims, error) {
	var g groupClaims
	e, err := kv.Get(ctx, ClaimKey(s.run.GroupRef()))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return g, nil
	case err != nil:
		return g, fmt.Errorf("read claims of group %s: %w", s.run.GroupRef(), err)
	}
	g.rev = e.Revision()
	if err := json.Unmarshal(e.Value(), &g.doc); err != nil {
		// Only workers write the bucket: a document they cannot read is
		// replaced, its claims lost, rather than wedging the group.
		s.log.Warn().Err(err).Msg("claims document unreadable; replacing it")
		g.doc = messages.CoordClaims{}
	}
	if len(g.doc.Claims) == 0 {
		return g, nil
	}
	var holders []string
	for _, c := range g.doc.Claims {
		if c.RunID != s.run.RunID && !slices.Contains(holders, c.RunID) {
			holders = append(holders, c.RunID)
		}
	}
	var live map[string]string
	var err2 error
	if len(holders) <= maxHolderGets {
		live, err2 = s.holderSessions(ctx, holders)
	} else {
		live, err2 = s.liveSessions(ctx)
	}
	if err2 != nil {
		return g, err2
	}
	g.doc.Claims = slices.DeleteFunc(g.doc.Claims, func(c messages.CoordClaim) bool { return live[c.RunID] != c.Session || c.Session == "" })
	return g, nil
}

// maxHolderGets is the most holders whose presence loadClaims reads key by
// key; past it, one watch of the group's presence is cheaper.
const maxHolderGets = 8

// holderSessions maps each of holders that is queued or running to the
// session its presence names, this run to this session.
func (s *Session) holderSessions(ctx context.Context, holders []string) (map[string]string, error) {
	live := map[string]string{s.run.RunID: s.presence.Session}
	for _, id := range holders {
		e, err := s.peers.Get(ctx, PeerKey(s.run.GroupRef(), id))
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			continue
		case err != nil:
			return nil, fmt.Errorf("look up peer %s: %w", id, err)
		}
		var p Presence
		if json.Unmarshal(e.Value(), &p) == nil && !p.State.Final() {
			live[id] = p.Session
		}
	}
	return live, nil
}

// liveSessions maps each queued or running run of the group to the session
// its presence names, this run to this session.
func (s *Session) liveSessions(ctx context.Context) (map[string]string, error) {
	w, err := s.peers.Watch(ctx, peersOf(s.run.GroupRef()), jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("list peers: %w", err)
	}
	defer func() { _ = w.Stop() }()
	live := map[string]string{}
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("list peers: %w", ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("list peers: watcher stopped")
			}
			if e == nil { // every current key has been delivered
				live[s.run.RunID] = s.presence.Session
				return live, nil
			}
			var p Presence
			if json.Unmarshal(e.Value(), &p) != nil || p.State.Final() {
				continue
			}
			live[p.RunID] = p.Session
		}
	}
}

// storeClaims writes g.doc over revision g.rev, deleting the key when no
// claim is left. It returns errCASLost when another writer came first.
func storeClaims(ctx context.Context, kv jetstream.KeyValue, group messages.GroupRef, g groupClaims) error {
	key := ClaimKey(group)
	var err error
	switch {
	case len(g.doc.Claims) == 0 && g.rev == 0:
		return nil
	case len(g.doc.Claims) == 0:
		err = kv.Delete(ctx, key, jetstream.LastRevision(g.rev))
	default:
		slices.SortFunc(g.doc.Claims, func(a, b messages.CoordClaim) int {
			return cmp.Or(strings.Compare(a.RunID, b.RunID), strings.Compare(a.Pattern, b.Pattern))
		})
		var b []byte
		if b, err = json.Marshal(g.doc); err != nil {
			return err
		}
		if g.rev == 0 {
			_, err = kv.Create(ctx, key, b)
		} else {
			_, err = kv.Update(ctx, key, b, g.rev)
		}
	}
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrKeyExists) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence) {
		return errCASLost
	}
	if err != nil {
		return fmt.Errorf("write claims of group %s: %w", group, err)
	}
	return nil
}

// errCASLost: another worker wrote the group's claims between our read and
// our write.
var errCASLost = errors.New("claims changed concurrently")

// updateClaims reads the group's claims, applies change and writes them
// back with compare-and-set, retrying when another writer came first.
func (s *Session) updateClaims(ctx context.Context, change func(*groupClaims) error) error {
	kv, err := s.h.claimBucket(ctx)
	if err != nil {
		return err
	}
	for range claimAttempts {
		g, err := s.loadClaims(ctx, kv)
		if err != nil {
			return err
		}
		if err := change(&g); err != nil {
			return err
		}
		err = storeClaims(ctx, kv, s.run.GroupRef(), g)
		if !errors.Is(err, errCASLost) {
			return err
		}
	}
	return fmt.Errorf("claims of group %s: %d concurrent writes in a row; try again", s.run.GroupRef(), claimAttempts)
}

// claim claims every pattern of req for this run, or none.
func (s *Session) claim(ctx context.Context, req relay.ClaimRequest) (relay.ClaimResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.h.cfg.OpTimeout)
	defer cancel()
	var held []messages.CoordClaim
	err := s.updateClaims(ctx, func(g *groupClaims) error {
		now := time.Now().UTC()
		var own, others []messages.CoordClaim
		for _, c := range g.doc.Claims {
			if c.RunID == s.run.RunID {
				own = append(own, c)
			} else {
				others = append(others, c)
			}
		}
		for _, p := range req.Paths {
			for _, c := range others {
				if PatternsOverlap(p, c.Pattern) {
					return &apiError{status: http.StatusConflict, code: relay.CodeConflict, msg: conflictMessage(p, c, now)}
				}
			}
		}
		for _, p := range req.Paths {
			i := slices.IndexFunc(own, func(c messages.CoordClaim) bool { return c.Pattern == p })
			if i >= 0 {
				own[i].Reason = req.Reason // claimed again: a new reason, the first time kept
				continue
			}
			own = append(own, messages.CoordClaim{Pattern: p, RunID: s.run.RunID, Reason: req.Reason, Since: now, Session: s.presence.Session})
		}
		if len(own) > s.h.cfg.MaxClaimsPerRun {
			return &apiError{status: http.StatusConflict, code: relay.CodeLimit, msg: fmt.Sprintf(
				"claim refused: a run may hold at most %d claims and you would hold %d; release some, or claim a directory or a glob instead of its files; nothing was claimed",
				s.h.cfg.MaxClaimsPerRun, len(own))}
		}
		if n := len(own) + len(others); n > s.h.cfg.MaxClaimsPerGroup {
			return &apiError{status: http.StatusConflict, code: relay.CodeLimit, msg: fmt.Sprintf(
				"claim refused: a group may hold at most %d claims and yours would hold %d; nothing was claimed", s.h.cfg.MaxClaimsPerGroup, n)}
		}
		g.doc.Claims = append(others, own...)
		held = own
		return nil
	})
	if err != nil {
		return relay.ClaimResponse{}, err
	}
	s.claimed.Store(true)
	s.emit(Event{Kind: EventClaimed, Paths: req.Paths, Reason: req.Reason})
	return relay.ClaimResponse{Claims: toRelayClaims(held, time.Now())}, nil
}

// conflictMessage tells the agent who holds what its pattern p overlaps,
// and since when.
func conflictMessage(p string, c messages.CoordClaim, now time.Time) string {
	msg := fmt.Sprintf("claim refused: %q overlaps %q, claimed by run %s since %s (%s ago)",
		p, c.Pattern, c.RunID, c.Since.Format(time.RFC3339), now.Sub(c.Since).Truncate(time.Second))
	if c.Reason != "" {
		msg += fmt.Sprintf(", reason %q", c.Reason)
	}
	return msg + fmt.Sprintf("; nothing was claimed. Ask %s (send) or wait until it releases; claims lists them", c.RunID)
}

// release releases every pattern of req, all held by this run, or none.
func (s *Session) release(ctx context.Context, req relay.ReleaseRequest) (relay.ReleaseResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.h.cfg.OpTimeout)
	defer cancel()
	var left []messages.CoordClaim
	err := s.updateClaims(ctx, func(g *groupClaims) error {
		var problems []string
		for _, p := range req.Paths {
			if slices.ContainsFunc(g.doc.Claims, func(c messages.CoordClaim) bool { return c.RunID == s.run.RunID && c.Pattern == p }) {
				continue
			}
			if i := slices.IndexFunc(g.doc.Claims, func(c messages.CoordClaim) bool { return c.Pattern == p }); i >= 0 {
				problems = append(problems, fmt.Sprintf("%q is held by run %s, not by you", p, g.doc.Claims[i].RunID))
			} else {
				problems = append(problems, fmt.Sprintf("you hold no claim %q", p))
			}
		}
		if len(problems) > 0 {
			return &apiError{status: http.StatusConflict, code: relay.CodeNotHeld, msg: "release refused: " + strings.Join(problems, "; ") +
				"; nothing was released. Name patterns exactly as you claimed them (claims lists them)"}
		}
		g.doc.Claims = slices.DeleteFunc(g.doc.Claims, func(c messages.CoordClaim) bool {
			return c.RunID == s.run.RunID && slices.Contains(req.Paths, c.Pattern)
		})
		left = left[:0]
		for _, c := range g.doc.Claims {
			if c.RunID == s.run.RunID {
				left = append(left, c)
			}
		}
		return nil
	})
	if err != nil {
		return relay.ReleaseResponse{}, err
	}
	s.emit(Event{Kind: EventReleased, Paths: req.Paths})
	return relay.ReleaseResponse{Released: req.Paths, Claims: toRelayClaims(left, time.Now())}, nil
}

// claims lists the group's current claims.
func (s *Session) claims(ctx context.Context) (relay.ClaimsResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.h.cfg.OpTimeout)
	defer cancel()
	kv, err := s.h.claimBucket(ctx)
	if err != nil {
		return relay.ClaimsResponse{}, err
	}
	g, err := s.loadClaims(ctx, kv)
	if err != nil {
		return relay.ClaimsResponse{}, err
	}
	return relay.ClaimsResponse{Claims: toRelayClaims(g.doc.Claims, time.Now())}, nil
}

// releaseAll removes every claim of the run, when it has ended (Close).
func (s *Session) releaseAll(ctx context.Context) error {
	var gone []string
	err := s.updateClaims(ctx, func(g *groupClaims) error {
		gone = gone[:0]
		g.doc.Claims = slices.DeleteFunc(g.doc.Claims, func(c messages.CoordClaim) bool {
			if c.RunID == s.run.RunID {
				gone = append(gone, c.Pattern)
				return true
			}
			return false
		})
		return nil
	})
	if err != nil {
		return fmt.Errorf("coordination: release claims of run %s: %w", s.run.RunID, err)
	}
	if len(gone) > 0 {
		s.emit(Event{Kind: EventReleased, Paths: gone, Reason: "run ended"})
	}
	return nil
}

// toRelayClaims converts claims for the agent, ordered by holder, then
// pattern. Never nil.
func toRelayClaims(cs []messages.CoordClaim, now time.Time) []relay.Claim {
	out := make([]relay.Claim, 0, len(cs))
	for _, c := range cs {
		out = append(out, relay.Claim{Pattern: c.Pattern, RunID: c.RunID, Reason: c.Reason, Since: c.Since,
			AgeSeconds: int64(max(0, now.Sub(c.Since)) / time.Second)})
	}
	slices.SortFunc(out, func(a, b relay.Claim) int {
		return cmp.Or(strings.Compare(a.RunID, b.RunID), strings.Compare(a.Pattern, b.Pattern))
	})
	return out
}
