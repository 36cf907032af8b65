package console

import (
	"html/template"
	"strconv"
	"time"

	"github.com/jetcrew/jetcrew/messages"
)

// isoTime formats t for a page's script (time.rel's datetime, a span's
// data-from): RFC 3339 in UTC with milliseconds; "" for the zero time.
func isoTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// relTime says how long before now t was, as people say it: "just now",
// "42 s ago", "2 min ago", "3 h ago", "5 d ago"; "-" for the zero time. A
// time after now (another clock) is "just now". app.js says the same
// (rel), and keeps saying it as time passes.
func relTime(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 10*time.Second:
		return "just now"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + " s ago"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + " min ago"
	case d < 24*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + " h ago"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + " d ago"
}

// whenHTML is a <time> element saying t relative to now (relTime), its
// absolute time, time zone marked, on hover: the page's script adds the
// viewer's own zone and keeps the relative text current. "-" for the zero
// time. Only times reach it: nothing a run chose.
func whenHTML(t time.Time) template.HTML {
	if t.IsZero() {
		return "-"
	}
	return template.HTML(`<time class="rel" datetime="` + isoTime(t) + `" title="` + clock(t) + ` UTC">` +
		relTime(t, time.Now()) + `</time>`)
}

// span is a stretch of a run's life: from, and to when it has ended.
// Live is true while it goes on (to is now).
type span struct {
	from, to time.Time
	live     bool
}

// waitSpan is how long st waited for a worker: from its queueing to its
// (latest) start, or to its end when it never started; still going while
// it is queued.
func waitSpan(st *messages.RunState) span {
	switch {
	case st.QueuedAt.IsZero():
		return span{}
	case !st.StartedAt.IsZero():
		return span{from: st.QueuedAt, to: st.StartedAt}
	case st.State.Final():
		return span{from: st.QueuedAt, to: st.FinishedAt}
	}
	return span{from: st.QueuedAt, live: true}
}

// runSpan is how long st ran: from its (latest) start to its end; still
// going while it is not final.
func runSpan(st *messages.RunState) span {
	switch {
	case st.StartedAt.IsZero():
		return span{}
	case !st.FinishedAt.IsZero():
		return span{from: st.StartedAt, to: st.FinishedAt}
	case st.State.Final():
		return span{}
	}
	return span{from: st.StartedAt, live: true}
}

// text says the span's length (shortDuration), "-" when it has none.
func (s span) text(now time.Time) string {
	switch {
	case s.from.IsZero() || (!s.live && s.to.IsZero()):
		return "-"
	case s.live:
		return shortDuration(now.Sub(s.from))
	}
	return shortDuration(s.to.Sub(s.from))
}

// durHTML is an element saying the span's length; one still going carries
// its start for the page's script to count on.
func durHTML(s span) template.HTML {
	txt := s.text(time.Now())
	if !s.live {
		return template.HTML(`<span class="dur">` + txt + `</span>`)
	}
	return template.HTML(`<span class="dur" data-from="` + isoTime(s.from) + `">` + txt + `</span>`)
}
