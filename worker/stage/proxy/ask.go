package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// askPoll is how often a held connection looks for an operator's answer.
const askPoll = 250 * time.Millisecond

// askBuckets opens the egress_ask buckets (the worker provisions them).
func (p *Proxies) askBuckets(ctx context.Context) (asks, approvals jetstream.KeyValue, err error) {
	js, err := jetstream.New(p.cfg.NC)
	if err != nil {
		return nil, nil, err
	}
	if asks, err = js.KeyValue(ctx, messages.BucketEgressAsks); err != nil {
		return nil, nil, err
	}
	if approvals, err = js.KeyValue(ctx, messages.BucketEgressApprovals); err != nil {
		return nil, nil, err
	}
	return asks, approvals, nil
}

// asker puts a run's connections to its profile's egress_ask hosts to an
// operator (egress.AskFunc).
type asker struct {
	p         *Proxies
	run       *stage.Run
	n         atomic.Int32
	asks      jetstream.KeyValue
	approvals jetstream.KeyValue
}

// approved returns the profile-wide answer for host:port, if there is one.
func (a *asker) approved(ctx context.Context, host string, port int) (messages.EgressAnswer, bool) {
	e, err := a.approvals.Get(ctx, messages.EgressApprovalKey(a.run.Profile.Name, host, port))
	if err != nil {
		return messages.EgressAnswer{}, false
	}
	var ans messages.EgressAnswer
	if json.Unmarshal(e.Value(), &ans) != nil {
		return messages.EgressAnswer{}, false
	}
	ans.Scope = "profile"
	return ans, true
}

// ask implements egress.AskFunc: a profile-wide answer is taken at once;
// otherwise the question is put in the asks bucket (jetcrew egress pending
// lists it) and the connection waits for an answer to it, or a
// profile-wide one, until the profile's egress_ask_timeout or ctx ends.
func (a *asker) ask(ctx context.Context, host string, port int) egress.Decision {
	prof := a.run.Profile
	decision := func(ans messages.EgressAnswer) egress.Decision {
		return egress.Decision{Allow: ans.Allow, By: ans.By, Scope: ans.Scope, Profile: prof.Name}
	}
	if ans, ok := a.approved(ctx, host, port); ok {
		return decision(ans)
	}
	timeout := prof.EgressAskTimeoutDuration()
	now := time.Now().UTC()
	q := messages.EgressAsk{ID: messages.EgressAskID(a.run.ID(), int(a.n.Add(1))), RunID: a.run.ID(), Profile: prof.Name,
		Worker: a.p.cfg.WorkerID, Host: host, Port: port, Time: now, Until: now.Add(timeout)}
	data, _ := json.Marshal(q) // an EgressAsk always marshals
	log := a.p.cfg.Log.With().Str("run_id", q.RunID).Str("ask", q.ID).Str("host", host).Int("port", port).Logger()
	if _, err := a.asks.Put(ctx, messages.EgressAskKey(q.ID), data); err != nil {
		log.Warn().Err(err).Msg("put an egress question; refusing the connection")
		return egress.Decision{TimedOut: true, Wait: "0s (the question could not be put: " + err.Error() + ")"}
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = a.asks.Delete(dctx, messages.EgressAskKey(q.ID))
		cancel()
	}()
	log.Info().Dur("timeout", timeout).Msg("egress: waiting for an operator (jetcrew egress allow|deny " + q.ID + ")")
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(askPoll)
	defer t.Stop()
	for {
		e, err := a.asks.Get(wctx, messages.EgressAnswerKey(q.ID))
		if err == nil {
			var ans messages.EgressAnswer
			if json.Unmarshal(e.Value(), &ans) == nil {
				if ans.Scope != "profile" {
					ans.Scope = "run"
				}
				return decision(ans)
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) && wctx.Err() == nil {
			log.Debug().Err(err).Msg("read the answer")
		}
		if ans, ok := a.approved(wctx, host, port); ok {
			return decision(ans)
		}
		select {
		case <-wctx.Done():
			return egress.Decision{TimedOut: true, Wait: time.Since(now).Round(time.Second).String()}
		case <-t.C:
		}
	}
}
