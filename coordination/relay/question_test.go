package relay_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

func TestNormalizeAsk(t *testing.T) {
	t.Parallel()
	r, err := relay.NormalizeAsk(relay.AskRequest{To: "operator", Question: "q?", Choices: []string{"a", "b", "a"}})
	require.NoError(t, err)
	require.Equal(t, relay.AskRequest{To: "operator", Question: "q?", Choices: []string{"a", "b"}, TimeoutSeconds: relay.DefaultAskSeconds}, r)
	for _, c := range []struct {
		r    relay.AskRequest
		want string
	}{
		{relay.AskRequest{Question: "q"}, "to is empty"},
		{relay.AskRequest{To: "a.b", Question: "q"}, "is not a run id"},
		{relay.AskRequest{To: "all"}, "question is empty"},
		{relay.AskRequest{To: "all", Question: "\xff"}, "not valid UTF-8"},
		{relay.AskRequest{To: "all", Question: strings.Repeat("x", relay.MaxQuestionBytes+1)}, "4097 bytes"},
		{relay.AskRequest{To: "all", Question: "q", Choices: []string{""}}, "a choice is empty"},
		{relay.AskRequest{To: "all", Question: "q", TimeoutSeconds: -1}, "timeout_seconds -1 is out of range"},
		{relay.AskRequest{To: "all", Question: "q", TimeoutSeconds: relay.MaxAskSeconds + 1}, "out of range: 0 to 86400"},
	} {
		_, err := relay.NormalizeAsk(c.r)
		require.ErrorContains(t, err, c.want)
	}
	_, err = relay.DecodeAskRequest([]byte(`{"to":"all","question":"q","from":"operator"}`))
	require.ErrorContains(t, err, "unknown field")
}

func FuzzDecodeAskRequest(f *testing.F) {
	for _, s := range []string{`{"to":"operator","question":"q?"}`, `{"to":"all","question":"x","choices":["a","a"],"timeout_seconds":5}`,
		`{"to":"r1","question":""}`, `{"from":"x"}`, `{`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := relay.DecodeAskRequest(data)
		if err != nil {
			var ie *relay.InvalidError
			require.True(t, errors.As(err, &ie), "error is not an InvalidError: %v", err)
			return
		}
		require.True(t, utf8.ValidString(r.Question) && len(r.Question) <= relay.MaxQuestionBytes)
		require.LessOrEqual(t, len(r.Choices), relay.MaxChoices)
		require.True(t, r.TimeoutSeconds >= 1 && r.TimeoutSeconds <= relay.MaxAskSeconds)
		b, err := json.Marshal(r)
		require.NoError(t, err)
		r2, err := relay.DecodeAskRequest(b)
		require.NoError(t, err)
		require.Equal(t, r, r2)
	})
}

func FuzzDecodeReplyRequest(f *testing.F) {
	for _, s := range []string{`{"question_id":"qaaaaaaaaaaaaaaaa","answer":"yes"}`, `{"question_id":"q1","answer":"x"}`, `{"answer":""}`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := relay.DecodeReplyRequest(data)
		if err != nil {
			var ie *relay.InvalidError
			require.True(t, errors.As(err, &ie), "error is not an InvalidError: %v", err)
			return
		}
		require.True(t, messages.ValidCoordQuestionID(r.QuestionID))
		require.True(t, r.Answer != "" && len(r.Answer) <= relay.MaxAnswerBytes && utf8.ValidString(r.Answer))
	})
}
