package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/internal/budgetkv"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// DefaultRateWait bounds how long a model request waits for its key's
// rate (profile key egress_rate) before it is answered 429 with the time
// still to wait.
const DefaultRateWait = 30 * time.Second

// rateBucket is the value of a key's pacing key in the jetcrew-budgets
// bucket: the requests and tokens left when they were last counted.
type rateBucket struct {
	Requests float64 `json:"requests"`
	Tokens   float64 `json:"tokens"`
	// AtMS is when they were counted, Unix milliseconds.
	AtMS int64 `json:"at_ms"`
}

// take returns b after taking one request and need tokens at now, each
// refilled since b.AtMS at r's rate per minute and held at most one
// minute's worth (a missing bucket, fresh, is full); a rate of 0 is not
// counted, and need past a minute's worth takes a full minute's worth.
// When b cannot give them, it returns b and how long until it could.
func take(r profile.EgressRate, b rateBucket, fresh bool, now time.Time, need int64) (rateBucket, time.Duration) {
	elapsed := max(0, now.Sub(time.UnixMilli(b.AtMS)))
	refill := func(left float64, perMin int64) float64 {
		if fresh {
			return float64(perMin)
		}
		return min(float64(perMin), left+float64(perMin)*elapsed.Minutes())
	}
	req, tok := refill(b.Requests, r.RequestsPerMinute), refill(b.Tokens, r.TokensPerMinute)
	want := min(float64(need), float64(r.TokensPerMinute))
	var wait time.Duration
	if r.RequestsPerMinute > 0 && req < 1 {
		wait = max(wait, time.Duration((1-req)/float64(r.RequestsPerMinute)*float64(time.Minute)))
	}
	if r.TokensPerMinute > 0 && tok < want {
		wait = max(wait, time.Duration((want-tok)/float64(r.TokensPerMinute)*float64(time.Minute)))
	}
	if wait > 0 {
		return b, max(wait, time.Millisecond)
	}
	if r.RequestsPerMinute > 0 {
		req--
	}
	if r.TokensPerMinute > 0 {
		tok -= want
	}
	return rateBucket{Requests: req, Tokens: tok, AtMS: now.UnixMilli()}, 0
}

// keyPacer is a run's egress.Pacer: its profile's egress_rate, for the key
// injected on each host.
type keyPacer struct {
	store *budgetStore
	rate  profile.EgressRate
	// keys are the pacing keys in the bucket, by injected host name.
	keys map[string]string
	wait time.Duration
}

// rateKey is the jetcrew-budgets key that paces the requests made with
// key (an injected header's value): "rate." and the first 12 bytes of its
// SHA-256, in hex; the key itself is never stored.
func rateKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "rate." + hex.EncodeToString(sum[:12])
}

// newPacer returns the pacer of a run of prof injecting inj, nil when the
// profile has no egress_rate.
func newPacer(store *budgetStore, prof *profile.Profile, inj []egress.Injection, wait time.Duration) *keyPacer {
	if prof.EgressRate == nil || store == nil {
		return nil
	}
	p := &keyPacer{store: store, rate: *prof.EgressRate, keys: map[string]string{}, wait: wait}
	for _, in := range inj {
		p.keys[in.Name] = rateKey(in.Value)
	}
	return p
}

// Take implements egress.Pacer: it takes from the bucket of host's key by
// compare-and-set (budgetkv.Update), so every worker using the key takes
// from one bucket, waiting while the bucket will give within the pacer's
// bound; past it it returns the wait left.
func (p *keyPacer) Take(ctx context.Context, host string, tokens int64) (time.Duration, error) {
	key, ok := p.keys[host]
	if !ok {
		return 0, nil
	}
	deadline := time.Now().Add(p.wait)
	for {
		wait, err := p.takeOnce(ctx, key, tokens)
		if err != nil || wait == 0 {
			return 0, err
		}
		if time.Now().Add(wait).After(deadline) {
			return wait, nil
		}
		select {
		case <-ctx.Done():
			return wait, nil
		case <-time.After(wait):
		}
	}
}

// takeOnce takes from key's bucket now, or returns how long until it
// could.
func (p *keyPacer) takeOnce(ctx context.Context, key string, tokens int64) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, budgetReadTimeout)
	defer cancel()
	kv, err := p.store.bucket(ctx)
	if err != nil {
		return 0, err
	}
	var wait time.Duration
	_, err = budgetkv.Update(ctx, kv, key, func(cur []byte) ([]byte, bool, error) {
		var b rateBucket
		fresh := cur == nil || json.Unmarshal(cur, &b) != nil
		next, w := take(p.rate, b, fresh, time.Now(), tokens)
		if wait = w; w > 0 {
			return nil, false, nil
		}
		data, err := json.Marshal(next)
		return data, true, err
	})
	return wait, err
}
