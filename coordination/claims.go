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
	"sync/atomic"
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

// claims is a session's file claims: the claim, release and claims calls,
// over its group's claims document in BucketClaims.
type claims struct {
	c *core
	// claimed is set once the run claimed something in this session: Close
	// then removes its claims.
	claimed atomic.Bool
}

// addClaimEndpoints adds the claim, release and claims endpoints to t.
func addClaimEndpoints(t *endpointTable) {
	of := func(s *Session) *claims { return s.claims }
	add(t, of, endpoint[claims, relay.ClaimRequest, relay.ClaimResponse]{
		method: http.MethodPost, path: relay.PathClaim, class: callClaim, decode: relay.DecodeClaimRequest, do: (*claims).claim,
		refused: func(req relay.ClaimRequest) Event { return Event{Paths: req.Paths} },
	})
	add(t, of, endpoint[claims, relay.ReleaseRequest, relay.ReleaseResponse]{
		method: http.MethodPost, path: relay.PathRelease, class: callClaim, decode: relay.DecodeReleaseRequest, do: (*claims).release,
		refused: func(req relay.ReleaseRequest) Event { return Event{Paths: req.Paths} },
	})
	add(t, of, endpoint[claims, none, relay.ClaimsResponse]{
		method: http.MethodGet, path: relay.PathClaims, class: callRead,
		do: func(cl *claims, ctx context.Context, _ none) (relay.ClaimsResponse, error) { return cl.list(ctx) },
	})
}

// load reads the group's claims and drops the stale ones: those not
// made by this session, nor by a session that is queued or running in the
// presence list (see messages.CoordClaims).
func (cl *claims) load(ctx context.Context, kv jetstream.KeyValue) (groupClaims, error) {
	var g groupClaims
	e, err := kv.Get(ctx, ClaimKey(cl.c.run.GroupRef()))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return g, nil
	case err != nil:
		return g, fmt.Errorf("read claims of group %s: %w", cl.c.run.GroupRef(), err)
	}
	g.rev = e.Revision()
	if err := json.Unmarshal(e.Value(), &g.doc); err != nil {
		// Only workers write the bucket: a document they cannot read is
		// replaced, its claims lost, rather than wedging the group.
		cl.c.log.Warn().Err(err).Msg("claims document unreadable; replacing it")
		g.doc = messages.CoordClaims{}
	}
	if len(g.doc.Claims) == 0 {
		return g, nil
	}
	var holders []string
	for _, c := range g.doc.Claims {
		if c.RunID != cl.c.run.RunID && !slices.Contains(holders, c.RunID) {
			holders = append(holders, c.RunID)
		}
	}
	live, err := cl.liveSessions(ctx, holders)
	if err != nil {
		return g, err
	}
	g.doc.Claims = slices.DeleteFunc(g.doc.Claims, func(c messages.CoordClaim) bool { return live[c.RunID] != c.Session || c.Session == "" })
	return g, nil
}

// maxHolderGets is the most holders whose presence liveSessions reads key
// by key; past it, one watch of the group's presence is cheaper.
const maxHolderGets = 8

