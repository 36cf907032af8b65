package runner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// Adoption: a run whose worker stopped or died goes on in its container,
// and a worker on the same engine takes it over (issue 38). The adopter
// proves the container is the run's (its record names the container, the
// attempt on its label is the record's, the record holds a lease), fences the record (a compare-and-set that makes
// it the run's holder: the worker it was adopted from can never write
// again), rebuilds the run from its record and request as a delivery
// would, lets every stage take its part over (stage.Adopter), re-attaches
// to the container's output from where the last worker stopped
// publishing, and supervises and concludes the run as if it had started
// it, acknowledging the request on the lease.

// AdoptVerdict is what Adopt did with a run's container.
type AdoptVerdict int

const (
	// NotAdoptable: the container is not a run this worker can adopt
	// (Reason says why); the caller handles it as an orphan, as before
	// adoption existed.
	NotAdoptable AdoptVerdict = iota
	// Adopted: the run goes on here.
	Adopted
	// HeldElsewhere: the run is live here already, or another live
	// worker holds it (adopted it first): the container is left alone.
	HeldElsewhere
)

// AdoptResult is Adopt's answer.
type AdoptResult struct {
	Verdict AdoptVerdict
	// Reason says why a container is not adoptable.
	Reason string
	// Ended is set, with NotAdoptable, when the run's record is final
	// (it ended, or a cancel finalised it while no worker held it): its
	// container serves nothing and goes at once.
	Ended bool
}

// containerAdopter is what Adopt uses of the runtime: one that can take
// over a container another process started (worker/docker's, the fake of
// worker/workertest).
type containerAdopter interface {
	Adopt(ctx context.Context, id string, output jail.OutputFunc) (jail.Container, jail.Found, error)
}

// adoptAskWait is how long Adopt waits for the worker a run's record
// names, though it has no heartbeat, to say it holds the run
// (askHolder): a live worker answers at once. A worker that answered
// nothing is taken for dead for silentFor: its other runs are adopted
// without waiting again (a worker alive without its heartbeat that lost
// one run but holds another would lose that one too; it then leaves the
// container to the adopter once its record is fenced, runner's lost).
const (
	adoptAskWait = 500 * time.Millisecond
	silentFor    = 10 * time.Second
)

// AdoptCandidate is a run container a worker found orphaned on its
// engine: its id and labels (jail.ManagedContainer's).
type AdoptCandidate struct {
	ID     string
	Labels map[string]string
}

// Adopt takes over the run of container c when it can, and then runs it
// to its outcome in a goroutine spawn starts (the worker's, so that its
// stop waits for it); alive reports whether a worker has a heartbeat. A
// NATS or engine error is returned: the container is kept and tried
// again later.
func (e *Runner) Adopt(ctx context.Context, c AdoptCandidate, alive func(context.Context, string) (bool, error), spawn func(func(context.Context)) bool) (AdoptResult, error) {
	runID := c.Labels[jail.LabelRunID]
	if runID == "" {
		return notAdoptable("no run id on its labels"), nil
	}
	if e.Holds(runID) {
		// Live here. (A delivery of its request being decided is not:
		// the record's compare-and-set settles which of the two holds
		// the run.)
		return AdoptResult{Verdict: HeldElsewhere}, nil
	}
	st, rev, err := e.cfg.Store.Load(ctx, runID)
	switch {
	case runstate.IsNotFound(err):
		return notAdoptable("the run has no record"), nil
	case err != nil:
		return AdoptResult{}, err
	}
	if res, ok := e.proveOwnership(ctx, c, st, alive); !ok {
		return res, nil
	}
	r, res, err := e.rebuild(ctx, c, st, rev)
	if err != nil || res.Verdict != Adopted {
		return res, err
	}
	if !spawn(func(ctx context.Context) { adoption{r}.carry(ctx, c.ID) }) {
		e.live.untrack(r)
		return AdoptResult{Verdict: HeldElsewhere}, nil
	}
	return res, nil
}

// holdsContainer reports whether r holds its run's container: it started
// it, or adopted the run.
func holdsContainer(r *run) bool { return r.adoptedFrom != "" || r.ctl.current() != nil }

