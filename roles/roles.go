// Package roles holds jetcrew's least-privilege NATS roles, written down once:
// the subjects each role may publish and subscribe to. From them come the
// nats-server permissions of `jetcrew up --auth` (Permissions) and the
// configuration blocks docs/security.md shows for operators to paste into a
// real server's configuration (ConfigBlock); a test keeps the two equal.
//
// The roles:
//
//   - Submitter publishes run requests (to every pool, or to the pools it is
//     given), uploads workspace snapshots to the uploads bucket (never to
//     the workspace bucket: only workers write that, once they have checked
//     a snapshot's bytes), and reads run states, events and results. It
//     cannot write a run state, publish where agents read (coordination),
//     cancel or replay runs, or touch a stream's configuration.
//   - Worker does what a worker does: provision jetcrew's streams, buckets
//     and consumers (never delete a stream, nor purge one but to replace an
//     object of its own buckets), take requests, write states, events, dead
//     letters, results and the workspace bucket's snapshots, relay
//     coordination as its runs, answer cancels and steers.
//   - Operator cancels, replays, reads dead letters, purges and deletes
//     jetcrew's streams, steers running agents (jetcrew.steer.<run_id>),
//     answers the runs' questions to the operator (answer.<id> of
//     jetcrew-coord-questions) and talks to runs as "operator"
//     (jetcrew.coord.<pool>.<group>.<recipient>.operator); it cannot speak as a run
//     or write a run state, not even through the server: it configures no
//     stream (a RePublish or a source is the server publishing) and deletes
//     no single message.
//   - Observer only reads: states, events, dead letters, coordination,
//     the pools' queues (their consumers' info, the requests not taken yet).
//
// Only workers touch a durable consumer (a pool's, the dead-letterer's, a
// run's inbox): everyone else follows streams that have none, with
// ephemeral consumers, and reads the conversations from JETCREW_COORD's
// mirror.
package roles