// liveSessions maps each of holders that is queued or running to the
// session its presence names, and this run to this session.
func (cl *claims) liveSessions(ctx context.Context, holders []string) (map[string]string, error) {
	live := map[string]string{}
	if len(holders) > maxHolderGets {
		if err := cl.c.eachPeer(ctx, func(p Presence) { live[p.RunID] = p.Session }); err != nil {
			return nil, err
		}
	} else {
		for _, id := range holders {
			p, found, err := cl.c.peer(ctx, id)
			if err != nil {
				return nil, err
			}
			if found && !p.State.Final() {
				live[id] = p.Session
			}
		}
	}
	live[cl.c.run.RunID] = cl.c.sessionID()
	return live, nil
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

// update reads the group's claims, applies change and writes them
// back with compare-and-set, retrying when another writer came first.
func (cl *claims) update(ctx context.Context, change func(*groupClaims) error) error {
	kv, err := cl.c.h.claims.get(ctx, cl.c.h.js)
	if err != nil {
		return err
	}
	for range claimAttempts {
		g, err := cl.load(ctx, kv)
		if err != nil {
			return err
		}
		if err := change(&g); err != nil {
			return err
		}
		err = storeClaims(ctx, kv, cl.c.run.GroupRef(), g)
		if !errors.Is(err, errCASLost) {
			return err
		}
	}
	return fmt.Errorf("claims of group %s: %d concurrent writes in a row; try again", cl.c.run.GroupRef(), claimAttempts)
}

// claim claims every pattern of req for this run, or none.
func (cl *claims) claim(ctx context.Context, req relay.ClaimRequest) (relay.ClaimResponse, error) {
	ctx, cancel := cl.c.opContext(ctx)
	defer cancel()
	var held []messages.CoordClaim
	err := cl.update(ctx, func(g *groupClaims) error {
		now := time.Now().UTC()
		var own, others []messages.CoordClaim
		for _, c := range g.doc.Claims {
			if c.RunID == cl.c.run.RunID {
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
			own = append(own, messages.CoordClaim{Pattern: p, RunID: cl.c.run.RunID, Reason: req.Reason, Since: now, Session: cl.c.sessionID()})
		}
		if len(own) > cl.c.h.cfg.MaxClaimsPerRun {
			return &apiError{status: http.StatusConflict, code: relay.CodeLimit, msg: fmt.Sprintf(
				"claim refused: a run may hold at most %d claims and you would hold %d; release some, or claim a directory or a glob instead of its files; nothing was claimed",
				cl.c.h.cfg.MaxClaimsPerRun, len(own))}
		}
		if n := len(own) + len(others); n > cl.c.h.cfg.MaxClaimsPerGroup {
			return &apiError{status: http.StatusConflict, code: relay.CodeLimit, msg: fmt.Sprintf(
				"claim refused: a group may hold at most %d claims and yours would hold %d; nothing was claimed", cl.c.h.cfg.MaxClaimsPerGroup, n)}
		}
		g.doc.Claims = append(others, own...)
		held = own
		return nil
	})
	if err != nil {
		return relay.ClaimResponse{}, err
	}
	cl.claimed.Store(true)
	cl.c.emit(Event{Kind: EventClaimed, Paths: req.Paths, Reason: req.Reason})
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
func (cl *claims) release(ctx context.Context, req relay.ReleaseRequest) (relay.ReleaseResponse, error) {
	ctx, cancel := cl.c.opContext(ctx)
	defer cancel()
	var left []messages.CoordClaim
	err := cl.update(ctx, func(g *groupClaims) error {
		var problems []string
		for _, p := range req.Paths {
			if slices.ContainsFunc(g.doc.Claims, func(c messages.CoordClaim) bool { return c.RunID == cl.c.run.RunID && c.Pattern == p }) {
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
			return c.RunID == cl.c.run.RunID && slices.Contains(req.Paths, c.Pattern)
		})
		left = left[:0]
		for _, c := range g.doc.Claims {
			if c.RunID == cl.c.run.RunID {
				left = append(left, c)
			}
		}
		return nil
	})
	if err != nil {
		return relay.ReleaseResponse{}, err
	}
	cl.c.emit(Event{Kind: EventReleased, Paths: req.Paths})
	return relay.ReleaseResponse{Released: req.Paths, Claims: toRelayClaims(left, time.Now())}, nil
}

// list lists the group's current claims.
func (cl *claims) list(ctx context.Context) (relay.ClaimsResponse, error) {
	ctx, cancel := cl.c.opContext(ctx)
	defer cancel()
	kv, err := cl.c.h.claims.get(ctx, cl.c.h.js)
	if err != nil {
		return relay.ClaimsResponse{}, err
	}
	g, err := cl.load(ctx, kv)
	if err != nil {
		return relay.ClaimsResponse{}, err
	}
	return relay.ClaimsResponse{Claims: toRelayClaims(g.doc.Claims, time.Now())}, nil
}

// releaseAll removes every claim of the run, when it has ended (Close), if
// it claimed anything in this session.
func (cl *claims) releaseAll(ctx context.Context) error {
	if !cl.claimed.Load() {
		return nil
	}
	var gone []string
	err := cl.update(ctx, func(g *groupClaims) error {
		gone = gone[:0]
		g.doc.Claims = slices.DeleteFunc(g.doc.Claims, func(c messages.CoordClaim) bool {
			if c.RunID == cl.c.run.RunID {
				gone = append(gone, c.Pattern)
				return true
			}
			return false
		})
		return nil
	})
	if err != nil {
		return fmt.Errorf("coordination: release claims of run %s: %w", cl.c.run.RunID, err)
	}
	if len(gone) > 0 {
		cl.c.emit(Event{Kind: EventReleased, Paths: gone, Reason: "run ended"})
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
