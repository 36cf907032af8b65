package coordination

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/messages"
)

// MaxClaimsPerGroupLimit is the largest Config.MaxClaimsPerGroup: a group's
// claims are one value in BucketClaims, and 256 claims of the longest
// pattern and reason, every byte JSON-escaped (about 3.2 KiB each), stay
// under NATS's default 1 MiB payload.
const MaxClaimsPerGroupLimit = 256

// Config configures a Host. Zero fields take the documented defaults (see
// WithDefaults).
type Config struct {
	// Logger receives structured logs. Default: a disabled logger.
	Logger *zerolog.Logger
	// OnEvent, when set, receives every coordination event of every
	// session: the worker records them on the run's event subject. It is
	// called synchronously from the goroutine serving the bridge's request,
	// possibly from several goroutines at once, so it must be safe for
	// concurrent use and must not block for long.
	OnEvent func(Event)
	// SendRate is how many send calls per second one run may make, on
	// average, refused ones included. Default 1; negative means unlimited.
	// A call past it is refused with code rate_limited; such refusals are
	// counted (Event.Count), not reported one by one.
	SendRate float64
	// SendBurst is how many send calls a run may make at once before
	// SendRate applies. Default 10.
	SendBurst int
	// OpTimeout bounds each NATS operation a request makes (an inbox call's
	// wait comes on top). Default 5 seconds.
	OpTimeout time.Duration
	// InboxInactiveThreshold is how long an inbox consumer may go unused
	// before the server deletes it: the safety net for a worker that died
	// without closing its sessions. It must outlast the longest run
	// (messages.MaxTimeout) including its retries. Default 48 hours.
	InboxInactiveThreshold time.Duration
	// RequestReadTimeout bounds reading one whole request from a run's
	// socket, headers and body. Default RequestReadTimeout (10 seconds).
	RequestReadTimeout time.Duration
	// ReadRate is how many status, inbox and claims calls per second one run may
	// make, on average. Default 1; negative means unlimited.
	ReadRate float64
	// ReadBurst is how many status, inbox and claims calls a run may make at once
	// before ReadRate applies. Default 10.
	ReadBurst int
	// ClaimRate is how many claim and release calls per second one run
	// may make, on average, refused ones included. Default 1; negative
	// means unlimited. The claims call counts as a read (ReadRate).
	ClaimRate float64
	// ClaimBurst is how many claim and release calls a run may make at
	// once before ClaimRate applies. Default 10.
	ClaimBurst int
	// MaxClaimsPerRun is the most patterns one run may hold claimed.
	// Default 64.
	MaxClaimsPerRun int
	// MaxClaimsPerGroup is the most patterns the runs of one group may
	// hold claimed together, at most MaxClaimsPerGroupLimit. Default 256.
	MaxClaimsPerGroup int
	// Questions configures the ask and reply calls.
	Questions QuestionConfig
	// SteerRate is how many steers per second one run takes, on average,
	// refused ones included (steer.go). Default SteerRate (1); negative
	// means unlimited.
	SteerRate float64
	// SteerBurst is how many steers a run takes at once before SteerRate
	// applies. Default SteerBurst (5).
	SteerBurst int
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Logger == nil {
		l := zerolog.Nop()
		c.Logger = &l
	}
	c.SendRate = cmp.Or(c.SendRate, 1)
	c.SendBurst = cmp.Or(c.SendBurst, 10)
	c.OpTimeout = cmp.Or(c.OpTimeout, 5*time.Second)
	c.RequestReadTimeout = cmp.Or(c.RequestReadTimeout, RequestReadTimeout)
	c.ReadRate = cmp.Or(c.ReadRate, 1)
	c.ReadBurst = cmp.Or(c.ReadBurst, 10)
	c.ClaimRate = cmp.Or(c.ClaimRate, 1)
	c.ClaimBurst = cmp.Or(c.ClaimBurst, 10)
	c.MaxClaimsPerRun = cmp.Or(c.MaxClaimsPerRun, 64)
	c.MaxClaimsPerGroup = cmp.Or(c.MaxClaimsPerGroup, MaxClaimsPerGroupLimit)
	c.InboxInactiveThreshold = cmp.Or(c.InboxInactiveThreshold, 48*time.Hour)
	c.Questions = c.Questions.withDefaults()
	c.SteerRate = cmp.Or(c.SteerRate, SteerRate)
	c.SteerBurst = cmp.Or(c.SteerBurst, SteerBurst)
	return c
}

func (c Config) validate() error {
	if c.SendBurst < 1 {
		return fmt.Errorf("coordination: send burst %d must be at least 1", c.SendBurst)
	}
	if c.OpTimeout < 100*time.Millisecond {
		return fmt.Errorf("coordination: op timeout %s must be at least 100ms", c.OpTimeout)
	}
	if c.InboxInactiveThreshold < time.Minute {
		return fmt.Errorf("coordination: inbox inactive threshold %s must be at least 1m", c.InboxInactiveThreshold)
	}
	if c.ReadBurst < 1 {
		return fmt.Errorf("coordination: read burst %d must be at least 1", c.ReadBurst)
	}
	if c.RequestReadTimeout < 10*time.Millisecond {
		return fmt.Errorf("coordination: request read timeout %s must be at least 10ms", c.RequestReadTimeout)
	}
	if c.SteerBurst < 1 {
		return fmt.Errorf("coordination: steer burst %d must be at least 1", c.SteerBurst)
	}
	if math.IsNaN(c.SendRate) || math.IsNaN(c.ReadRate) || math.IsNaN(c.ClaimRate) || math.IsNaN(c.SteerRate) {
		return errors.New("coordination: a call rate is NaN")
	}
	if c.ClaimBurst < 1 {
		return fmt.Errorf("coordination: claim burst %d must be at least 1", c.ClaimBurst)
	}
	if c.MaxClaimsPerRun < 1 || c.MaxClaimsPerGroup < c.MaxClaimsPerRun || c.MaxClaimsPerGroup > MaxClaimsPerGroupLimit {
		return fmt.Errorf("coordination: claims per run %d and per group %d must be at least 1 and at most the group's, which is at most %d", c.MaxClaimsPerRun, c.MaxClaimsPerGroup, MaxClaimsPerGroupLimit)
	}
	return c.Questions.validate()
}

