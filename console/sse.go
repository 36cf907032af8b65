package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/jetcrew/jetcrew/messages"
)

// sseKeepAlive is how often an idle live stream sends a comment, so
// proxies and the browser keep it open.
const sseKeepAlive = 15 * time.Second

// sse writes server-sent events to one client.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// startSSE takes a live-stream slot (refusing with 503 when all
// Config.MaxStreams are in use) and writes the event-stream headers. The
// returned release function gives the slot back; ok is false when the
// request was refused.
func (c *Console) startSSE(w http.ResponseWriter) (s *sse, release func(), ok bool) {
	select {
	case c.streams <- struct{}{}:
	default:
		http.Error(w, "too many live streams open", http.StatusServiceUnavailable)
		return nil, nil, false
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s = &sse{w: w, rc: http.NewResponseController(w)}
	_ = s.rc.Flush()
	return s, func() { <-c.streams }, true
}

// send writes one event named name whose data is v as JSON, and flushes.
// JSON keeps the data on one line: a run's output cannot forge events.
func (s *sse) send(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", name, b); err != nil {
		return err
	}
	return s.rc.Flush()
}

// ping writes a comment line, keeping the stream open.
func (s *sse) ping() error {
	if _, err := fmt.Fprint(s.w, ": ping\n\n"); err != nil {
		return err
	}
	return s.rc.Flush()
}

// serveLive is the stream every live page of one subject serves: the
// "state" events of the runs match keeps, each as row makes it (those
// changed since the page's revision first, then live), beside the events open's source produces,
// each turned into a server-sent event by event (none when event names
// it ""), with keep-alive pings, until the client goes or a source ends.
func serveLive[T any](c *Console, w http.ResponseWriter, r *http.Request, match func(*messages.RunState) bool,
	row func(messages.RunState) any, open func(context.Context) <-chan T, event func(T) (string, any)) {
	updates, missed, unsubscribe := c.cache.subscribe(revParam(r), match)
	defer unsubscribe()
	s, release, ok := c.startSSE(w)
	if !ok {
		return
	}
	defer release()
	for _, st := range missed {
		if s.send("state", row(st)) != nil {
			return
		}
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	src := open(ctx)
	keep := time.NewTicker(sseKeepAlive)
	defer keep.Stop()
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case <-keep.C:
			err = s.ping()
		case st, ok := <-updates:
			if !ok {
				return
			}
			if match(&st) {
				err = s.send("state", row(st))
			}
		case v, ok := <-src:
			if !ok {
				return
			}
			if name, val := event(v); name != "" {
				err = s.send(name, val)
			}
		}
		if err != nil {
			return
		}
	}
}
