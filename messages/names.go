package messages

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// ReservedNames are the names no run id, group or pool may take, compared
// without regard to case: they are the reserved recipients of coordination
// subjects (jetcrew.coord.<group>.all and .operator, see the coordination
// package). A run called "all" would read every broadcast as its inbox and
// never be addressable; a group or pool of that name would be confused with
// them by the people reading the subjects.
var ReservedNames = []string{"all", "operator"}

// ErrReservedName is returned, wrapped, by ValidateName for one of
// ReservedNames.
var ErrReservedName = errors.New("reserved name")

// ValidateName is ValidateToken for a run id, group or pool: it also refuses
// ReservedNames. what names the field in the error, which wraps
// ErrInvalidToken or ErrReservedName.
func ValidateName(what, s string) error {
	if err := ValidateToken(what, s); err != nil {
		return err
	}
	if slices.Contains(ReservedNames, strings.ToLower(s)) {
		return fmt.Errorf("%s: %w: %q is a coordination address (reserved: %s)", what, ErrReservedName, s, strings.Join(ReservedNames, ", "))
	}
	return nil
}

// SalvageRunID returns the id a run request carries, or "" when it carries
// no usable one, whatever else is wrong with the request (too large, unknown
// or inexact keys, bad values): the top-level key "id", exactly once, with a
// string value that passes ValidateName, in a document that is well-formed
// JSON (in a broken one a second "id" could hide past the break). A failure of the request is then
// recorded under the id its submitter chose and can look up. data must be a
// JSON object; anything else has no id.
func SalvageRunID(data []byte) string {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	id, found := "", false
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return ""
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return "" // unreadable past here: a second id could follow
		}
		if key != "id" {
			continue
		}
		if found {
			return "" // two ids: neither is the submitter's for sure
		}
		found = true
		if json.Unmarshal(v, &id) != nil {
			return ""
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return ""
	}
	if _, err := dec.Token(); err != io.EOF {
		return "" // more than one document: which is the request?
	}
	if ValidateName("id", id) != nil {
		return ""
	}
	return id
}

// RequestDigest returns the digest of an encoded run request as published:
// "sha256:" and the hex SHA-256 of data without the JSON white space around
// the value (a shell pipe that adds a newline does not make another
// request; anything inside the object does). The worker records it in
// every state it writes, from the claim that creates the run's record on
// (RunState.RequestDigest), so a request that reuses a run id with another
// body is told apart from a redelivery or a replay of the same request.
func RequestDigest(data []byte) string {
	sum := sha256.Sum256(bytes.Trim(data, " \t\r\n"))
	return "sha256:" + hex.EncodeToString(sum[:])
}
