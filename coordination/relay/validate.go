package relay

import (
	"bytes"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

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
	return decodeRequest(data, func(r SendRequest) (SendRequest, error) {
		if err := ValidateSend(r); err != nil {
			return SendRequest{}, err
		}
		return r, nil
	})
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

// decodeRequest decodes one request with decodeStrict and returns it as
// normalize does; the zero request when it does not decode.
func decodeRequest[T any](data []byte, normalize func(T) (T, error)) (T, error) {
	var r T
	if err := decodeStrict(data, &r); err != nil {
		var zero T
		return zero, err
	}
	return normalize(r)
}

// decodeOptional is decodeRequest, but for an empty body, which is the zero
// request, normalized.
func decodeOptional[T any](data []byte, normalize func(T) (T, error)) (T, error) {
	if len(data) == 0 {
		var zero T
		return normalize(zero)
	}
	return decodeRequest(data, normalize)
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

// ValidatePattern checks one claimed path or glob and returns it cleaned
// (path.Clean, a trailing "/" dropped). A pattern is relative to the
// workspace: not empty, no leading '/', no "." or ".." segment after
// cleaning ("." alone, the whole workspace, is refused: claim "**"), no
// backslash, no control character, at most MaxPatternBytes bytes,
// MaxPatternSegments segments and MaxPatternDoubleStars "**" segments,
// and each segment valid path.Match syntax. The error is an *InvalidError.
func ValidatePattern(p string) (string, error) {
	if p == "" {
		return "", invalid(CodeInvalid, "a path is empty")
	}
	if len(p) > MaxPatternBytes {
		return "", invalid(CodeTooLarge, "path %.40q… is %d bytes, longest allowed is %d", p, len(p), MaxPatternBytes)
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f || r == '\\' || !utf8.ValidRune(r) || r == utf8.RuneError {
			return "", invalid(CodeInvalid, "path %q has a control character, a backslash or invalid UTF-8", p)
		}
	}
	if strings.HasPrefix(p, "/") {
		return "", invalid(CodeInvalid, "path %q is absolute: give it relative to the workspace", p)
	}
	c := path.Clean(p)
	if c == "." || c == ".." || strings.HasPrefix(c, "../") {
		return "", invalid(CodeInvalid, "path %q is not inside the workspace (claim \"**\" for all of it)", p)
	}
	segs := strings.Split(c, "/")
	if len(segs) > MaxPatternSegments {
		return "", invalid(CodeInvalid, "path %q has %d segments, at most %d allowed", p, len(segs), MaxPatternSegments)
	}
	stars := 0
	for _, s := range segs {
		if s == "**" {
			stars++
			continue
		}
		if _, err := path.Match(s, ""); err != nil {
			return "", invalid(CodeInvalid, "path %q: segment %q is not a valid glob: %v", p, s, err)
		}
	}
	if stars > MaxPatternDoubleStars {
		return "", invalid(CodeInvalid, "path %q has %d \"**\" segments, at most %d allowed", p, stars, MaxPatternDoubleStars)
	}
	return c, nil
}

// normalizePaths validates and cleans 1 to MaxClaimPaths patterns,
// dropping repeats.
func normalizePaths(paths []string) ([]string, error) {
	if len(paths) == 0 {
		return nil, invalid(CodeInvalid, "paths is empty: name at least one path or glob")
	}
	if len(paths) > MaxClaimPaths {
		return nil, invalid(CodeInvalid, "paths names %d patterns, at most %d per call", len(paths), MaxClaimPaths)
	}
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		c, err := ValidatePattern(p)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// NormalizeClaim checks a claim request (normalizePaths, a reason of at
// most MaxReasonBytes bytes of valid UTF-8, text shown inert
// wherever it is shown) and returns it with its paths cleaned. The
// error is an *InvalidError.
func NormalizeClaim(r ClaimRequest) (ClaimRequest, error) {
	paths, err := normalizePaths(r.Paths)
	if err != nil {
		return r, err
	}
	if len(r.Reason) > MaxReasonBytes {
		return r, invalid(CodeTooLarge, "reason is %d bytes, longest allowed is %d", len(r.Reason), MaxReasonBytes)
	}
	if !utf8.ValidString(r.Reason) {
		return r, invalid(CodeInvalid, "reason is not valid UTF-8")
	}
	r.Paths = paths
	return r, nil
}

// NormalizeRelease checks a release request and returns it with its paths
// cleaned (see NormalizeClaim). The error is an *InvalidError.
func NormalizeRelease(r ReleaseRequest) (ReleaseRequest, error) {
	paths, err := normalizePaths(r.Paths)
	if err != nil {
		return r, err
	}
	r.Paths = paths
	return r, nil
}

// DecodeClaimRequest decodes and normalizes one claim request: a single
// JSON object with no unknown field (a holder field is refused). The error
// is an *InvalidError.
func DecodeClaimRequest(data []byte) (ClaimRequest, error) {
	return decodeRequest(data, NormalizeClaim)
}

// DecodeReleaseRequest decodes and normalizes one release request. The
// error is an *InvalidError.
func DecodeReleaseRequest(data []byte) (ReleaseRequest, error) {
	return decodeRequest(data, NormalizeRelease)
}
