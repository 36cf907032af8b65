package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// The lifecycle lines of watch and submit --wait: a started event says
// "(warm)" when the run started in a warm container.
func TestDescribeEvent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ev   dispatcher.WatchEvent
		want string
	}{
		{"cold start", dispatcher.WatchEvent{Type: messages.EventStarted, Attempt: 1,
			Event: messages.Event{Worker: "w1", ContainerID: "0123456789abcdef"}},
			"started: attempt 1 on worker w1, container 0123456789ab"},
		{"warm start", dispatcher.WatchEvent{Type: messages.EventStarted, Attempt: 2,
			Event: messages.Event{Worker: "w1", ContainerID: "0123456789abcdef", Warm: true}},
			"started: attempt 2 on worker w1, container 0123456789ab (warm)"},
		{"finished warm says its outcome alone", dispatcher.WatchEvent{Type: messages.EventFinished,
			Event: messages.Event{State: messages.StateSucceeded, Warm: true}},
			"finished: succeeded"},
		{"adopted", dispatcher.WatchEvent{Type: messages.EventAdopted, Attempt: 1,
			Event: messages.Event{Worker: "w2", AdoptedFrom: "w1", GapMS: 2345}},
			"adopted: attempt 1 goes on on worker w2, taken over from w1 after 2.35s unwatched"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, describeEvent(tt.ev))
		})
	}
}