import (
	"fmt"
	"slices"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// Role names one of jetcrew's NATS roles.
type Role string

// The roles, in the order docs/security.md lists them.
const (
	Submitter Role = "submitter"
	Worker    Role = "worker"
	Operator  Role = "operator"
	Observer  Role = "observer"
)

// All lists every role.
var All = []Role{Submitter, Worker, Operator, Observer}

// Parse returns the role named s, or an error naming the roles.
func Parse(s string) (Role, error) {
	for _, r := range All {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("unknown role %q (roles: submitter, worker, operator, observer)", s)
}

// Grant is a role's permissions as subject lists: what it may publish (NATS
// core publishes, JetStream API requests and acknowledgements alike), what it
// may subscribe to, and whether it may reply to requests it receives.
type Grant struct {
	Publish   []string
	Subscribe []string
	// Responses allows publishing to the reply subject of a request the
	// user received (nats-server's allow_responses).
	Responses bool
}

// Stream names, the key-value buckets' streams included.
var (
	kvRuns        = "KV_" + messages.BucketRuns
	kvPeers       = "KV_" + coordination.BucketPeers
	kvClaims      = "KV_" + coordination.BucketClaims
	kvGroups      = "KV_" + coordination.BucketGroups
	kvQuestions   = "KV_" + coordination.BucketQuestions
	kvWorkers     = "KV_" + messages.BucketWorkers
	kvBudgets     = "KV_" + messages.BucketBudgets
	kvAsks        = "KV_" + messages.BucketEgressAsks
	kvApprovals   = "KV_" + messages.BucketEgressApprovals
	objWorkspaces = "OBJ_" + messages.BucketWorkspaces
	objUploads    = "OBJ_" + messages.BucketUploads
	objResults    = "OBJ_" + messages.BucketResults
	allStreams    = []string{messages.StreamRuns, messages.StreamEvents, messages.StreamFailed, coordination.StreamName, coordination.ViewStreamName, messages.StreamAdvisories, kvRuns, kvPeers, kvClaims, kvGroups, kvQuestions, kvWorkers, kvBudgets, kvAsks, kvApprovals, objWorkspaces, objUploads, objResults}
	// readStreams are what operators and observers read and follow: every
	// stream without durable consumers (coordination through its mirror).
	readStreams = []string{messages.StreamEvents, messages.StreamFailed, coordination.ViewStreamName, kvRuns, kvPeers, kvClaims, kvGroups, kvQuestions, kvWorkers, kvBudgets, kvAsks, kvApprovals, objWorkspaces, objUploads, objResults}
)

// durableStreams are the streams with durable consumers: the pools'
// workers-<pool> on JETCREW_RUNS, the dead-letterer's on
// JETCREW_ADVISORIES, the runs' inboxes (inbox-<run_id>) on JETCREW_COORD.
// Only workers create, change, fetch from, acknowledge or delete a consumer
// there. A consumer's name is one subject token, which no permission
// matches by a prefix, and a create naming an existing consumer changes it
// (its filter, its ack wait), so a role allowed any consumer on one of these
// streams could point a run's inbox at a subject nobody writes, or drain it.
// Others inspect them (info, messages by sequence or subject); the
// conversations are read from JETCREW_COORD_VIEW, JETCREW_COORD's mirror.
var durableStreams = []string{messages.StreamRuns, messages.StreamAdvisories, coordination.StreamName}

// InboxPrefix returns the inbox prefix role r's clients must use,
// _INBOX_jetcrew_<role>: the replies to their requests (JetStream
// acknowledgements, fetched messages, key-value reads, cancel replies)
// arrive under it, and a role may subscribe to its own prefix only, so no
// user reads the replies meant for another role (a worker's fetched run
// requests, say). A NATS CLI context sets it with inbox_prefix (`nats context
// save --inbox-prefix`), jetcrew with --inbox-prefix or the context, a Go
// client with nats.CustomInboxPrefix.
func InboxPrefix(r Role) string {
	return "_INBOX_jetcrew_" + string(r)
}

// inbox is the subscription role r's replies need.
func inbox(r Role) string { return InboxPrefix(r) + ".>" }

// api prefixes the JetStream API.
const api = "$JS.API."

// inspect is what looking at stream s takes: its info and its messages by
// sequence or subject. Nothing of it changes s or its consumers.
func inspect(s string) []string {
	return []string{
		api + "STREAM.INFO." + s,
		api + "STREAM.MSG.GET." + s,
		api + "DIRECT.GET." + s,
		api + "DIRECT.GET." + s + ".>",
	}
}

// follow is what reading stream s with ephemeral (ordered) consumers takes,
// which the reader deletes when done. Only the workers follow a stream of
// durableStreams.
func follow(s string) []string {
	return []string{
		api + "CONSUMER.CREATE." + s + ".>",
		api + "CONSUMER.INFO." + s + ".>",
		api + "CONSUMER.MSG.NEXT." + s + ".>",
		"$JS.FC." + s + ".>",
		api + "CONSUMER.DELETE." + s + ".>",
	}
}

// read is what reading stream s takes: inspecting it and following it. It
// panics on a stream with durable consumers, which only workers follow (a
// programming error: the streams are constants).
func read(s string) []string {
	if slices.Contains(durableStreams, s) {
		panic("roles: stream " + s + " has durable consumers: only workers follow it")
	}
	return append(inspect(s), follow(s)...)
}

// manage is what provisioning stream s and consuming it with durable
// consumers takes, without deleting or purging it: the workers' alone.
// Creating or updating a stream is the only way to a RePublish, a source or
// a subject transform, with which the server publishes where the
// configuring user may not; deleting a message makes an older one a
// subject's latest.
func manage(s string) []string {
	return append(append(inspect(s), follow(s)...),
		api+"STREAM.CREATE."+s,
		api+"STREAM.UPDATE."+s,
		api+"STREAM.MSG.DELETE."+s,
		api+"CONSUMER.DURABLE.CREATE."+s+".>",
		"$JS.ACK."+s+".>",
	)
}

// poolConsumers is what looking at the pools' consumers takes (their info,
// as the console's overview shows it), never changing or fetching from one.
func poolConsumers() []string {
	return []string{
		api + "CONSUMER.LIST." + messages.StreamRuns,
		api + "CONSUMER.NAMES." + messages.StreamRuns,
		api + "CONSUMER.INFO." + messages.StreamRuns + ".>",
	}
}

// Permissions returns role r's grant. pools limits the pools a submitter
// may publish run requests to; none means every pool. It is an error to
// give pools to another role, or an invalid pool name.
func Permissions(r Role, pools ...string) (Grant, error) {
	if len(pools) > 0 && r != Submitter {
		return Grant{}, fmt.Errorf("role %s: only a submitter is limited to pools", r)
	}
	for _, p := range pools {
		if err := messages.ValidateToken("pool", p); err != nil {
			return Grant{}, err
		}
	}
	var g Grant
	switch r {
	case Submitter:
		g = submitter(pools)
	case Worker:
		g = workerGrant()
	case Operator:
		g = operator()
	case Observer:
		g = observer()
	default:
		return Grant{}, fmt.Errorf("unknown role %q", r)
	}
	return g, nil
}

func submitter(pools []string) Grant {
	var pub []string
	if len(pools) == 0 {
		pub = append(pub, messages.SubjectRuns("*"))
	}
	for _, p := range pools {
		pub = append(pub, messages.SubjectRuns(p))
	}
	pub = append(pub, api+"INFO")
	pub = append(pub, read(kvRuns)...)
	pub = append(pub, read(messages.StreamEvents)...)
	// What `submit --wait` and `watch` look at while a run is not taken
	// yet: which live workers serve its pool, the pool's depth, whether
	// its request is still queued or already dead-lettered (info only: no
	// dead letter's body).
	pub = append(pub, read(kvWorkers)...)
	// JETCREW_RUNS allows direct gets, which nats.go's GetMsg then uses
	// (the same messages STREAM.MSG.GET reads).
	pub = append(pub, inspect(messages.StreamRuns)...)
	pub = append(pub, api+"STREAM.INFO."+messages.StreamFailed)
	// Workspaces in (uploaded to the uploads bucket, which workers create
	// and check; the workspace bucket read only), results out.
	pub = append(pub, "$O."+messages.BucketUploads+".>")
	pub = append(pub, read(objWorkspaces)...)
	pub = append(pub, read(objUploads)...)
	pub = append(pub, read(objResults)...)
	return Grant{Publish: pub, Subscribe: []string{inbox(Submitter)}}
}

func workerGrant() Grant {
	pub := []string{
		messages.SubjectEventsPrefix + ".>",
		messages.SubjectFailedPrefix + ".>",
		// As a run, through its bridge: exactly five tokens, never the
		// operator's jetcrew.coord.<pool>.<group>.<recipient>.operator.
		coordination.SubjectPrefix + ".*.*.*",
		"$KV." + messages.BucketRuns + ".>",
		"$KV." + coordination.BucketPeers + ".>",
		// Claims, as a run, through its bridge.
		"$KV." + coordination.BucketClaims + ".>",
		// The groups' records, created as their first runs are admitted.
		"$KV." + coordination.BucketGroups + ".>",
		// Questions, replies and purges, as a run, through its bridge.
		"$KV." + coordination.BucketQuestions + ".>",
		"$KV." + messages.BucketWorkers + ".>",
		"$KV." + messages.BucketBudgets + ".>",
		"$KV." + messages.BucketEgressAsks + ".>",
		"$KV." + messages.BucketEgressApprovals + ".>",
		messages.SubjectStopPrefix + ".*",
		messages.SubjectHoldPrefix + ".*",
		"$O." + messages.BucketResults + ".>",
		// Snapshots checked by their bytes, and git sources' snapshots:
		// only workers write the workspace bucket.
		"$O." + messages.BucketWorkspaces + ".>",
		// An object stored again under its name replaces the old chunks.
		api + "STREAM.PURGE." + objResults,
		api + "STREAM.PURGE." + objWorkspaces,
		api + "INFO",
		api + "STREAM.NAMES",
	}
	for _, s := range allStreams {
		pub = append(pub, manage(s)...)
	}
	return Grant{
		Publish: pub,
		Subscribe: []string{inbox(Worker),
			messages.SubjectCancelPrefix + ".*",
			messages.SubjectStopPrefix + ".*",
			messages.SubjectHoldPrefix + ".*",
			// Steers, answered by the worker serving the run's
			// coordination session.
			messages.SubjectSteerPrefix + ".*",
		},
		Responses: true,
	}
}

func operator() Grant {
	pub := []string{
		messages.SubjectRuns("*"),
		// Replays: the only subject a signed request runs again from.
		messages.SubjectReplay("*"),
		messages.SubjectCancelPrefix + ".*",
		// Steering a running agent (jetcrew send): operators only.
		messages.SubjectSteerPrefix + ".*",
		coordination.SubjectFromOperator(messages.GroupRef{Pool: "*", Name: "*"}, "*"),
		// Grants on top of a run's or group's budget (jetcrew budget),
		// never the spend itself.
		"$KV." + messages.BucketBudgets + ".grant.>",
		// Answers to egress_ask's questions, for a run or a profile
		// (jetcrew egress allow|deny), never the questions.
		"$KV." + messages.BucketEgressAsks + ".answer.>",
		"$KV." + messages.BucketEgressApprovals + ".>",
		// Answers to the runs' questions to the operator (jetcrew
		// answer), never a question nor a peer's reply.
		"$KV." + coordination.BucketQuestions + "." + messages.CoordAnswerKey(">"),
		// The record of what jetcrew publish pushed, never another event
		// of a run.
		messages.SubjectEvents("*", messages.EventPublish),
		// Archive marks of dead letters (dispatcher.Archive): five
		// tokens, never a dead letter (jetcrew.failed.<pool>.<run_id>).
		messages.SubjectFailedArchived("*", "*"),
		api + "INFO", api + "STREAM.NAMES", api + "STREAM.LIST",
	}
	for _, s := range readStreams {
		pub = append(pub, read(s)...)
	}
	for _, s := range durableStreams {
		pub = append(pub, inspect(s)...)
	}
	pub = append(pub, poolConsumers()...)
	// Managing jetcrew's streams is purging and deleting them; configuring
	// one, or deleting one message, is the workers' (see manage). A purge
	// may name a subject: discarding a run's dead letters (`jetcrew failed
	// discard`, the console's Discard) purges jetcrew.failed.*.<run_id>,
	// every one of them, so no older one becomes the run's latest.
	for _, s := range allStreams {
		pub = append(pub, api+"STREAM.PURGE."+s, api+"STREAM.DELETE."+s)
	}
	return Grant{
		Publish: pub,
		Subscribe: []string{inbox(Operator),
			messages.SubjectEventsPrefix + ".>",
			coordination.SubjectPrefix + ".>",
			// Runs that exhausted their deliveries, and streams' changes:
			// advisories that name no reader's consumer (a consumer's name
			// is what guards an ephemeral one).
			"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>",
			"$JS.EVENT.ADVISORY.STREAM.>",
		},
	}
}

func observer() Grant {
	pub := []string{api + "INFO", api + "STREAM.NAMES", api + "STREAM.LIST"}
	for _, s := range readStreams {
		pub = append(pub, read(s)...)
	}
	pub = append(pub, api+"STREAM.INFO."+messages.StreamAdvisories,
		api+"STREAM.INFO."+coordination.StreamName)
	// The pools' queues, as the console shows them: the info of
	// JETCREW_RUNS's consumers and the requests no worker has taken yet
	// (queued runs, the oldest one's age), never a fetch or a change.
	pub = append(pub, inspect(messages.StreamRuns)...)
	pub = append(pub, poolConsumers()...)
	return Grant{
		Publish: pub,
		Subscribe: []string{inbox(Observer),
			messages.SubjectEventsPrefix + ".>",
			coordination.SubjectPrefix + ".>",
		},
	}
}

// ServerPermissions returns g as nats-server permissions, for an
// embedded server's users (server.NkeyUser.Permissions).
func (g Grant) ServerPermissions() *server.Permissions {
	p := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: slices.Clone(g.Publish)},
		Subscribe: &server.SubjectPermission{Allow: slices.Clone(g.Subscribe)},
	}
	if g.Responses {
		p.Response = &server.ResponsePermission{MaxMsgs: server.DEFAULT_ALLOW_RESPONSE_MAX_MSGS, Expires: server.DEFAULT_ALLOW_RESPONSE_EXPIRATION}
	}
	return p
}