// removeAdoptedRequest deletes an adopted run's request from the runs
// stream once its outcome is recorded and acknowledged on the lease: a
// request whose last delivery ran out while no worker held the run is no
// longer pending on the consumer (nats-server drops it at MaxDeliver), so
// the ack removes nothing, and the dead-letterer left it to this worker
// (worker's liveRun). Not found counts as removed.
func removeAdoptedRequest(ctx context.Context, r *run) {
	if r.adoptedFrom == "" {
		return
	}
	stream, err := r.e.cfg.JS.Stream(ctx, messages.StreamRuns)
	if err == nil {
		err = stream.DeleteMsg(ctx, r.meta.Sequence.Stream)
	}
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		r.log.Warn().Err(err).Msg("remove the adopted run's request")
	}
}

// silent reports whether worker answered no hold query within the last
// silentFor.
func (e *Runner) silent(worker string) bool {
	e.silentMu.Lock()
	defer e.silentMu.Unlock()
	at, ok := e.silentSince[worker]
	return ok && time.Since(at) < silentFor
}

// markSilent notes that worker answered no hold query now.
func (e *Runner) markSilent(worker string) {
	e.silentMu.Lock()
	defer e.silentMu.Unlock()
	if e.silentSince == nil {
		e.silentSince = map[string]time.Time{}
	}
	for w, at := range e.silentSince {
		if time.Since(at) >= silentFor {
			delete(e.silentSince, w)
		}
	}
	if _, ok := e.silentSince[worker]; !ok {
		e.silentSince[worker] = time.Now()
	}
}

// notAdoptable returns the verdict NotAdoptable for reason.
func notAdoptable(reason string) AdoptResult {
	return AdoptResult{Verdict: NotAdoptable, Reason: reason}
}

// proveOwnership checks that container c is the live container of the run
// recorded as st, and that no live worker holds it.
func (e *Runner) proveOwnership(ctx context.Context, c AdoptCandidate, st messages.RunState, alive func(context.Context, string) (bool, error)) (AdoptResult, bool) {
	switch {
	case st.State.Final():
		return AdoptResult{Verdict: NotAdoptable, Ended: true, Reason: fmt.Sprintf("the run is %s", st.State)}, false
	case st.State != messages.StateRunning:
		return notAdoptable(fmt.Sprintf("the run is %s, not running", st.State)), false
	case st.ContainerID != c.ID:
		return notAdoptable("the run's record names another container"), false
	case c.Labels[jail.LabelAttempt] != strconv.Itoa(st.Attempts):
		return notAdoptable(fmt.Sprintf("the container is of attempt %s, the record of %d", c.Labels[jail.LabelAttempt], st.Attempts)), false
	case st.Lease == "":
		return notAdoptable("the record holds no lease (started by a worker before adoption existed)"), false
	}
	if st.Worker != e.cfg.WorkerID {
		up, err := alive(ctx, st.Worker)
		if err != nil || up {
			// A live worker holds it (it adopted the run first), or
			// whether it does cannot be told now.
			return AdoptResult{Verdict: HeldElsewhere}, false
		}
		// No heartbeat: yet its worker may be alive, its heartbeat's
		// writes failing. One that answers for the run holds it.
		if !e.silent(st.Worker) && e.askHolder(st.ID, adoptAskWait) {
			return AdoptResult{Verdict: HeldElsewhere}, false
		}
		e.markSilent(st.Worker)
	}
	return AdoptResult{}, true
}

