package console

import (
	"bytes"
	"errors"
	"net/http"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// core is what every page and action of the console shares. It holds
// the configuration (defaults applied), the dispatcher the console reads
// and acts through, the per-process CSRF token its forms carry and the
// parsed templates; every page type embeds it for render and message.
type core struct {
	cfg   Config
	d     *dispatcher.Dispatcher
	csrf  string
	pages map[string]*pageTemplate
}

// render writes page name, status 200 unless the handler set one before.
// It renders into a buffer first, so a template error is a clean 500.
func (c *core) render(w http.ResponseWriter, r *http.Request, name string, p page) {
	c.renderStatus(w, r, http.StatusOK, name, "layout", p)
}

// renderStatus executes template tmpl of page name with status code.
func (c *core) renderStatus(w http.ResponseWriter, _ *http.Request, code int, name, tmpl string, p page) {
	p.CSRF = c.csrf
	p.ReadOnly = c.cfg.ReadOnly
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, tmpl, p); err != nil {
		c.cfg.Log.Error().Err(err).Str("page", name).Msg("console: render")
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// message renders a short page saying what happened, with a link back. An
// action the server refused (see guard.action) says so instead, with a
// 403, whatever error its handler got for it (a cancelled context).
func (c *core) message(w http.ResponseWriter, r *http.Request, code int, title, text, back string) {
	c.messageRuns(w, r, code, title, text, back, nil)
}

// messageRuns is message, with links to the pages of runs below the text.
func (c *core) messageRuns(w http.ResponseWriter, r *http.Request, code int, title, text, back string, runs []string) {
	if e, ok := refusal(r.Context()); ok {
		code, text, runs = http.StatusForbidden, e.Error(), nil
	}
	c.renderStatus(w, r, code, "message", "layout", page{Title: title, Data: map[string]any{"Text": text, "Back": back, "Runs": runs}})
}

// runID returns the request's {id}, or renders 400 "Bad run id" (back to
// the runs list) and returns false when it is not a run id.
func (c *core) runID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if err := messages.ValidateToken("run id", id); err != nil {
		c.message(w, r, http.StatusBadRequest, "Bad run id", err.Error(), "/runs")
		return "", false
	}
	return id, true
}

// readStatus is the status of a page or download whose dispatcher read
// failed with err: 404 when err wraps notFound (the run, or its result
// object, is not there), else 502 (NATS could not be read).
func readStatus(err, notFound error) int {
	if errors.Is(err, notFound) {
		return http.StatusNotFound
	}
	return http.StatusBadGateway
}
