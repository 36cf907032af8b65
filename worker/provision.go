package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// ProvisionConfig sizes the JetStream resources Provision creates. Zero
// fields take the documented defaults.
type ProvisionConfig struct {
	// Pool whose durable consumer to create. Default messages.DefaultPool.
	Pool string
	// Replicas for every stream and bucket: 1 on one server, 3 on a cluster.
	// Default 1.
	Replicas int
	// DuplicateWindow is JETCREW_RUNS' duplicate window: a second publish
	// with the same Nats-Msg-Id inside it is dropped. Default 2 minutes.
	DuplicateWindow time.Duration
	// AckWait is how long the server waits for an ack or InProgress before
	// redelivering. Default 30 seconds.
	AckWait time.Duration
	// MaxDeliver is the most deliveries of one request. Default 5.
	MaxDeliver int
	// MaxAckPending caps unacknowledged requests across every worker of
	// the pool; delivery stalls silently when it is reached, so it must be
	// at least the sum of the workers' concurrency. Default 1024.
	MaxAckPending int
	// EventsMaxAge is how long run events are kept. Default 7 days.
	EventsMaxAge time.Duration
	// FailedMaxAge is how long dead letters are kept. Default 30 days.
	FailedMaxAge time.Duration
	// RunsMaxBytes caps JETCREW_RUNS, in bytes; when full, a submit is
	// refused (discard new) and no queued request is lost. Default
	// DefaultRunsMaxBytes; -1 means no cap.
	RunsMaxBytes int64
	// EventsMaxBytes caps JETCREW_EVENTS, in bytes; when full, the oldest
	// events go first. Default DefaultEventsMaxBytes; -1 means no cap.
	EventsMaxBytes int64
	// FailedMaxBytes caps JETCREW_FAILED, in bytes; when full, the oldest
	// dead letters go first. Default DefaultFailedMaxBytes; -1 means no cap.
	FailedMaxBytes int64
	// RunsMaxAge is how long a request stays in JETCREW_RUNS: one no worker
	// takes (its pool is served by nobody) is removed then. It counts from
	// the publish, so it must outlast the wait in the queue and every
	// attempt of the run (a request removed while a worker holds it is not
	// redelivered if that worker dies); at least messages.MaxTimeout.
	// Default DefaultRunsMaxAge.
	RunsMaxAge time.Duration
	// RunsMaxPerPool is the most requests one pool's subject holds in
	// JETCREW_RUNS, queued and in hand together (and as many again on its
	// replay subject); past it a submit to that pool is refused, nothing
	// queued is dropped. Default DefaultRunsMaxPerPool; -1 means no limit.
	RunsMaxPerPool int64
}

func (c ProvisionConfig) withDefaults() ProvisionConfig {
	if c.Pool == "" {
		c.Pool = messages.DefaultPool
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = 2 * time.Minute
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 5
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 1024
	}
	if c.EventsMaxAge == 0 {
		c.EventsMaxAge = 7 * 24 * time.Hour
	}
	if c.FailedMaxAge == 0 {
		c.FailedMaxAge = 30 * 24 * time.Hour
	}
	c.RunsMaxBytes = streamCap(c.RunsMaxBytes, DefaultRunsMaxBytes)
	c.EventsMaxBytes = streamCap(c.EventsMaxBytes, DefaultEventsMaxBytes)
	c.FailedMaxBytes = streamCap(c.FailedMaxBytes, DefaultFailedMaxBytes)
	if c.RunsMaxAge == 0 {
		c.RunsMaxAge = DefaultRunsMaxAge
	}
	c.RunsMaxPerPool = streamCap(c.RunsMaxPerPool, DefaultRunsMaxPerPool)
	return c
}

// validate checks a configuration withDefaults completed.
func (c ProvisionConfig) validate() error {
	if err := messages.ValidateToken("pool", c.Pool); err != nil {
		return err
	}
	if c.RunsMaxAge < messages.MaxTimeout {
		return fmt.Errorf("runs max age %s is shorter than the longest run timeout a request may ask for (%s): a request could be removed while it runs", c.RunsMaxAge, messages.MaxTimeout)
	}
	return nil
}

