package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// RecordPublish stores ev, what `jetcrew publish` pushed, as the run's
// event jetcrew.events.<run_id>.publish in JETCREW_EVENTS, and waits for
// the stream's ack. The run's state is not touched: only workers write it.
func (res *Results) RecordPublish(ctx context.Context, ev messages.PublishEvent) error {
	if err := messages.ValidateToken("run id", ev.RunID); err != nil {
		return err
	}
	ev.Type = messages.EventPublish
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	m := nats.NewMsg(messages.SubjectEvents(ev.RunID, messages.EventPublish))
	m.Header.Set(messages.HeaderRunID, ev.RunID)
	m.Data = data
	if _, err := res.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("record the publish of run %s: %w", ev.RunID, classify(err))
	}
	return nil
}

// LastPublish returns the run's last publish event, nil when it has none
// (never published, or its events expired).
func (res *Results) LastPublish(ctx context.Context, runID string) (*messages.PublishEvent, error) {
	if err := messages.ValidateToken("run id", runID); err != nil {
		return nil, err
	}
	stream, err := res.js.Stream(ctx, messages.StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("publishes of run %s: stream %s: %w", runID, messages.StreamEvents, classify(err))
	}
	m, err := stream.GetLastMsgForSubject(ctx, messages.SubjectEvents(runID, messages.EventPublish))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("publishes of run %s: %w", runID, classify(err))
	}
	var ev messages.PublishEvent
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		return nil, fmt.Errorf("publish event of run %s: %w", runID, err)
	}
	return &ev, nil
}
