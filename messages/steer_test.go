package messages

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestValidateSteer(t *testing.T) {
	t.Parallel()
	for text, code := range map[string]string{
		"change of plan":                     "",
		"multi\nline\ttext":                  "",
		"":                                   SteerInvalid,
		" \n":                                SteerInvalid,
		"a\x00b":                             SteerInvalid,
		"\xff":                               SteerInvalid,
		strings.Repeat("x", MaxSteerBytes):   "",
		strings.Repeat("x", MaxSteerBytes+1): SteerTooLarge,
	} {
		got, err := ValidateSteer(text)
		require.Equal(t, code, got, "%.20q", text)
		require.Equal(t, code != "", err != nil)
	}
	require.NoError(t, ValidateSteerID("st-1_A"))
	require.ErrorIs(t, ValidateSteerID("a.b"), ErrInvalidSteer)
	require.ErrorIs(t, ValidateSteerID(""), ErrInvalidSteer)
	require.ErrorIs(t, ValidateSteerID(strings.Repeat("a", MaxSteerIDLen+1)), ErrInvalidSteer)
	require.Equal(t, "jetcrew.steer.r1", SubjectSteer("r1"))
}

func TestSteeredEventJSON(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(CoordEvent{RunID: "r1", Group: "g", Kind: CoordSteered, Time: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		SteerID: "s1", Outcome: SteerQueued, Bytes: 5, MessageID: "7", Reason: "no input"})
	require.NoError(t, err)
	require.JSONEq(t, `{"run_id":"r1","group":"g","kind":"steered","time":"2026-12-01T00:00:00Z","message_id":"7","bytes":5,"reason":"no input","steer_id":"s1","outcome":"queued"}`, string(b))
	b, err = json.Marshal(SteerReply{RunID: "r1", ID: "s1", Outcome: SteerRefused, Code: SteerEnded, Reason: "run r1 has ended (succeeded)"})
	require.NoError(t, err)
	require.JSONEq(t, `{"run_id":"r1","id":"s1","outcome":"refused","code":"ended","reason":"run r1 has ended (succeeded)"}`, string(b))
}