// Provision creates or updates the streams, key-value buckets and the pool's
// durable consumer jetcrew needs, and returns the consumer. It is safe to call
// from every worker at once: the configurations are identical, and creating an
// existing resource with the same configuration succeeds.
//
// Stream JETCREW_RUNS: WorkQueue retention, file storage, subjects
// jetcrew.runs.>, AllowDirect (so `nats stream view` works), the duplicate
// window, and its limits: messages no larger than
// messages.MaxRequestMsgBytes, RunsMaxAge, RunsMaxPerPool requests per
// subject (refusing more, never dropping one), RunsMaxBytes in all. An
// existing stream is updated to them, unless a pool holds more requests
// than RunsMaxPerPool (see checkPoolsFit). JETCREW_EVENTS and
// JETCREW_FAILED: limits retention, file storage.
// The consumer: durable, pull, explicit ack, filtered on jetcrew.runs.<pool>
// and jetcrew.runs.<pool>.replay.
func Provision(ctx context.Context, js jetstream.JetStream, cfg ProvisionConfig) (jetstream.Consumer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := checkPoolsFit(ctx, js, cfg.RunsMaxPerPool); err != nil {
		return nil, err
	}
	for _, sc := range streamConfigs(cfg) {
		if err := retryProvision(ctx, func(ctx context.Context) error { _, err := js.CreateOrUpdateStream(ctx, sc); return err }); err != nil {
			return nil, fmt.Errorf("provision stream %s: %w", sc.Name, err)
		}
	}
	for _, kc := range bucketConfigs(cfg) {
		if err := retryProvision(ctx, func(ctx context.Context) error { _, err := js.CreateOrUpdateKeyValue(ctx, kc); return err }); err != nil {
			return nil, fmt.Errorf("provision bucket %s: %w", kc.Bucket, err)
		}
	}
	if _, err := provisionAdvisories(ctx, js, cfg); err != nil {
		return nil, err
	}
	var cons jetstream.Consumer
	err := retryProvision(ctx, func(ctx context.Context) error {
		var err error
		cons, err = js.CreateOrUpdateConsumer(ctx, messages.StreamRuns, jetstream.ConsumerConfig{
			Durable:     messages.ConsumerName(cfg.Pool),
			Description: "jetcrew workers of pool " + cfg.Pool,
			// The pool's requests, and its operators' replays.
			FilterSubjects: []string{messages.SubjectRuns(cfg.Pool), messages.SubjectReplay(cfg.Pool)},
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        cfg.AckWait,
			MaxDeliver:     cfg.MaxDeliver,
			MaxAckPending:  cfg.MaxAckPending,
			DeliverPolicy:  jetstream.DeliverAllPolicy,
			Replicas:       cfg.Replicas,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("provision consumer %s: %w", messages.ConsumerName(cfg.Pool), err)
	}
	return cons, nil
}

// streamConfigs are the streams Provision creates: JETCREW_RUNS,
// JETCREW_EVENTS and JETCREW_FAILED.
func streamConfigs(cfg ProvisionConfig) []jetstream.StreamConfig {
	return []jetstream.StreamConfig{{
		Name:        messages.StreamRuns,
		Description: "jetcrew run requests: jetcrew.runs.<pool>, and operators' replays on jetcrew.runs.<pool>.replay",
		Subjects:    []string{messages.SubjectRunsPrefix + ".>"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
		AllowDirect: true,
		MaxBytes:    cfg.RunsMaxBytes,
		MaxMsgSize:  messages.MaxRequestMsgBytes,
		MaxAge:      cfg.RunsMaxAge,
		// Full, or the pool full: refuse the submit rather than drop a
		// queued request.
		Discard:              jetstream.DiscardNew,
		MaxMsgsPerSubject:    cfg.RunsMaxPerPool,
		DiscardNewPerSubject: cfg.RunsMaxPerPool > 0,
	}, {
		Name:        messages.StreamEvents,
		Description: "jetcrew run events",
		Subjects:    []string{messages.SubjectEventsPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.EventsMaxAge,
		MaxBytes:    cfg.EventsMaxBytes,
		AllowDirect: true,
		Discard:     jetstream.DiscardOld,
	}, {
		Name:        messages.StreamFailed,
		Description: "jetcrew dead letters: failed run requests, body as submitted",
		Subjects:    []string{messages.SubjectFailedPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.FailedMaxAge,
		MaxBytes:    cfg.FailedMaxBytes,
		Duplicates:  cfg.DuplicateWindow,
		AllowDirect: true,
		Discard:     jetstream.DiscardOld,
	}}
}

// bucketConfigs are the key-value buckets Provision creates: the run
// states, the workers' heartbeats, the shared budgets and egress_ask's
// questions and answers.
func bucketConfigs(cfg ProvisionConfig) []jetstream.KeyValueConfig {
	return []jetstream.KeyValueConfig{{
		Bucket:      messages.BucketRuns,
		Description: "jetcrew run states, one key per run id",
		History:     5,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}, {
		Bucket:      messages.BucketWorkers,
		Description: "jetcrew live workers (heartbeats)",
		History:     1,
		TTL:         messages.WorkerTTL,
		Storage:     jetstream.MemoryStorage,
		Replicas:    cfg.Replicas,
	}, {
		Bucket:      messages.BucketBudgets,
		Description: "jetcrew shared model budgets (groups', pools') by window, and operators' grants",
		History:     1,
		TTL:         messages.BudgetKeyMaxAge,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}, {
		Bucket:      messages.BucketEgressAsks,
		Description: "jetcrew egress_ask: connections waiting for an operator, and the answers",
		History:     1,
		TTL:         messages.EgressAskMaxAge,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}, {
		Bucket:      messages.BucketEgressApprovals,
		Description: "jetcrew egress_ask: operators' answers for a profile from now on",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}}
}

// provisionAttemptTimeout bounds one try of creating a stream, bucket or
// consumer: on a new R3 cluster one can take longer than the JetStream API's
// 5 second default. A try cut short is harmless (the server goes on, and the
// next try of the same configuration succeeds), while a long one stalls a
// worker whose request was lost to a node restart.
const provisionAttemptTimeout = 10 * time.Second

// retryProvision is retryOp for provisioning calls: 10 seconds a try, for up
// to 3 minutes; each failed try is told to ctx's provisionNotify.
func retryProvision(ctx context.Context, op func(ctx context.Context) error) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 500 * time.Millisecond
	b.MaxInterval = 10 * time.Second
	b.MaxElapsedTime = 3 * time.Minute
	return backoff.RetryNotify(func() error {
		actx, cancel := context.WithTimeout(ctx, provisionAttemptTimeout)
		defer cancel()
		err := op(actx)
		if err != nil && ctx.Err() != nil {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(b, ctx), provisionNotify(ctx))
}

// ErrPoolOverLimit is wrapped by the error Provision returns when a subject
// of an existing JETCREW_RUNS holds more requests than the per-pool limit
// it would set (ProvisionConfig.RunsMaxPerPool): JetStream applies a lower
// per-subject limit by dropping the oldest messages, queued requests here.
var ErrPoolOverLimit = errors.New("a pool holds more requests than the per-pool limit")

// checkPoolsFit refuses, with an error wrapping ErrPoolOverLimit, a
// per-pool limit (limit; -1: none) below what a subject of the existing
// JETCREW_RUNS holds. A stream that does not exist yet, or whose own limit
// is already as low, passes without reading its subjects. Another client
// publishing between this check and the update can still lose its oldest
// requests past the limit.
func checkPoolsFit(ctx context.Context, js jetstream.JetStream, limit int64) error {
	if limit <= 0 {
		return nil
	}
	var info *jetstream.StreamInfo
	err := retryProvision(ctx, func(ctx context.Context) error {
		s, err := js.Stream(ctx, messages.StreamRuns)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if old := s.CachedInfo().Config.MaxMsgsPerSubject; old > 0 && old <= limit {
			return nil
		}
		info, err = s.Info(ctx, jetstream.WithSubjectFilter(messages.SubjectRunsPrefix+".>"))
		return err
	})
	if err != nil {
		return fmt.Errorf("provision stream %s: read its subjects: %w", messages.StreamRuns, err)
	}
	if info == nil {
		return nil
	}
	subjects := make([]string, 0, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		if n > uint64(limit) {
			subjects = append(subjects, subj)
		}
	}
	if len(subjects) == 0 {
		return nil
	}
	slices.Sort(subjects)
	subj := subjects[0]
	return fmt.Errorf("provision stream %s: %w: %s holds %d requests (%d subject(s) over), more than the per-pool limit %d, and JetStream would drop the oldest; start with a per-pool limit of at least %d (--runs-max-per-pool, -1 for none) or let the pool drain",
		messages.StreamRuns, ErrPoolOverLimit, subj, info.State.Subjects[subj], len(subjects), limit, maxCount(info.State.Subjects))
}

// maxCount returns the largest count of counts.
func maxCount(counts map[string]uint64) uint64 {
	var m uint64
	for _, n := range counts {
		m = max(m, n)
	}
	return m
}
