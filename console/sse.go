package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// sseKeepAlive is how often an idle live stream sends a comment, so
// proxies and the browser keep it open.
const sseKeepAlive = 15 * time.Second

// hub serves the pages' live streams, at most Config.MaxStreams at once.
// It opens each server-sent event stream on the run cache's changes and
// feeds it the dispatcher's followers of events and messages.
type hub struct {
	streams chan struct{} // one token per live stream served
	cache   *cache
	d       *dispatcher.Dispatcher
	log     zerolog.Logger
}

// sse writes server-sent events to one client.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// start takes a live-stream slot (refusing with 503 when all
// Config.MaxStreams are in use) and writes the event-stream headers. The
// returned release function gives the slot back; ok is false when the
// request was refused.
func (h *hub) start(w http.ResponseWriter) (s *sse, release func(), ok bool) {
	select {
	case h.streams <- struct{}{}:
	default:
		http.Error(w, "too many live streams open", http.StatusServiceUnavailable)
		return nil, nil, false
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s = &sse{w: w, rc: http.NewResponseController(w)}
	_ = s.rc.Flush()
	return s, func() { <-h.streams }, true
}

// open starts a live stream of the run states match keeps: it subscribes
// to the cache, takes a slot (start) and sends, as events named name, the
// states changed since the page's revision (?rev=, revParam) as row makes
// them. The caller reads updates, the states changing from then on, and
// calls end when the stream ends. ok is false, and nothing is left to end,
// when the stream was refused or the client went while the missed states
// were sent.
func (h *hub) open(w http.ResponseWriter, r *http.Request, match func(*messages.RunState) bool, name string,
	row func(messages.RunState) any) (s *sse, updates <-chan messages.RunState, end func(), ok bool) {
	updates, missed, unsubscribe := h.cache.subscribe(revParam(r), match)
	s, release, ok := h.start(w)
	if !ok {
		unsubscribe()
		return nil, nil, nil, false
	}
	end = func() {
		release()
		unsubscribe()
	}
	for _, st := range missed {
		if s.send(name, row(st)) != nil {
			end()
			return nil, nil, nil, false
		}
	}
	return s, updates, end, true
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
// changed since the page's revision first, then live), beside the events
// open's source produces, each turned into a server-sent event by event
// (none when event names it ""), with keep-alive pings, until the client
// goes or a source ends. It is a function, not a hub method, because Go
// methods take no type parameters.
func serveLive[T any](h *hub, w http.ResponseWriter, r *http.Request, match func(*messages.RunState) bool,
	row func(messages.RunState) any, open func(context.Context) <-chan T, event func(T) (string, any)) {
	s, updates, end, ok := h.open(w, r, match, "state", row)
	if !ok {
		return
	}
	defer end()
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

// follow runs dispatcher.Follow for filters in a goroutine that ends with
// ctx, and returns its events. The channel is closed when Follow ends.
func (h *hub) follow(ctx context.Context, filters []string) <-chan dispatcher.WatchEvent {
	return feed(ctx, func(ctx context.Context, fn func(dispatcher.WatchEvent) error) error {
		return h.d.Follow(ctx, filters, fn)
	}, func(err error) { h.log.Warn().Err(err).Msg("console: follow events") })
}

// followMessages runs dispatcher.FollowMessages on stream for filters in a
// goroutine that ends with ctx, and returns its messages. The channel is
// closed when FollowMessages ends.
func (h *hub) followMessages(ctx context.Context, stream string, filters []string) <-chan dispatcher.StreamMsg {
	return feed(ctx, func(ctx context.Context, fn func(dispatcher.StreamMsg) error) error {
		return h.d.FollowMessages(ctx, stream, filters, fn)
	}, func(err error) { h.log.Warn().Err(err).Str("stream", stream).Msg("console: follow messages") })
}

// feed runs follow in a goroutine that ends with ctx, handing what it
// follows to the returned channel (64 buffered), which is closed when
// follow returns. A failure not caused by ctx goes to onErr.
func feed[T any](ctx context.Context, follow func(context.Context, func(T) error) error, onErr func(error)) <-chan T {
	out := make(chan T, 64)
	go func() {
		defer close(out)
		err := follow(ctx, func(v T) error {
			select {
			case out <- v:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		if err != nil && ctx.Err() == nil {
			onErr(err)
		}
	}()
	return out
}
