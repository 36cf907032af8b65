package console

import (
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// pageNames are the templates under templates/, each rendered inside
// layout.html.
var pageNames = []string{"overview", "runs", "run", "group", "deadletters", "egress", "confirm", "login", "message", "questions"}

// pageTemplate is one page's template set: layout plus the page.
type pageTemplate = template.Template

// page is what every template gets.
type page struct {
	// Title is the page title.
	Title string
	// Nav names the navigation entry to highlight.
	Nav string
	// CSRF is the per-process token every form posts back.
	CSRF string
	// Data is the page's own data.
	Data any
	// Rev is the run cache's sequence when the page's data was gathered:
	// its live stream sends every change after it (see cache.subscribe).
	Rev uint64
	// ReadOnly is Config.ReadOnly: the page shows no action.
	ReadOnly bool
}

// revParam reads a live stream's ?rev=, the cache sequence its page was
// rendered at; 0 (everything) when absent.
func revParam(r *http.Request) uint64 {
	n, _ := strconv.ParseUint(r.URL.Query().Get("rev"), 10, 64)
	return n
}

var funcs = template.FuncMap{
	"visible":        visible,
	"ago":            ago,
	"clock":          clock,
	"labels":         labelList,
	"short":          func(s string) string { return shortText(s, 12) },
	"final":          func(s messages.State) bool { return s.Final() },
	"activity":       func(st *messages.RunState) string { return isoTime(dispatcher.Activity(st)) },
	"usageShort":     usageShort,
	"spend":          poolSpend,
	"until":          until,
	"askAlert":       egressAlert,
	"sendForm":       newSendForm,
	"questionsBox":   newQuestionsBox,
	"questionsAlert": questionsAlert,
	"when":           whenHTML,
	"waited":         func(st messages.RunState) template.HTML { return durHTML(waitSpan(&st)) },
	"ran":            func(st messages.RunState) template.HTML { return durHTML(runSpan(&st)) },
	"iso":            isoTime,
	"egressTotals":   egressTotalsText,
	"deref": func(p *int) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	},
}

func parsePages() (map[string]*pageTemplate, error) {
	out := make(map[string]*pageTemplate, len(pageNames))
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// ago returns how long before now t was, shortly: "3s", "4m10s", "2h5m";
// "-" for the zero time.
func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return shortDuration(time.Since(t))
}

func shortDuration(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
	case d >= time.Hour:
		return d.Truncate(time.Minute).String()
	}
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Truncate(time.Second).String()
}

// clock formats t as UTC time of day with milliseconds; "-" when zero.
func clock(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000")
}

// labelList returns a run's labels as sorted "k=v" strings, made visible.
func labelList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, visible(k+"="+v))
	}
	sort.Strings(out)
	return out
}

// shortText shortens s to n runes with an ellipsis.
func shortText(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return strings.TrimSpace(string(r[:n])) + "…"
}

// sendForm is what the send-form template (layout.html) gets: the form's
// action and CSRF token, and on a group's page (Group) its runs, whose
// queued and running ones are recipients beside "every run".
type sendForm struct {
	Action, CSRF string
	Group        bool
	Runs         []*messages.RunState
}

func newSendForm(action, csrf string, group bool, runs []*messages.RunState) sendForm {
	return sendForm{Action: action, CSRF: csrf, Group: group, Runs: runs}
}
