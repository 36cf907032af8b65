// Package coordination lets the runs of one group talk to each other, and to
// the people watching them, over NATS JetStream. It is the worker's half of
// jetcrew's coordination; the other half is the bridge, an MCP server inside
// each run container (cmd/jetcrew-bridge, package coordination/bridge).
//
// # Shape
//
//	agent ⇄ MCP stdio ⇄ bridge ⇄ HTTP on /run/jetcrew/bridge.sock ⇄ Host (worker) ⇄ NATS
//
// Run containers have no network, so the bridge cannot reach NATS: it relays
// each tool call over a per-run unix socket (package relay) to the worker's
// Host, which serves one Session per run and acts on NATS as that run.
//
// # On NATS
//
//   - Stream JETCREW_COORD (Provision) holds every message, on subject
//     jetcrew.coord.<pool>.<group>.<recipient>, the recipient a run id,
//     "all" or "operator". Header Jetcrew-From carries the sending run's id.
//   - Each run's inbox is a durable pull consumer, "inbox-<run_id>",
//     filtered on jetcrew.coord.<pool>.<group>.<run_id> and
//     jetcrew.coord.<pool>.<group>.all, created by the run's first status or inbox call (DeliverAll: messages
//     sent to the run before it started, or before it first read, wait for
//     it). Reading acknowledges; a run's own "all" messages are skipped. The
//     consumer survives the bridge, the Session and the worker; Close
//     deletes it when this session used it, and InactiveThreshold is the
//     safety net. Only workers create, read or change consumers on
//     JETCREW_COORD (package roles): whoever could create one could change
//     an inbox, since the server reads a create naming an existing consumer
//     as an update.
//   - Stream JETCREW_COORD_VIEW (Provision) mirrors JETCREW_COORD for its
//     readers (the console, `nats sub --stream`), who follow it with
//     consumers of their own.
//   - Bucket jetcrew-coord-peers is the presence list: one key
//     "<pool>.<group>.<run_id>" per served run of a named group (a Presence
//     document), written by Serve, refreshed while its Session lives and
//     expiring PeerTTL after it does not. A run that named no group is
//     alone in the group of its own id; it is written when its bridge first
//     connects, so a run that never uses coordination costs no presence
//     write or delete.
//   - Bucket jetcrew-coord-claims holds the file claims (the claim,
//     release and claims tools): one key "<pool>.<group>" per group holding a
//     messages.CoordClaims document, written with compare-and-set so that
//     checking a claim against the group's others and storing it is one
//     step. A claim is stamped with the socket's run and session, lives
//     while that run is queued or running in the presence list under that
//     session (any other claim is stale: ignored, and dropped by the next
//     write), and is removed by Close when the run ends.
//   - Bucket jetcrew-groups holds the named groups' records: who may join
//     each (Groups, groups.go), created by the admission of its first run.
//
// # Groups
//
// A group is its pool and its name (messages.GroupRef), two tokens in
// every subject and key: the same name in two pools is two groups. A run
// that named no group is alone in its own group, marked "<pool>.=<run_id>",
// which no request can name. Before a run's session is ever served, the
// worker admits the run to its group (Groups.Admit): a named group's first
// run records its key (or none), and a later run joins only with the same
// key and its request signed by it; any other fails unstarted.
//
// # Steering
//
// Each session subscribes to jetcrew.steer.<run_id> (messages.SubjectSteer),
// where operators send a running agent a steer (`jetcrew send`, steer.go):
// the session puts the text in the run's inbox, hands it to the run's
// launcher when the agent CLI takes streamed input (the launcher
// long-polls relay.PathSteerNext and writes it to the CLI's standard input
// as a user turn), and answers delivered, queued or refused, recording a
// "steered" event. The bridge notes unread steers in every tool result
// (relay.HeaderUnreadSteers) and notifies its MCP client (relay.PathNotice).
// Limits: the text is at most messages.MaxSteerBytes; Config.SteerRate and
// SteerBurst per run; an id makes a steer idempotent.
//
// # People
//
// Operators take part with the stock NATS CLI:
//
//	nats sub 'jetcrew.coord.<pool>.<group>.>'             # the whole conversation, live
//	nats sub --stream JETCREW_COORD_VIEW --all -T 'jetcrew.coord.<pool>.<group>.>' # so far
//	nats pub jetcrew.coord.<pool>.<group>.<run_id>.operator 'text' # to one run
//	nats pub jetcrew.coord.<pool>.<group>.all.operator 'text'      # to every run of the group
//
// A plain core publish is captured by the stream and reaches the inbox. A
// message without a Jetcrew-From header (or with one that is not a valid run
// id) reads as from "operator".
//
// # Trust
//
// The socket is the run's identity: the Host stamps Jetcrew-From with the
// socket's run, always publishes under the run's own group, validates the
// recipient as one subject token (no '.', '*', '>'), accepts only a run of
// the group that is in the presence list (or "all", "operator"), and reads
// only the run's own inbox. The relay's requests have no field that could
// name another sender, group or inbox; an unknown field is refused. One
// message is published by the asker's worker with another sender: an
// answer that came after its ask returned early (lateanswer.go) reaches
// the asker's inbox from whoever answered, a peer's reply as that peer's
// worker stamped it in its reply key, or an operator's answer.
//
// Only workers may publish where runs' messages travel (the five-token
// jetcrew.coord.<pool>.<group>.<recipient>); NATS permissions are the boundary (see
// package roles and docs/security.md). Operators talk on
// jetcrew.coord.<pool>.<group>.<recipient>.operator (SubjectFromOperator), which a
// run always reads as from "operator", whatever Jetcrew-From says: nobody
// outside a run's bridge speaks as that run. A five-token publish by anyone
// else is possible only on a server without authentication, where every
// client is trusted.
//
// The socket file is mode 0666 (SocketMode) so the run's non-root process can
// connect whatever its uid or the runtime's uid mapping; the directory holding
// it is mounted only into that run's container, and its parent on the host
// should be 0700 (StageRunDir).
//
// A socket may serve one run after another (Session.CloseKeepSocket,
// Host.ServeSocket: the worker keeps the directories of finished runs
// bound for later ones). The identity still holds: the worker hands the
// directory on only once the earlier run's container is removed, and the
// later session closes, unread, every connection still waiting in the
// socket's backlog before it accepts any.
package coordination