// Host serves the coordination sessions of one worker's runs: one unix
// socket per run, each relayed onto NATS as that run. Create it with NewHost;
// it is safe for concurrent use and owns no goroutine of its own (each
// Session owns its own, ended by Session.Detach or Session.Close).
type Host struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	log zerolog.Logger

	peers     kvBucket // BucketPeers, looked up by the first Serve
	claims    kvBucket // BucketClaims, looked up by the first claim call
	questions kvBucket // BucketQuestions, looked up by the first ask or reply

	mu       sync.Mutex
	sessions map[string]*Session
}

// kvBucket is one key-value bucket a Host or Groups looks up once, on its
// first use, and keeps.
type kvBucket struct {
	name string
	mu   sync.Mutex
	kv   jetstream.KeyValue
}

// get returns the bucket, looking it up in js on the first call. It fails
// when the bucket does not exist (Provision makes it) or NATS is
// unreachable; a later call tries again.
func (b *kvBucket) get(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kv != nil {
		return b.kv, nil
	}
	kv, err := js.KeyValue(ctx, b.name)
	if err != nil {
		return nil, fmt.Errorf("bucket %s (run coordination.Provision first): %w", b.name, err)
	}
	b.kv = kv
	return kv, nil
}

// NewHost returns a Host using nc, configured by cfg with defaults applied.
// It returns an error for an invalid configuration; it does no I/O. The
// JetStream resources must exist (Provision) before the first Serve.
func NewHost(nc *nats.Conn, cfg Config) (*Host, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("coordination: %w", err)
	}
	return &Host{
		cfg:       cfg,
		nc:        nc,
		js:        js,
		log:       cfg.Logger.With().Str("component", "coordination").Logger(),
		peers:     kvBucket{name: BucketPeers},
		claims:    kvBucket{name: BucketClaims},
		questions: kvBucket{name: BucketQuestions},
		sessions:  make(map[string]*Session),
	}, nil
}

// RunInfo identifies the run a Session acts as.
type RunInfo struct {
	// RunID is the run's id: a subject token (messages.ValidateToken),
	// neither "all" nor "operator".
	RunID string
	// Pool is the run's pool (messages.DefaultPool when empty), and Group
	// its coordination group in it (RunRequest.GroupOrID): together they
	// name the group, the run's own when Group is its id (GroupRef).
	Pool, Group string
	// Profile is the run's profile name.
	Profile string
	// State is the state the run joins its group's presence list with.
	// Default messages.StateQueued; Session.SetState changes it.
	State messages.State
	// StartedAt is when the run's container started; zero while queued.
	StartedAt time.Time
	// Adopted says the run's container was started by another worker
	// process, whose session this one takes over (a worker adopting the
	// run, issue 38): it goes on under the presence session id the
	// earlier session wrote, so the claims and questions the run made
	// there stay its own: its claims are released when it ends, and its
	// questions still open wait on here, their answers put in its inbox
	// (lateanswer.go).
	Adopted bool
}

func (r RunInfo) validate() error {
	if err := messages.ValidateName("run id", r.RunID); err != nil {
		return err
	}
	if r.RunID == RecipientAll || r.RunID == RecipientOperator {
		return fmt.Errorf("run id %q is reserved for coordination recipients", r.RunID)
	}
	if err := r.GroupRef().Validate(); err != nil {
		return err
	}
	if r.Profile != "" {
		if err := messages.ValidateToken("profile", r.Profile); err != nil {
			return err
		}
	}
	return nil
}

// GroupRef returns the run's group: its pool and group, its own when Group
// is its run id (a request's group is never its own id).
func (r RunInfo) GroupRef() messages.GroupRef {
	return messages.GroupRef{Pool: r.Pool, Name: r.Group, Own: r.Group == r.RunID}
}

// register records s as run's live session and returns the session it
// supersedes, if any: a later delivery of the run on this host (the earlier
// one lost the run and is winding down). The caller detaches that one.
func (h *Host) register(s *Session) *Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.sessions[s.RunID()]
	h.sessions[s.RunID()] = s
	return old
}

func (h *Host) unregister(s *Session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sessions[s.RunID()] == s {
		delete(h.sessions, s.RunID())
	}
}

// inboxConfig is the durable consumer holding run's inbox.
func (h *Host) inboxConfig(run RunInfo) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:           InboxName(run.RunID),
		Description:       "jetcrew inbox of run " + run.RunID + " in group " + run.GroupRef().String(),
		FilterSubjects:    inboxFilters(run),
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           30 * time.Second,
		MaxAckPending:     1000,
		InactiveThreshold: h.cfg.InboxInactiveThreshold,
	}
}
