package coordination

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// MaxStreamBytes caps JETCREW_COORD, in bytes (256 MiB): past it the
// oldest messages are discarded.
const MaxStreamBytes = 256 << 20

// Provision creates or updates the JetStream resources coordination needs:
// stream JETCREW_COORD (limits retention, file storage, subjects
// jetcrew.coord.>, DuplicateWindow, MaxAge, MaxMsgBytes, MaxStreamBytes
// (the oldest messages go first when it is full), AllowDirect), its mirror
// JETCREW_COORD_VIEW for readers (the same limits), and the presence
// bucket BucketPeers (TTL PeerTTL, history 1, memory storage), the
// claims bucket BucketClaims (history 1, file storage, no TTL: a claim
// lives as long as its holder, see Session.Close), the groups' records
// BucketGroups (history 1, file storage, no TTL: a record that expired
// would let anyone create the group anew while its runs live) and the
// questions' bucket BucketQuestions.
// replicas is the replica count of both: 1 on one server, 3 on a cluster; 0
// means 1. It is safe to call from every worker at once, and on every start.
// Per-run inbox consumers are created by Host.Serve, not here.
func Provision(ctx context.Context, js jetstream.JetStream, replicas int) error {
	if replicas == 0 {
		replicas = 1
	}
	if replicas < 0 {
		return fmt.Errorf("provision coordination: replicas %d must be positive", replicas)
	}
	for _, sc := range []jetstream.StreamConfig{{
		Name:        StreamName,
		Description: "jetcrew coordination messages: jetcrew.coord.<pool>.<group>.<run_id|all|operator>",
		Subjects:    []string{SubjectPrefix + ".>"},
		Duplicates:  DuplicateWindow,
	}, {
		Name:        ViewStreamName,
		Description: "jetcrew coordination messages for readers: a mirror of " + StreamName + ", whose consumers are the runs' inboxes",
		Mirror:      &jetstream.StreamSource{Name: StreamName},
	}} {
		// Both streams keep the same messages within the same limits.
		sc.Retention, sc.Storage, sc.Replicas = jetstream.LimitsPolicy, jetstream.FileStorage, replicas
		sc.MaxAge, sc.MaxMsgSize, sc.MaxBytes = MaxAge, MaxMsgBytes, MaxStreamBytes
		sc.Discard, sc.AllowDirect = jetstream.DiscardOld, true
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("provision stream %s: %w", sc.Name, err)
		}
	}
	for _, kc := range []jetstream.KeyValueConfig{{
		Bucket:      BucketPeers,
		Description: "jetcrew coordination presence: <pool>.<group>.<run_id> of queued and running runs",
		TTL:         PeerTTL,
		Storage:     jetstream.MemoryStorage,
	}, {
		Bucket:      BucketClaims,
		Description: "jetcrew coordination file claims: <pool>.<group>, every claim of the group's runs",
		Storage:     jetstream.FileStorage,
	}, {
		Bucket:      BucketGroups,
		Description: "jetcrew groups: <pool>.<group>, who may join the group, recorded by its first run",
		Storage:     jetstream.FileStorage,
	}, {
		Bucket:      BucketQuestions,
		Description: "jetcrew coordination questions: ask.<pool>.<group>.<run_id>.<id> open, answer.<id> an operator's, reply.<id> a peer's",
		Storage:     jetstream.FileStorage,
		// Every key carries its own TTL (see messages.BucketCoordQuestions).
		LimitMarkerTTL: questionMarkerTTL,
	}} {
		kc.History, kc.Replicas = 1, replicas
		if _, err := js.CreateOrUpdateKeyValue(ctx, kc); err != nil {
			return fmt.Errorf("provision bucket %s: %w", kc.Bucket, err)
		}
	}
	return nil
}