// rebuild makes the run of container c from its record st (at revision
// rev) and its request, read back from the runs stream, and fences the
// record: from then on this worker holds the run.
func (e *Runner) rebuild(ctx context.Context, c AdoptCandidate, st messages.RunState, rev uint64) (*run, AdoptResult, error) {
	stream, err := e.cfg.JS.Stream(ctx, messages.StreamRuns)
	if err != nil {
		return nil, AdoptResult{}, err
	}
	raw, err := stream.GetMsg(ctx, st.StreamSeq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, notAdoptable("its request is no longer in the stream"), nil
	case err != nil:
		return nil, AdoptResult{}, err
	}
	msg := &leaseMsg{nc: e.cfg.NC, subject: raw.Subject, data: raw.Data, header: raw.Header, reply: st.Lease,
		meta: jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: st.StreamSeq}, NumDelivered: uint64(st.Attempts),
			Stream: messages.StreamRuns, Timestamp: st.QueuedAt}}
	meta, _ := msg.Metadata()
	r, _, decErr := e.newRun(msg, meta)
	if decErr != nil || r.req.ID != st.ID {
		return nil, notAdoptable("its request does not decode to the run"), nil
	}
	prof, ok := e.currentProfiles()[r.req.Profile]
	if !ok {
		return nil, notAdoptable(fmt.Sprintf("profile %q is not this worker's", r.req.Profile)), nil
	}
	from := st.Worker
	r.rec.st, r.rec.rev, r.rec.from = st, rev, st.State
	r.prevContainer = st.ContainerID
	plan, err := prof.Plan(r.req.Prompt, prof.CoordinationOn())
	if err != nil {
		return nil, notAdoptable(err.Error()), nil
	}
	r.sr = &stage.Run{Request: r.req, Profile: &prof, Plan: plan, Seq: st.StreamSeq, Attempt: st.Attempts,
		Timeout: runTimeout(r.req, &prof, e.cfg.DefaultTimeout), Labels: c.Labels, Progress: &stage.Progress{},
		Holds: e.cfg.Live.For(live.Run(r.req.ID)), Log: r.log, Failpoint: e.cfg.Failpoint}
	r.stages = e.stagesFor(r.sr)
	if why := unadoptable(r.stages); why != "" {
		return nil, notAdoptable(why), nil
	}
	for _, s := range r.stages {
		if n, ok := s.(stage.Noter); ok {
			r.rec.noters = append(r.rec.noters, n)
		}
	}
	if st.Warm {
		return nil, notAdoptable("it started in a warm container"), nil
	}
	r.adoptedFrom, r.gap = from, time.Since(st.UpdatedAt)
	e.live.track(r, nil)
	// The fence: a compare-and-set against the revision read.
	r.rec.st.Worker, r.rec.st.Lease = e.cfg.WorkerID, st.Lease
	r.rec.st.Adoptions++
	if err := r.rec.put(ctx); err != nil {
		e.live.untrack(r)
		if errors.Is(err, runstate.ErrFenced) {
			return nil, AdoptResult{Verdict: HeldElsewhere}, nil
		}
		return nil, AdoptResult{}, err
	}
	r.startReached, r.startCommitted = true, true
	return r, AdoptResult{Verdict: Adopted}, nil
}

// unadoptable says why a run with these stages cannot be adopted: one of
// them makes or serves something at the start (a Prestarter, a
// Poststarter) and cannot take it over (not an Adopter); "" when none.
func unadoptable(stages []stage.Stage) string {
	for _, s := range stages {
		_, pre := s.(stage.Prestarter)
		_, post := s.(stage.Poststarter)
		if _, ok := s.(stage.Adopter); !ok && (pre || post) {
			return fmt.Sprintf("its %s stage cannot be adopted yet", s.Name())
		}
	}
	return ""
}

// MayBeAdopted reports whether the run recorded as st, of request req,
// could be adopted by a successor of its worker (its stages can all be
// taken over, it did not start warm): only then is a redelivery of its
// request handed back for the adoption grace (leaveToHolder).
func (e *Runner) MayBeAdopted(req messages.RunRequest, st messages.RunState) bool {
	prof, ok := e.currentProfiles()[req.Profile]
	if !ok || st.Warm {
		return false
	}
	plan, err := prof.Plan(req.Prompt, prof.CoordinationOn())
	if err != nil {
		return false
	}
	return unadoptable(e.stagesFor(&stage.Run{Request: req, Profile: &prof, Plan: plan})) == ""
}

// adoption is an adopted run as it is taken over: its steps before it is
// supervised and concluded as any run is.
type adoption struct{ *run }

// carry runs an adopted run to its outcome: the stages take their parts
// over, the container is re-attached from where its output was last
// published, and it is supervised and concluded as any run is.
func (r adoption) carry(ctx context.Context, containerID string) {
	defer r.e.live.untrack(r.run)
	defer func() { r.release(r.rec.st.State.Final()) }()
	d := delivery{r.run}
	stopProgress := d.keepInProgress()
	defer stopProgress()
	p, s, err := r.takeOver(ctx, containerID)
	if err != nil {
		r.log.Warn().Err(err).Msg("adopted run could not be taken over; stopping it to run again")
		if c := r.ctl.current(); c != nil {
			_, _ = r.ctl.stopAndWait(c)
		}
		r.rec.st.ContainerID = ""
		r.abort(ctx, stage.Transient(fmt.Errorf("adopt: %w", err)))
		return
	}
	r.event(ctx, messages.Event{Type: messages.EventAdopted, ContainerID: containerID, AdoptedFrom: r.adoptedFrom,
		GapMS: r.gap.Milliseconds()})
	r.log.Info().Str("container_id", shortID(containerID)).Str("from", r.adoptedFrom).Dur("gap", r.gap).Msg("run adopted")
	facts := r.supervise(ctx, p, s)
	r.conclude(ctx, p, facts)
}

