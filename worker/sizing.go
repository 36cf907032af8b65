package worker

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// sizingWarnings says, one sentence each, why a worker with concurrency
// slots would not get work on every slot from the pool consumer described by
// info. Both limits stall delivery without an error the worker sees as one:
//
//   - MaxAckPending caps the requests delivered and not yet acked across
//     every worker of the pool; once reached, the server delivers nothing
//     more until an ack, and pull requests just wait.
//   - MaxWaiting caps the pull requests waiting on the consumer; the worker
//     keeps one waiting per free slot, and the server refuses those beyond
//     the cap (409 Exceeded MaxWaiting, logged as a fetch error, retried).
//
// A worker alone beyond a limit is a configuration error; a pool whose
// current holdings leave less room than this worker's concurrency may only be
// busy, so that is said as such. It returns nil when the sizes fit.
func sizingWarnings(concurrency int, info *jetstream.ConsumerInfo) []string {
	if info == nil {
		return nil
	}
	var out []string
	maxAck, maxWait := info.Config.MaxAckPending, info.Config.MaxWaiting
	switch {
	case maxAck > 0 && concurrency > maxAck:
		out = append(out, fmt.Sprintf(
			"concurrency %d exceeds the pool consumer's max ack pending %d: at most %d requests are delivered at once across the whole pool, so at least %d slots of this worker never get work and the server says nothing; raise max ack pending to at least the sum of the pool's workers' concurrency",
			concurrency, maxAck, maxAck, concurrency-maxAck))
	case maxAck > 0 && info.NumAckPending+concurrency > maxAck:
		out = append(out, fmt.Sprintf(
			"the pool already holds %d of its consumer's max ack pending %d, leaving %d for this worker's %d slots: if the other workers stay this busy, delivery stalls silently at the cap; raise max ack pending to at least the sum of the pool's workers' concurrency",
			info.NumAckPending, maxAck, max(0, maxAck-info.NumAckPending), concurrency))
	}
	switch {
	case maxWait > 0 && concurrency > maxWait:
		out = append(out, fmt.Sprintf(
			"concurrency %d exceeds the pool consumer's max waiting %d: the worker keeps one pull request waiting per free slot and the server refuses those beyond %d (409 Exceeded MaxWaiting)",
			concurrency, maxWait, maxWait))
	case maxWait > 0 && info.NumWaiting+concurrency > maxWait:
		out = append(out, fmt.Sprintf(
			"the pool's workers already keep %d pull requests waiting of the consumer's max waiting %d, leaving %d for this worker's %d slots: the server refuses pull requests beyond the cap (409 Exceeded MaxWaiting)",
			info.NumWaiting, maxWait, max(0, maxWait-info.NumWaiting), concurrency))
	}
	return out
}

// warnSizing logs each of sizingWarnings for this worker's concurrency on
// the pool consumer as the server has it now (one consumer info request;
// another worker may have provisioned it with other limits). It is meant to
// be called from Start, once w.cons is set and before the slots pull, so the
// worker's own pull requests are not counted. A failed info request is
// logged at debug level and otherwise ignored: the warning is advice.
func (w *Worker) warnSizing(ctx context.Context) {
	info, err := w.cons.Info(ctx)
	if err != nil {
		w.log.Debug().Err(err).Msg("consumer info for the sizing check")
		return
	}
	for _, msg := range sizingWarnings(w.cfg.Concurrency, info) {
		w.log.Warn().Int("concurrency", w.cfg.Concurrency).
			Int("max_ack_pending", info.Config.MaxAckPending).Int("num_ack_pending", info.NumAckPending).
			Int("max_waiting", info.Config.MaxWaiting).Int("num_waiting", info.NumWaiting).
			Msg(msg)
	}
}
