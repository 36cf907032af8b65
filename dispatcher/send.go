package dispatcher

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/jetcrew/jetcrew/messages"
)

// ErrEmptyMessage is wrapped by the error Send returns for a message
// without text.
var ErrEmptyMessage = errors.New("empty message")

// Send sends text to to, a run id of group g or messages.RecipientAll, as
// the operator: a JetStream publish on
// jetcrew.coord.<pool>.<group>.<to>.operator
// (messages.SubjectCoordFromOperator), what `nats pub
// jetcrew.coord.POOL.GROUP.RUN_ID.operator 'text'` does, stored by
// JETCREW_COORD.
// It sets no Jetcrew-From header: a run reads every message on an operator
// subject as from "operator", and nobody speaks as a run through one. It
// returns the message's sequence in JETCREW_COORD. A message larger than
// the stream's 64 KiB is refused by the server; the error wraps
// ErrNotProvisioned when JETCREW_COORD does not exist.
func (c *Coordination) Send(ctx context.Context, g messages.GroupRef, to, text string) (uint64, error) {
	if err := g.Validate(); err != nil {
		return 0, fmt.Errorf("send: %w", err)
	}
	if err := messages.ValidateToken("recipient", to); err != nil {
		return 0, fmt.Errorf("send: %w", err)
	}
	if to == messages.RecipientOperator {
		return 0, fmt.Errorf("send: recipient %q: an operator sends to a run id or %q", to, messages.RecipientAll)
	}
	if text == "" {
		return 0, fmt.Errorf("send: %w", ErrEmptyMessage)
	}
	m := nats.NewMsg(messages.SubjectCoordFromOperator(g, to))
	m.Data = []byte(text)
	ack, err := c.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, fmt.Errorf("send to %s: %w", m.Subject, classify(err))
	}
	return ack.Sequence, nil
}
