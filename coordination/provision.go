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
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamName,
		Description: "jetcrew coordination messages: jetcrew.coord.<pool>.<group>.<run_id|all|operator>",
		Subjects:    []string{SubjectPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		MaxAge:      MaxAge,
		MaxMsgSize:  MaxMsgBytes,
		MaxBytes:    MaxStreamBytes,
		Duplicates:  DuplicateWindow,
		Discard:     jetstream.DiscardOld,
		AllowDirect: true,
	}); err != nil {
		return fmt.Errorf("provision stream %s: %w", StreamName, err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        ViewStreamName,
		Description: "jetcrew coordination messages for readers: a mirror of " + StreamName + ", whose consumers are the runs' inboxes",
		Mirror:      &jetstream.StreamSource{Name: StreamName},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		MaxAge:      MaxAge,
		MaxMsgSize:  MaxMsgBytes,
		MaxBytes:    MaxStreamBytes,
		Discard:     jetstream.DiscardOld,
		AllowDirect: true,
	}); err != nil {
		return fmt.Errorf("provision stream %s: %w", ViewStreamName, err)
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketPeers,
		Description: "jetcrew coordination presence: <pool>.<group>.<run_id> of queued and running runs",
		History:     1,
		TTL:         PeerTTL,
		Storage:     jetstream.MemoryStorage,
		Replicas:    replicas,
	}); err != nil {
		return fmt.Errorf("provision bucket %s: %w", BucketPeers, err)
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketClaims,
		Description: "jetcrew coordination file claims: <pool>.<group>, every claim of the group's runs",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}); err != nil {
		return fmt.Errorf("provision bucket %s: %w", BucketClaims, err)
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketGroups,
		Description: "jetcrew groups: <pool>.<group>, who may join the group, recorded by its first run",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}); err != nil {
		return fmt.Errorf("provision bucket %s: %w", BucketGroups, err)
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      BucketQuestions,
		Description: "jetcrew coordination questions: ask.<pool>.<group>.<run_id>.<id> open, answer.<id> an operator's, reply.<id> a peer's",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		// Every key carries its own TTL (see messages.BucketCoordQuestions).
		LimitMarkerTTL: questionMarkerTTL,
	}); err != nil {
		return fmt.Errorf("provision bucket %s: %w", BucketQuestions, err)
	}
	return nil
}
