package coordination

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// The run's entry in its group's presence list (BucketPeers), and what the
// session reads of its peers' entries.

// peerCheckTTL is how long a peer checkPeer found queued or running is
// trusted without looking again: a conversation's sends cost one publish
// each, not a lookup and a publish. A peer that ended within it still gets
// the message stored (as an operator's message to it would be).
const peerCheckTTL = 2 * time.Second

// maxPeerSeen bounds the peers remembered per session.
const maxPeerSeen = 256

// setState records state in the run's presence (and the start time when it
// moves to running without one), writing the key once the run has joined.
func (c *core) setState(ctx context.Context, state messages.State) error {
	c.mu.Lock()
	c.presence.State = state
	if state == messages.StateRunning && c.presence.StartedAt.IsZero() {
		c.presence.StartedAt = time.Now().UTC()
	}
	c.mu.Unlock()
	if !c.joined.Load() {
		return nil // the state goes into the presence list when the run joins it
	}
	return c.putPresence(ctx)
}

// join enters the run in its group's presence list; the refresher keeps the
// key alive from then on.
func (c *core) join(ctx context.Context) error {
	if err := c.putPresence(ctx); err != nil {
		return err
	}
	c.joined.Store(true)
	return nil
}

// joinLate enters a run that named no group in its presence list when its
// bridge first connects; a failure is logged and retried by the refresher.
func (c *core) joinLate() {
	if c.joined.Load() {
		return
	}
	ctx, cancel := c.opContext(c.ctx)
	defer cancel()
	if err := c.join(ctx); err != nil {
		c.joined.Store(true) // the refresher writes it again
		c.log.Warn().Err(err).Msg("join coordination presence")
	}
}

// putPresence writes the run's presence key.
func (c *core) putPresence(ctx context.Context) error {
	c.mu.Lock()
	p := c.presence
	c.mu.Unlock()
	p.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = c.peers.Put(ctx, PeerKey(c.run.GroupRef(), c.run.RunID), b)
	return err
}

// refreshPresence rewrites the presence key every PeerTTL/3 until the
// session stops, so that it outlives the bucket's TTL only while the worker
// lives.
func (c *core) refreshPresence() {
	t := time.NewTicker(PeerTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
			if !c.joined.Load() {
				continue
			}
			ctx, cancel := c.opContext(c.ctx)
			if err := c.putPresence(ctx); err != nil && c.ctx.Err() == nil {
				c.log.Warn().Err(err).Msg("refresh coordination presence")
			}
			cancel()
		}
	}
}

// leave takes the run out of its group's presence list, unless another
// session has written its key since (the run was redelivered): mine is
// false then, and when the key cannot be read (err says why). A failed
// delete returns mine true and the error: the key expires after PeerTTL.
func (c *core) leave(ctx context.Context) (mine bool, err error) {
	key := PeerKey(c.run.GroupRef(), c.run.RunID)
	e, err := c.peers.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("coordination: leave group %s: %w", c.run.GroupRef(), err)
	}
	var p Presence
	if json.Unmarshal(e.Value(), &p) == nil && p.Session != c.sessionID() {
		c.log.Info().Msg("run is served by another session; leaving its presence and inbox alone")
		return false, nil
	}
	// Only if nobody wrote the key since we read it.
	if err := c.peers.Delete(ctx, key, jetstream.LastRevision(e.Revision())); err != nil {
		return true, fmt.Errorf("coordination: leave group %s: %w", c.run.GroupRef(), err)
	}
	return true, nil
}

// eachPeer passes fn the presence of every queued or running run of the
// group, this one included, as the bucket holds them now.
func (c *core) eachPeer(ctx context.Context, fn func(Presence)) error {
	w, err := c.peers.Watch(ctx, peersOf(c.run.GroupRef()), jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("list peers: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("list peers: %w", ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("list peers: watcher stopped")
			}
			if e == nil { // every current key has been delivered
				return nil
			}
			var p Presence
			if json.Unmarshal(e.Value(), &p) != nil || p.State.Final() {
				continue
			}
			fn(p)
		}
	}
}

// listPeers returns the queued and running runs of the group but this one,
// ordered by run id.
func (c *core) listPeers(ctx context.Context) ([]relay.Peer, error) {
	peers := []relay.Peer{}
	err := c.eachPeer(ctx, func(p Presence) {
		if p.RunID != c.run.RunID {
			peers = append(peers, relay.Peer{RunID: p.RunID, Profile: p.Profile, State: string(p.State), StartedAt: p.StartedAt})
		}
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(peers, func(a, b relay.Peer) int { return strings.Compare(a.RunID, b.RunID) })
	return peers, nil
}

// peer reads run id's presence in the group: found is false when it has
// none. A presence that cannot be decoded reads as the zero Presence.
func (c *core) peer(ctx context.Context, id string) (p Presence, found bool, err error) {
	e, err := c.peers.Get(ctx, PeerKey(c.run.GroupRef(), id))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return p, false, nil
	case err != nil:
		return p, false, fmt.Errorf("look up peer %s: %w", id, err)
	}
	_ = json.Unmarshal(e.Value(), &p)
	return p, true, nil
}

// checkPeer reports an *relay.InvalidError unless to is a queued or running
// run of this run's group.
func (c *core) checkPeer(ctx context.Context, to string) error {
	if c.peerFresh(to) {
		return nil
	}
	unknown := func(why string) error {
		return &relay.InvalidError{Code: relay.CodeUnknownPeer, Message: fmt.Sprintf(
			"unknown peer %q: %s; call status to list your peers, or send to %q or %q", to, why, RecipientAll, RecipientOperator)}
	}
	p, found, err := c.peer(ctx, to)
	switch {
	case err != nil:
		return err
	case !found:
		return unknown(fmt.Sprintf("no queued or running run of your group %q has that id", c.run.Group))
	case p.State.Final():
		return unknown(fmt.Sprintf("that run has finished (%s)", p.State))
	}
	c.mu.Lock()
	if c.peerSeen == nil || len(c.peerSeen) >= maxPeerSeen {
		c.peerSeen = make(map[string]time.Time)
	}
	c.peerSeen[to] = time.Now()
	c.mu.Unlock()
	return nil
}

// peerFresh reports whether checkPeer found to queued or running within
// peerCheckTTL.
func (c *core) peerFresh(to string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.peerSeen[to]
	return ok && time.Since(t) < peerCheckTTL
}