// takeOver re-attaches to the run's container and lets each stage adopt
// its part; it returns what supervise needs.
func (r adoption) takeOver(ctx context.Context, containerID string) (prepared, started, error) {
	e := r.e
	// The spec the run's container was made from, as far as the profile
	// says (its limits, for the outcome's reasons).
	p := prepared{prof: r.sr.Profile, spec: BuildSpec(SpecInput{Profile: r.sr.Profile, Request: r.req, Seq: r.sr.Seq,
		Attempt: r.sr.Attempt, WorkerID: e.cfg.WorkerID, Install: e.cfg.Install, Now: r.rec.st.StartedAt, Plan: r.sr.Plan})}
	rt, ok := e.cfg.Runtime.(containerAdopter)
	if !ok {
		return p, started{}, errors.New("the runtime cannot adopt containers")
	}
	s := started{
		parser: newParser(r.run, p.prof.Backend),
		out:    newOutputPublisher(e.cfg.JS, r.req.ID, r.meta.Sequence.Stream, int(r.meta.NumDelivered)),
	}
	s.out.budget = p.prof.MaxOutputBytes()
	seq, ends, err := lastOutput(ctx, e.cfg.JS, r.req.ID, r.meta.Sequence.Stream, r.rec.st.Attempts)
	if err != nil {
		return p, s, fmt.Errorf("read the run's last output: %w", err)
	}
	s.out.resume(seq, ends)
	s.out.onStdout = s.parser.Feed
	s.out.onSkipped = func(b []byte) {
		r.replaying.Store(true)
		s.parser.Feed(b)
		r.replaying.Store(false)
	}
	prog := r.sr.Progress
	prog.Touch()
	// The masker is the secrets stage's, made by its Adopt below: the
	// output waits for it (the runtime replays the log from the start).
	ready := make(chan struct{})
	output := func(stream string, b []byte) {
		<-ready
		prog.Touch()
		s.out.write(stream, b)
	}
	c, found, err := rt.Adopt(ctx, containerID, output)
	if err != nil {
		close(ready)
		_, _ = s.out.close(ctx)
		return p, s, err
	}
	s.c = c
	r.ctl.set(c)
	e.live.track(r.run, c)
	err = r.adoptStages(ctx, c, found, p.spec)
	s.out.mask = r.mask
	close(ready)
	if err != nil {
		return p, s, err
	}
	return p, s, nil
}

// adoptStages calls each Adopter with what it takes over; spec is the
// run container's spec as takeOver rebuilt it (the container's own name
// and labels put in).
func (r adoption) adoptStages(ctx context.Context, c jail.Container, found jail.Found, spec jail.ContainerSpec) error {
	spec.Name, spec.Labels = found.Name, maps.Clone(found.Labels)
	var runDir string
	for _, m := range found.Mounts {
		if m.Target == messages.ContainerRunDir {
			runDir = m.Source
		}
	}
	var dir stage.Dir
	for _, s := range r.stages {
		a, ok := s.(stage.Adopter)
		if !ok {
			continue
		}
		var resp stage.PrestartResponse
		if err := a.Adopt(ctx, &stage.AdoptRequest{Run: r.sr, State: r.rec.st, RunDir: runDir, Mounts: found.Mounts, Spec: &spec,
			Container: c, Dir: dir, Mask: r.mask}, &resp); err != nil {
			return fmt.Errorf("%s: %w", s.Name(), err)
		}
		if resp.Dir != nil {
			dir = resp.Dir
		}
		if resp.Mask != nil {
			r.mask = resp.Mask
		}
	}
	return nil
}

