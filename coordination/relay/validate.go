package relay

import (
	"bytes"

	"github.com/jetcrew/jetcrew/messages"
)

// ValidateRecipient checks that to can name a recipient: RecipientAll,
// RecipientOperator or a run id that is one NATS subject token (see
// messages.ValidateToken: no '.', '*', '>' or white space). It does not check
// that the run exists. The error is an *InvalidError.
func ValidateRecipient(to string) error {
	if to == "" {
		return invalid(CodeInvalid, "to is empty: give a peer's run id (see status), %q or %q", RecipientAll, RecipientOperator)
	}
	if err := messages.ValidateToken("to", to); err != nil {
		return invalid(CodeInvalid, "to %q is not a run id, %q or %q: %v", to, RecipientAll, RecipientOperator, err)
	}
	return nil
}

// ValidateSend checks a send request against the rules that need no
// knowledge of the group: a valid recipient (ValidateRecipient), a body of 1
// to MaxBodyBytes bytes, and an idempotency key of at most
// MaxIdempotencyKeyBytes bytes. The error is an *InvalidError whose Code is
// CodeTooLarge for an oversize body and CodeInvalid otherwise.
func ValidateSend(r SendRequest) error {
	if err := ValidateRecipient(r.To); err != nil {
		return err
	}
	if r.Body == "" {
		return invalid(CodeInvalid, "body is empty")
	}
	if len(r.Body) > MaxBodyBytes {
		return invalid(CodeTooLarge, "body is %d bytes, largest allowed is %d bytes (16 KiB): split it into several messages", len(r.Body), MaxBodyBytes)
	}
	if len(r.IdempotencyKey) > MaxIdempotencyKeyBytes {
		return invalid(CodeInvalid, "idempotency_key is %d bytes, longest allowed is %d", len(r.IdempotencyKey), MaxIdempotencyKeyBytes)
	}
	return nil
}

// NormalizeInbox checks an inbox request and returns it with Max defaulted:
// WaitSeconds must be 0 to MaxWaitSeconds, Max 0 (meaning DefaultInboxMax) to
// MaxInboxMax. The error is an *InvalidError.
func NormalizeInbox(r InboxRequest) (InboxRequest, error) {
	if r.WaitSeconds < 0 || r.WaitSeconds > MaxWaitSeconds {
		return r, invalid(CodeInvalid, "wait_seconds %d is out of range: 0 to %d", r.WaitSeconds, MaxWaitSeconds)
	}
	if r.Max < 0 || r.Max > MaxInboxMax {
		return r, invalid(CodeInvalid, "max %d is out of range: 1 to %d (0 means %d)", r.Max, MaxInboxMax, DefaultInboxMax)
	}
	if r.Max == 0 {
		r.Max = DefaultInboxMax
	}
	return r, nil
}

// DecodeSendRequest decodes and validates one send request: a single JSON
// object of at most MaxRequestBytes bytes with no unknown field (a "from"
// field is refused, not ignored). The error is an *InvalidError.
func DecodeSendRequest(data []byte) (SendRequest, error) {
	var r SendRequest
	if err := decodeStrict(data, &r); err != nil {
		return SendRequest{}, err
	}
	if err := ValidateSend(r); err != nil {
		return SendRequest{}, err
	}
	return r, nil
}

// DecodeInboxRequest decodes and normalizes one inbox request (see
// NormalizeInbox). An empty body is the zero request. The error is an
// *InvalidError.
func DecodeInboxRequest(data []byte) (InboxRequest, error) {
	var r InboxRequest
	if len(bytes.TrimSpace(data)) > 0 {
		if err := decodeStrict(data, &r); err != nil {
			return InboxRequest{}, err
		}
	}
	return NormalizeInbox(r)
}

func decodeStrict(data []byte, v any) error {
	if len(data) > MaxRequestBytes {
		return invalid(CodeTooLarge, "request is %d bytes, largest allowed is %d", len(data), MaxRequestBytes)
	}
	if err := messages.DecodeStrictJSON(data, v); err != nil {
		return invalid(CodeInvalid, "bad request: %v", err)
	}
	return nil
}
