package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/roles"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// authEnv is a `jetcrew up --auth` (fake runtime) whose NATS CLI contexts
// live under xdg.
type authEnv struct {
	url, xdg, data string
	stdout         *syncBuffer
	rt             *workertest.Runtime
}

// authUp starts `jetcrew up --auth` with args until the test ends.
func authUp(t *testing.T, args ...string) authEnv {
	t.Helper()
	e := authEnv{xdg: t.TempDir(), data: t.TempDir(), rt: workertest.NewTestRuntime(t)}
	ctx, cancel := context.WithCancel(context.Background())
	up := newTestApp(map[string]string{"XDG_CONFIG_HOME": e.xdg}, e.rt)
	e.stdout = up.stdout
	done := make(chan int, 1)
	go func() {
		done <- up.run(ctx, append([]string{"up", "--auth", "--listen", "127.0.0.1:0", "--data", e.data, "--drain-timeout", "2s"}, args...))
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			require.Equal(t, 0, code, "up stderr: %s", up.stderr.String())
		case <-time.After(20 * time.Second):
			t.Error("up did not stop")
		}
		// The worker role has every permission the worker uses.
		require.NotContains(t, up.stderr.String(), "Permissions Violation")
	})
	require.Eventually(t, func() bool {
		m := regexp.MustCompile(`(?m)^NATS_URL=(nats://127\.0\.0\.1:\d+)$`).FindStringSubmatch(up.stdout.String())
		if m != nil {
			e.url = m[1]
		}
		return m != nil
	}, 15*time.Second, 20*time.Millisecond, "up stderr: %s", up.stderr.String())
	return e
}

// as runs one command line as role: NATS_CONTEXT=jetcrew-<role>, the URL
// from the context.
func (e authEnv) as(t *testing.T, role roles.Role, args ...string) (int, string, string) {
	t.Helper()
	a := newTestApp(map[string]string{"XDG_CONFIG_HOME": e.xdg, "NATS_CONTEXT": "jetcrew-" + string(role)}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	code := a.run(ctx, args)
	return code, a.stdout.String(), a.stderr.String()
}

// roleConn is a raw NATS connection as a role, with the server's async
// errors (permissions violations) on errs.
type roleConn struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

func (e authEnv) conn(t *testing.T, role roles.Role) roleConn {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(filepath.Join(e.data, authDirName, string(role)+".nk"))
	require.NoError(t, err)
	rc := roleConn{errs: make(chan error, 64)}
	rc.nc, err = nats.Connect(e.url, opt, nats.CustomInboxPrefix(roles.InboxPrefix(role)), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case rc.errs <- err:
		default:
		}
	}))
	require.NoError(t, err)
	t.Cleanup(rc.nc.Close)
	rc.js, err = jetstream.New(rc.nc)
	require.NoError(t, err)
	return rc
}

// errRefused is what try returns when the server refused the attempt.
var errRefused = errors.New("refused by the server")