// lastOutput returns where the run's output stood in its last stored
// output event of attempt of the request at stream sequence reqSeq: the
// event's messages.HeaderSeq and each stream's end
// (messages.HeaderOutputEnds); zeros when that attempt published none
// (the last output event is of an earlier attempt, or request: its
// message id, outputPublisher's, says which).
func lastOutput(ctx context.Context, js jetstream.JetStream, runID string, reqSeq uint64, attempt int) (uint64, [2]int64, error) {
	var ends [2]int64
	stream, err := js.Stream(ctx, messages.StreamEvents)
	if err != nil {
		return 0, ends, err
	}
	m, err := stream.GetLastMsgForSubject(ctx, messages.SubjectEvents(runID, messages.EventOutput))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, ends, nil
	case err != nil:
		return 0, ends, err
	}
	prefix := "out-" + runID + "-" + strconv.FormatUint(reqSeq, 10) + "-" + strconv.Itoa(attempt) + "-"
	if !strings.HasPrefix(m.Header.Get(jetstream.MsgIDHeader), prefix) {
		return 0, ends, nil // an earlier attempt's, or request's
	}
	seq, err := strconv.ParseUint(m.Header.Get(messages.HeaderSeq), 10, 64)
	if err != nil {
		return 0, ends, fmt.Errorf("output event without %s", messages.HeaderSeq)
	}
	out, errOut, ok := strings.Cut(m.Header.Get(messages.HeaderOutputEnds), ",")
	if !ok {
		return 0, ends, fmt.Errorf("output event without %s (published by a worker before adoption existed)", messages.HeaderOutputEnds)
	}
	if ends[0], err = strconv.ParseInt(out, 10, 64); err == nil {
		ends[1], err = strconv.ParseInt(errOut, 10, 64)
	}
	return seq, ends, err
}

// departure is a run this worker gives up with its container running: left
// for a successor to adopt (the worker stops with SIGUSR2), or adopted
// from it while it was cut off.
type departure struct{ *run }

// leave ends this worker's part in a run it leaves, its container
// running, to a successor that adopts it: the stages' latest parts of
// the record (usage, the bridge) are written, so the successor goes on
// from them, and each stage gives up what lives in this process only
// (stage.ReleaseRequest.Leave). The record is written again after the
// releases: what a stage settled as it let go (the egress proxy's
// requests in flight) is in it. The request is neither acknowledged nor
// handed back: the successor holds it on the run's lease.
func (r departure) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runstate.OpMaxElapsed)
	defer cancel()
	if err := r.rec.put(ctx); err != nil {
		r.log.Warn().Err(err).Msg("record the run before leaving it")
	}
	if r.releaseLeaving() {
		if err := r.rec.put(ctx); err != nil {
			r.log.Warn().Err(err).Msg("record the run as it was left")
		}
	}
	r.log.Info().Msg("run left running for a successor to adopt")
}

// adoptedAway reports whether prev, the run's record read after this
// delivery's write was fenced, says a successor adopted the run in this
// delivery's container (this worker was cut off: its heartbeat expired
// and it did not answer for the run).
func (r departure) adoptedAway(prev messages.RunState) bool {
	c := r.ctl.current()
	return c != nil && prev.State == messages.StateRunning && prev.ContainerID == c.ID() && prev.Adoptions > r.rec.st.Adoptions
}

// leaveToAdopter ends this delivery's part in a run a successor adopted
// from it: the container, and what it mounts, are the adopter's, so it
// detaches and releases as a worker leaving the run (stage.ReleaseRequest
// Leave), recording nothing and neither acking nor handing the request
// back (the adopter holds it on the lease).
func (r departure) leaveToAdopter(ctx context.Context, out *outputPublisher, adopter string) {
	if c := r.ctl.current(); c != nil {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := c.Detach(dctx); err != nil {
			r.log.Warn().Err(err).Msg("detach from the container adopted from this worker")
		}
		cancel()
	}
	if out != nil {
		out.left.Store(true)
		_, _ = out.close(ctx)
	}
	r.releaseLeaving()
	r.log.Warn().Str("adopter", adopter).Msg("run adopted from this worker while it was cut off; leaving its container to the adopter")
}

// releaseLeaving lets each stage give up, once, what lives in this
// process only (stage.ReleaseRequest.Leave), keeping what the container
// uses; it reports whether it did (release had not run).
func (r departure) releaseLeaving() bool {
	released := false
	r.releaseOnce.Do(func() {
		released = true
		req := stage.ReleaseRequest{Run: r.sr, Leave: true}
		for _, s := range slices.Backward(r.stages) {
			if rel, ok := s.(stage.Releaser); ok {
				rel.Release(&req)
			}
		}
	})
	return released
}