// try runs do and returns nil when it succeeded, errRefused when the server
// reported a permissions violation naming subject (do is then cut short:
// a refused request would only time out), or do's error.
func (rc roleConn) try(subject string, do func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	denied := false
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case err := <-rc.errs:
				if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`) {
					mu.Lock()
					denied = true
					mu.Unlock()
					cancel()
					return
				}
			case <-stop:
				return
			}
		}
	}()
	before := rc.nc.LastError()
	err := do(ctx)
	if err == nil {
		// A core publish gets no answer: the server's -ERR comes before
		// the PONG of a flush, and the client records it (LastError)
		// before it reads the PONG.
		_ = rc.nc.FlushTimeout(2 * time.Second)
		if le := rc.nc.LastError(); le != nil && le != before && errors.Is(le, nats.ErrPermissionViolation) && strings.Contains(le.Error(), `"`+subject+`"`) {
			return errRefused
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if denied {
		return errRefused
	}
	return err
}

// The role matrix: each role against every operation jetcrew offers and the
// things it must not do, each attempt allowed or refused by the server.
func TestRoleMatrix(t *testing.T) {
	t.Parallel()
	e := authUp(t, "--concurrency", "2")

	// A failed run (for failed and replay) and a running one (for cancel).
	code, out, errOut := e.as(t, roles.Submitter, "submit", "--id", "failing", "--wait", "exit 3")
	require.Equal(t, 3, code, "submit as submitter: %s", errOut)
	code, _, errOut = e.as(t, roles.Submitter, "submit", "--id", "long", "sleep 1m")
	require.Equal(t, 0, code, errOut)
	_ = out

	type cliOp struct {
		name string
		args []string
		ok   []roles.Role // allowed; the others are refused
	}
	all := []roles.Role{roles.Submitter, roles.Operator, roles.Observer, roles.Worker}
	ops := []cliOp{
		{"submit", []string{"submit", "--wait", "out hi"}, []roles.Role{roles.Submitter, roles.Operator}},
		{"status", []string{"status", "failing"}, all},
		{"watch", []string{"watch", "failing"}, all},
		{"failed", []string{"failed"}, []roles.Role{roles.Operator, roles.Observer, roles.Worker}},
		// Before cancel: the run is running, and its shell takes no
		// streamed input (queued, exit 3).
		{"send", []string{"send", "long", "a steer"}, []roles.Role{roles.Operator}},
		{"cancel", []string{"cancel", "long"}, []roles.Role{roles.Operator}},
		{"questions", []string{"questions"}, []roles.Role{roles.Operator, roles.Observer, roles.Worker}},
		{"replay", []string{"replay", "failing"}, []roles.Role{roles.Operator}},
	}
	for _, op := range ops {
		for _, r := range []roles.Role{roles.Submitter, roles.Observer, roles.Worker, roles.Operator} {
			code, _, errOut := e.as(t, r, op.args...)
			if contains(op.ok, r) {
				want := 0
				switch op.name {
				case "watch":
					want = 3 // the run's own exit code
				case "send":
					want = exitSteerQueued
				}
				require.Equal(t, want, code, "%s as %s must be allowed: %s", op.name, r, errOut)
				continue
			}
			require.NotEqual(t, 0, code, "%s as %s must be refused", op.name, r)
			require.Contains(t, errOut, "Permissions Violation", "%s as %s: refused by the server", op.name, r)
		}
	}

	// What no role but one may do, tried raw on the bus.
	conns := map[roles.Role]roleConn{}
	for _, r := range all {
		conns[r] = e.conn(t, r)
	}
	raw := rawAttempts(t, conns[roles.Worker])
	for _, op := range raw {
		for _, r := range []roles.Role{roles.Submitter, roles.Observer, roles.Worker, roles.Operator} {
			err := op.do(conns[r])
			if contains(op.ok, r) {
				require.NoError(t, err, "%s as %s must be allowed", op.name, r)
			} else {
				require.ErrorIs(t, err, errRefused, "%s as %s must be refused by the server", op.name, r)
			}
		}
	}
}

// rawAttempt is something a role tries on the bus itself, and the roles the
// server lets do it.
type rawAttempt struct {
	name string
	do   func(roleConn) error
	ok   []roles.Role
}

// Durable consumers the role matrix creates as the worker, standing for a
// run's inbox and a pool's consumer: what no other role may change, read
// from or delete.
const (
	matrixInbox = coordination.InboxPrefix + "rolematrix"
	matrixPool  = "workers-rolematrix"
)

// rawAttempts are the things only one role may do: speak as a run, speak as
// the operator, write a run state, publish an event, delete a stream; and
// what only workers may do to consumers and streams: change, read from or
// delete a durable consumer (a run's inbox, a pool's), configure a stream
// (a RePublish or a source is the server publishing where the role may
// not), delete a stream's message. w, a worker's connection, creates the
// durables they aim at.
func rawAttempts(t *testing.T, w roleConn) []rawAttempt {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := w.js.CreateOrUpdateConsumer(ctx, coordination.StreamName, jetstream.ConsumerConfig{
		Durable: matrixInbox, FilterSubject: coordination.Subject(coordtest.Group("rolematrix"), "victim"), AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	_, err = w.js.CreateOrUpdateConsumer(ctx, messages.StreamRuns, jetstream.ConsumerConfig{
		Durable: matrixPool, FilterSubject: messages.SubjectRuns("rolematrix"), AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	runsStream, err := w.js.Stream(ctx, "KV_"+messages.BucketRuns)
	require.NoError(t, err)
	runsConfig := runsStream.CachedInfo().Config

	forged := func(rc roleConn) error {
		subj := coordination.Subject(coordtest.Group("crew"), "victim")
		return rc.try(subj, func(ctx context.Context) error {
			m := nats.NewMsg(subj)
			m.Header.Set(coordination.HeaderFrom, "some-run")
			m.Data = []byte("forged")
			_, err := rc.js.PublishMsg(ctx, m)
			return err
		})
	}
	fromOperator := func(rc roleConn) error {
		subj := coordination.SubjectFromOperator(coordtest.Group("crew"), "victim")
		return rc.try(subj, func(ctx context.Context) error {
			_, err := rc.js.Publish(ctx, subj, []byte("from the operator"))
			return err
		})
	}
	stateWrite := func(rc roleConn) error {
		subj := "$KV." + messages.BucketRuns + ".failing"
		return rc.try(subj, func(ctx context.Context) error {
			_, err := rc.js.Publish(ctx, subj, []byte(`{"state":"succeeded"}`))
			return err
		})
	}
	event := func(rc roleConn) error {
		subj := messages.SubjectEvents("failing", messages.EventFinished)
		return rc.try(subj, func(ctx context.Context) error {
			_, err := rc.js.Publish(ctx, subj, []byte(`{}`))
			return err
		})
	}
	// A replay: the only subject a signed request runs again from. (No
	// worker serves the pool: what an operator publishes waits there.)
	replay := func(rc roleConn) error {
		subj := messages.SubjectReplay("role-matrix")
		return rc.try(subj, func(ctx context.Context) error {
			_, err := rc.js.Publish(ctx, subj, []byte(`{"id":"role-matrix","profile":"shell","pool":"role-matrix"}`))
			return err
		})
	}
	// What watch and status read while a run is queued: a request of
	// JETCREW_RUNS by sequence, which nats.go reads with a direct get (the
	// stream allows them).
	queuedRead := func(rc roleConn) error {
		subj := "$JS.API.DIRECT.GET." + messages.StreamRuns
		return rc.try(subj, func(ctx context.Context) error {
			st, err := rc.js.Stream(ctx, messages.StreamRuns)
			if err != nil {
				return err
			}
			_, err = st.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(messages.SubjectRunsPrefix+".>"))
			return err
		})
	}
	streamDelete := func(rc roleConn) error {
		subj := "$JS.API.STREAM.DELETE." + messages.StreamFailed
		return rc.try(subj, func(ctx context.Context) error { return rc.js.DeleteStream(ctx, messages.StreamFailed) })
	}
	// Object chunks: harmless to the buckets, which both exist once up's
	// worker started.
	objectWrite := func(bucket string) func(rc roleConn) error {
		subj := "$O." + bucket + ".C.role-matrix"
		return func(rc roleConn) error {
			return rc.try(subj, func(ctx context.Context) error {
				_, err := rc.js.Publish(ctx, subj, []byte("chunk"))
				return err
			})
		}
	}
	subscribe := func(subj string) func(rc roleConn) error {
		return func(rc roleConn) error {
			return rc.try(subj, func(context.Context) error {
				_, err := rc.nc.SubscribeSync(subj)
				return err
			})
		}
	}
	request := func(subj, body string) func(rc roleConn) error {
		return func(rc roleConn) error {
			return rc.try(subj, func(ctx context.Context) error {
				_, err := rc.nc.RequestWithContext(ctx, subj, []byte(body))
				return err
			})
		}
	}
	updateDurable := func(stream, name, filter string) func(rc roleConn) error {
		subj := "$JS.API.CONSUMER.CREATE." + stream + "." + name + "." + filter
		return func(rc roleConn) error {
			return rc.try(subj, func(ctx context.Context) error {
				// Pointed at a subject nobody writes, its messages held for an hour.
				_, err := rc.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: name, FilterSubject: filter,
					AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour})
				return err
			})
		}
	}
	fetch := func(stream, name string) func(rc roleConn) error {
		return request("$JS.API.CONSUMER.MSG.NEXT."+stream+"."+name, `{"batch":1,"no_wait":true}`)
	}
	// follow is what a reader of stream does: an ephemeral consumer, named
	// here so that a refusal can be told by its subject.
	follow := func(stream, filter string) func(rc roleConn) error {
		return func(rc roleConn) error {
			name := "rolematrix-" + connID(rc)
			subj := "$JS.API.CONSUMER.CREATE." + stream + "." + name + "." + filter
			return rc.try(subj, func(ctx context.Context) error {
				_, err := rc.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Name: name, FilterSubject: filter,
					AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: 5 * time.Second})
				return err
			})
		}
	}
	relayStream := func(rc roleConn) error {
		subj := "$JS.API.STREAM.CREATE.ROLEMATRIX_RELAY"
		return rc.try(subj, func(ctx context.Context) error {
			_, err := rc.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ROLEMATRIX_RELAY", Subjects: []string{messages.SubjectCancelPrefix + ".rolematrix-relay"},
				RePublish: &jetstream.RePublish{Source: messages.SubjectCancelPrefix + ".rolematrix-relay", Destination: "$KV." + messages.BucketRuns + ".rolematrix-victim"}})
			return err
		})
	}
	// The bucket's own configuration again: a no-op for the worker, who may.
	runsUpdate := func(rc roleConn) error {
		subj := "$JS.API.STREAM.UPDATE." + runsConfig.Name
		return rc.try(subj, func(ctx context.Context) error {
			_, err := rc.js.UpdateStream(ctx, runsConfig)
			return err
		})
	}
	// Writes to the questions bucket: an operator answers the runs'
	// questions to it; only workers put questions and peers' replies.
	questionWrite := func(key string) func(rc roleConn) error {
		subj := "$KV." + messages.BucketCoordQuestions + "." + key
		return func(rc roleConn) error {
			return rc.try(subj, func(ctx context.Context) error {
				_, err := rc.js.Publish(ctx, subj, []byte(`{"answer":"x","by":"x"}`))
				return err
			})
		}
	}
	const matrixQuestion = "qrolematrixaaaaaa"
	// A group's record says who may join it: a submitter that wrote one
	// would own another's group.
	groupWrite := func(rc roleConn) error {
		subj := "$KV." + messages.BucketGroups + ".default.rolematrix-crew"
		return rc.try(subj, func(ctx context.Context) error {
			_, err := rc.js.Publish(ctx, subj, []byte(`{"pool":"default","group":"rolematrix-crew","kind":"open","creator":"x"}`))
			return err
		})
	}
	ackOthers := func(rc roleConn) error {
		subj := "$JS.ACK." + coordination.StreamName + "." + matrixInbox + ".1.1.1.0.0"
		return rc.try(subj, func(context.Context) error { return rc.nc.Publish(subj, nil) })
	}
	return []rawAttempt{
		// Replies are private to a role: the worker's fetched run requests
		// arrive under its inbox prefix, which no other role may read.
		{"read the worker's replies", subscribe(roles.InboxPrefix(roles.Worker) + ".>"), []roles.Role{roles.Worker}},
		{"read every reply", subscribe("_INBOX.>"), nil},
		{"coordination publish as a run", forged, []roles.Role{roles.Worker}},
		{"coordination publish as the operator", fromOperator, []roles.Role{roles.Operator}},
		{"run state write", stateWrite, []roles.Role{roles.Worker}},
		{"run event publish", event, []roles.Role{roles.Worker}},
		{"replay subject publish", replay, []roles.Role{roles.Operator}},
		{"read a queued request", queuedRead, []roles.Role{roles.Submitter, roles.Operator, roles.Observer, roles.Worker}},
		// Only workers write the workspace bucket, with bytes they checked;
		// submitters upload to the uploads bucket.
		{"workspace bucket write", objectWrite(messages.BucketWorkspaces), []roles.Role{roles.Worker}},
		{"uploads bucket write", objectWrite(messages.BucketUploads), []roles.Role{roles.Submitter}},
		// Nobody but the workers changes, reads from or deletes a durable
		// consumer: a run's inbox, a pool's.
		{"update a run's inbox", updateDurable(coordination.StreamName, matrixInbox, coordination.Subject(coordtest.Group("rolematrix"), "nobody")), []roles.Role{roles.Worker}},
		{"update a run's inbox, named in the body", request("$JS.API.CONSUMER.CREATE."+coordination.StreamName,
			`{"stream_name":"`+coordination.StreamName+`","config":{"name":"`+matrixInbox+`","filter_subject":"jetcrew.coord.rolematrix.nobody","ack_policy":"explicit"}}`), nil},
		{"update a run's inbox, legacy durable subject", request("$JS.API.CONSUMER.DURABLE.CREATE."+coordination.StreamName+"."+matrixInbox,
			`{"stream_name":"`+coordination.StreamName+`","config":{"durable_name":"`+matrixInbox+`","filter_subject":"jetcrew.coord.rolematrix.nobody","ack_policy":"explicit"}}`), []roles.Role{roles.Worker}},
		{"fetch from a run's inbox", fetch(coordination.StreamName, matrixInbox), []roles.Role{roles.Worker}},
		{"acknowledge a run's message", ackOthers, []roles.Role{roles.Worker}},
		{"pause a run's inbox", request("$JS.API.CONSUMER.PAUSE."+coordination.StreamName+"."+matrixInbox, `{}`), nil},
		{"update a pool's consumer", updateDurable(messages.StreamRuns, matrixPool, messages.SubjectRuns("rolematrix")), []roles.Role{roles.Worker}},
		{"fetch from a pool's consumer", fetch(messages.StreamRuns, matrixPool), []roles.Role{roles.Worker}},
		// Readers follow the conversations on the mirror, where no durable lives.
		{"follow coordination with a consumer", follow(coordination.StreamName, "jetcrew.coord.rolematrix.>"), []roles.Role{roles.Worker}},
		{"follow the conversations' mirror", follow(messages.StreamCoordView, "jetcrew.coord.rolematrix.>"), []roles.Role{roles.Observer, roles.Worker, roles.Operator}},
		{"delete a run's inbox", request("$JS.API.CONSUMER.DELETE."+coordination.StreamName+"."+matrixInbox, ``), []roles.Role{roles.Worker}},
		// Nobody but the workers configures a stream: a stream's RePublish
		// and sources are publishes by the server, which no permission sees.
		{"create a stream republishing into run states", relayStream, nil},
		{"update the run states' stream", runsUpdate, []roles.Role{roles.Worker}},
		// A deleted message makes an older one the latest: a finished event
		// of an earlier request, say. (A bucket's stream denies deletes,
		// unless its configuration is changed.)
		{"delete a stream's message", request("$JS.API.STREAM.MSG.DELETE."+messages.StreamEvents, `{"seq":1099511627776}`), []roles.Role{roles.Worker}},
		{"restore a stream", request("$JS.API.STREAM.RESTORE.ROLEMATRIX_RESTORE", `{"config":{"name":"ROLEMATRIX_RESTORE"},"state":{}}`), nil},
		{"answer a run's question", questionWrite(messages.CoordAnswerKey(matrixQuestion)), []roles.Role{roles.Worker, roles.Operator}},
		{"reply to a question as a run", questionWrite(messages.CoordReplyKey(matrixQuestion)), []roles.Role{roles.Worker}},
		{"write a group's record", groupWrite, []roles.Role{roles.Worker}},
		{"put a question as a run", questionWrite(messages.CoordQuestionKey(coordtest.Group("crew"), "victim", matrixQuestion)), []roles.Role{roles.Worker}},
		// Last: the operator's delete removes the stream.
		{"stream delete", streamDelete, []roles.Role{roles.Operator}},
	}
}

// connID returns a name token unique to rc's connection.
func connID(rc roleConn) string {
	id, _ := rc.nc.GetClientID()
	return fmt.Sprint(id)
}

// The operator may publish on jetcrew.cancel.<x>, and a stream's RePublish
// is a publish by the server, which the operator's permissions never see.
// A stream on jetcrew.cancel.<x> republishing to a run's state (making a
// run that exits 3 report succeeded) or to a run's inbox (as from one of
// its peers) is refused: only workers create or change streams.
func TestOperatorCannotRelayThroughAStream(t *testing.T) {
	t.Parallel()
	e := authUp(t)
	const victim = "relay-victim"
	done := make(chan int, 1)
	go func() {
		code, _, _ := e.as(t, roles.Submitter, "submit", "--id", victim, "--group", "crew", "--wait", "sleep 8s; exit 3")
		done <- code
	}()
	w := e.conn(t, roles.Worker)
	require.Eventually(t, func() bool {
		kv, err := w.js.KeyValue(t.Context(), messages.BucketRuns)
		if err != nil {
			return false
		}
		ent, err := kv.Get(t.Context(), victim)
		return err == nil && strings.Contains(string(ent.Value()), `"running"`)
	}, 15*time.Second, 20*time.Millisecond)

	op := e.conn(t, roles.Operator)
	forged, err := json.Marshal(messages.RunState{Version: messages.StateVersion, ID: victim, State: messages.StateSucceeded,
		ExitCode: new(int), FinishedAt: time.Now().UTC()})
	require.NoError(t, err)
	relays := []struct {
		name, dest string
		hdr        nats.Header
		body       []byte
	}{
		{"RELAY_STATE", "$KV." + messages.BucketRuns + "." + victim, nil, forged},
		{"RELAY_INBOX", coordination.Subject(coordtest.Group("crew"), victim), nats.Header{coordination.HeaderFrom: []string{"a-peer"}}, []byte("from your peer")},
	}
	refusals := make([]error, len(relays))
	for i, rl := range relays {
		src := messages.SubjectCancelPrefix + "." + strings.ToLower(rl.name)
		err := op.try("$JS.API.STREAM.CREATE."+rl.name, func(ctx context.Context) error {
			_, err := op.js.CreateStream(ctx, jetstream.StreamConfig{Name: rl.name, Subjects: []string{src},
				RePublish: &jetstream.RePublish{Source: src, Destination: rl.dest}})
			return err
		})
		// The attack, whether or not the stream was let through.
		m := nats.NewMsg(src)
		m.Header, m.Data = rl.hdr, rl.body
		require.NoError(t, op.nc.PublishMsg(m))
		require.NoError(t, op.nc.Flush())
		refusals[i] = err
	}
	select {
	case code := <-done:
		require.Equal(t, 3, code, "submit --wait reports the run's own exit")
	case <-time.After(30 * time.Second):
		t.Fatal("submit --wait did not return")
	}
	coord, err := w.js.Stream(t.Context(), coordination.StreamName)
	require.NoError(t, err)
	_, err = coord.GetLastMsgForSubject(t.Context(), coordination.Subject(coordtest.Group("crew"), victim))
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "nothing reached the run's inbox")
	for i, err := range refusals {
		require.ErrorIs(t, err, errRefused, "a stream republishing to %s as the operator", relays[i].dest)
	}
}

func contains(rs []roles.Role, r roles.Role) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

// A submitter limited to pools is refused the others by the server.
func TestSubmitterPools(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	g, err := roles.Permissions(roles.Submitter, "gpu")
	require.NoError(t, err)
	s := startAuthServer(t, pub, g)
	seed, err := kp.Seed()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "s.nk")
	require.NoError(t, os.WriteFile(path, seed, 0o600))

	errs := make(chan error, 8)
	opt, err := nats.NkeyOptionFromSeed(path)
	require.NoError(t, err)
	nc, err := nats.Connect(s.ClientURL(), opt, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	require.NoError(t, err)
	defer nc.Close()
	rc := roleConn{nc: nc, errs: errs}
	require.NoError(t, rc.try("jetcrew.runs.gpu", func(context.Context) error { return nc.Publish("jetcrew.runs.gpu", []byte("{}")) }))
	require.ErrorIs(t, rc.try("jetcrew.runs.cpu", func(context.Context) error { return nc.Publish("jetcrew.runs.cpu", []byte("{}")) }), errRefused)

	_, err = roles.Permissions(roles.Operator, "gpu")
	require.Error(t, err)
	_, err = roles.Permissions(roles.Submitter, "a.b")
	require.Error(t, err)
}

// `up --auth` keeps the seeds private and writes a context per role that
// the contexts' own connection uses; a second start reuses the seeds.
func TestUpAuthFiles(t *testing.T) {
	t.Parallel()
	e := authUp(t)
	for _, r := range roles.All {
		st, err := os.Stat(filepath.Join(e.data, authDirName, string(r)+".nk"))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "seed of %s", r)
		ctxFile := filepath.Join(e.xdg, "nats", "context", "jetcrew-"+string(r)+".json")
		data, err := os.ReadFile(ctxFile)
		require.NoError(t, err)
		var c struct{ URL, NKey string }
		require.NoError(t, json.Unmarshal(data, &c))
		require.Equal(t, e.url, c.URL)
		require.Equal(t, filepath.Join(e.data, authDirName, string(r)+".nk"), c.NKey)
		require.Contains(t, e.stdout.String(), "jetcrew-"+string(r))
	}
	st, err := os.Stat(filepath.Join(e.data, authDirName))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())

	// Without credentials the server refuses the connection.
	code, _, errOut := cli(t, e.url, "status", "x")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "Authorization Violation")
}

// Beyond loopback, up refuses to start without --auth.
func TestUpListenNeedsAuth(t *testing.T) {
	t.Parallel()
	for _, listen := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0"} {
		up := newTestApp(nil, workertest.NewTestRuntime(t))
		code := up.run(t.Context(), []string{"up", "--listen", listen, "--data", t.TempDir()})
		require.Equal(t, exitUsage, code, listen)
		require.Contains(t, up.stderr.String(), "add --auth", listen)
		require.Empty(t, up.stdout.String())
	}
}

// startAuthServer starts an embedded server with JetStream whose only user
// is the NKey pub with grant g.
func startAuthServer(t *testing.T, pub string, g roles.Grant) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true,
		Nkeys: []*server.NkeyUser{{Nkey: pub, Permissions: g.ServerPermissions()}},
	})
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// `jetcrew roles users` makes the users of a real server: a configuration
// including its files gives each seed its role, enforced by the server.
func TestRolesUsers(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "auth")
	code, out, errOut := cli(t, "", "roles", "users", dir)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, filepath.Join(dir, "submitter.nk"))
	conf := filepath.Join(dir, "server.conf")
	require.NoError(t, os.WriteFile(conf, []byte("include users.conf\n"), 0o644))
	opts, err := server.ProcessConfigFile(conf)
	require.NoError(t, err)
	require.Len(t, opts.Nkeys, len(roles.All))
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir, opts.NoSigs = "127.0.0.1", -1, true, t.TempDir(), true
	s, err := server.NewServer(opts)
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })

	// A second run keeps the seeds.
	before, err := os.ReadFile(filepath.Join(dir, "worker.nk"))
	require.NoError(t, err)
	code, _, errOut = cli(t, "", "roles", "users", dir)
	require.Equal(t, 0, code, errOut)
	after, err := os.ReadFile(filepath.Join(dir, "worker.nk"))
	require.NoError(t, err)
	require.Equal(t, before, after)

	// The observer's seed connects and may not publish a run request.
	opt, err := nats.NkeyOptionFromSeed(filepath.Join(dir, "observer.nk"))
	require.NoError(t, err)
	errs := make(chan error, 8)
	nc, err := nats.Connect(s.ClientURL(), opt, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	require.NoError(t, err)
	defer nc.Close()
	rc := roleConn{nc: nc, errs: errs}
	require.ErrorIs(t, rc.try("jetcrew.runs.default", func(context.Context) error { return nc.Publish("jetcrew.runs.default", []byte("{}")) }), errRefused)

	code, out, _ = cli(t, "", "roles", "permissions")
	require.Equal(t, 0, code)
	require.Equal(t, roles.ConfigFile(), out)
}

// deploy/nats/cluster.conf (deploy/compose's nodes) parses with the files
// host-setup.sh makes: `jetcrew roles users` and a CA's certificate, and
// gives every role its user, with client and route TLS.
func TestComposeClusterConf(t *testing.T) {
	t.Setenv("NATS_SERVER_NAME", "nats-1")
	dir := t.TempDir()
	code, _, errOut := cli(t, "", "roles", "users", filepath.Join(dir, "users"))
	require.Equal(t, 0, code, errOut)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "auth"), 0o755))
	for _, f := range []string{"users.conf", "permissions.conf"} {
		data, err := os.ReadFile(filepath.Join(dir, "users", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "auth", f), data, 0o644))
	}
	ca, cert, key := writeCerts(t)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "tls"), 0o755))
	for src, name := range map[string]string{ca: "ca.pem", cert: "server.pem", key: "server-key.pem"} {
		data, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "tls", name), data, 0o600))
	}
	conf, err := os.ReadFile("../../deploy/nats/cluster.conf")
	require.NoError(t, err)
	path := filepath.Join(dir, "cluster.conf")
	require.NoError(t, os.WriteFile(path, []byte(strings.ReplaceAll(string(conf), "/etc/nats/", dir+"/")), 0o644))
	opts, err := server.ProcessConfigFile(path)
	require.NoError(t, err)
	require.Len(t, opts.Nkeys, len(roles.All))
	require.NotNil(t, opts.TLSConfig)
	require.NotNil(t, opts.Cluster.TLSConfig, "routes use TLS")
	require.Equal(t, "nats-1", opts.ServerName)
}

// `jetcrew worker --context` connects as the worker role and runs requests
// on a server with auth on, its role enough for everything it does.
func TestWorkerWithContext(t *testing.T) {
	t.Parallel()
	e := authUp(t, "--concurrency", "1")
	ctx, cancel := context.WithCancel(context.Background())
	w := newTestApp(map[string]string{"XDG_CONFIG_HOME": e.xdg, "NATS_CONTEXT": "jetcrew-worker"}, workertest.NewTestRuntime(t))
	done := make(chan int, 1)
	go func() { done <- w.run(ctx, []string{"worker", "--pool", "gpu", "--id", "ctx-worker"}) }()
	code, out, errOut := e.as(t, roles.Submitter, "submit", "--pool", "gpu", "--wait", "out on gpu")
	require.Equal(t, 0, code, "%s\nworker: %s", errOut, w.stderr.String())
	require.Equal(t, "on gpu\n", out)
	require.Contains(t, errOut, "ctx-worker")
	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code, w.stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("worker did not stop")
	}
	require.NotContains(t, w.stderr.String(), "Permissions Violation")
}

// A seed file others can read is refused, not used.
func TestSeedModeChecked(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, _, err := ensureRoleKeys(dir)
	require.NoError(t, err)
	path := filepath.Join(dir, "operator.nk")
	require.NoError(t, os.Chmod(path, 0o644))
	_, _, err = ensureRoleKeys(dir)
	require.ErrorContains(t, err, "chmod 600")
	require.NoError(t, os.Chmod(path, 0o600))
	require.NoError(t, os.WriteFile(path, []byte("garbage"), 0o600))
	_, _, err = ensureRoleKeys(dir)
	require.ErrorContains(t, err, "not an NKey user seed")
	require.NotContains(t, err.Error(), "garbage")
}

// Under --auth a submitter's snapshot goes to the uploads bucket (a first
// submit of the tree streams it as it is taken, and links the digest's
// name to it, with the submitter's permissions alone), and the worker,
// which alone writes the workspace bucket, takes it from there once its
// bytes match the request's digest; the next submit of the same tree
// finds it there by its bytes and uploads nothing.
func TestSubmitWorkspaceUnderAuth(t *testing.T) {
	t.Parallel()
	e := authUp(t)
	repo := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(repo, "a.txt"), []byte("a\n"), 0o644))
	code, _, errOut := e.as(t, roles.Submitter, "submit", "--id", "ws-auth-1", "--workspace", repo, "--wait", "out hi")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "uploaded as it was taken")
	code, _, errOut = e.as(t, roles.Submitter, "submit", "--id", "ws-auth-2", "--workspace", repo, "--wait", "out hi")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "already stored, not uploaded again")
	rc := e.conn(t, roles.Observer)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	obs, err := rc.js.ObjectStore(ctx, messages.BucketWorkspaces)
	require.NoError(t, err)
	objs, err := obs.List(ctx)
	require.NoError(t, err)
	require.Len(t, objs, 1, "the worker stored the checked snapshot")
}

// A consumer's deliver subject is not checked against its creator's
// permissions either: a reader may create a push consumer on a stream it
// follows that delivers to jetcrew.cancel.<run> or jetcrew.ctl.stop.<run>,
// where the workers listen. Neither a submitter nor an observer cancels or
// stops a run that way: the server delivers only while someone subscribes
// to that very subject, which no reader may, and the workers ignore what a
// consumer delivered (worker.TestCancelRefusesServerDeliveries).
func TestReadersCannotCancelThroughAConsumer(t *testing.T) {
	t.Parallel()
	e := authUp(t)
	const victim = "deliver-victim"
	code, _, errOut := e.as(t, roles.Submitter, "submit", "--id", victim, "sleep 1m")
	require.Equal(t, 0, code, errOut)
	state := func() string {
		_, out, _ := e.as(t, roles.Observer, "status", victim)
		return out
	}
	require.Eventually(t, func() bool { return strings.Contains(state(), "running") }, 15*time.Second, 20*time.Millisecond)

	for _, r := range []roles.Role{roles.Submitter, roles.Observer} {
		rc := e.conn(t, r)
		for i, subj := range []string{messages.SubjectCancelPrefix + "." + victim, messages.SubjectStopPrefix + "." + victim} {
			_, err := rc.js.CreateConsumer(t.Context(), messages.StreamEvents, jetstream.ConsumerConfig{
				Name: fmt.Sprintf("deliver-%s-%d", r, i), DeliverSubject: subj, FilterSubject: messages.SubjectEventsAll(victim),
				AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: 10 * time.Second})
			require.NoError(t, err, "%s follows the events", r)
		}
	}
	require.Never(t, func() bool { return !strings.Contains(state(), "running") }, 3*time.Second, 100*time.Millisecond,
		"a delivery to the cancel and stop subjects cancelled the run")
}
