package main

import (
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Everything jetcrew prints for people that came from elsewhere (a run's
// reason, a dead letter's headers, a worker's message, and a run's output
// when it goes to a terminal) may hold bytes a terminal obeys: escape
// sequences that retitle the window, erase lines or move the cursor, bidi
// overrides that reorder text. Those are shown escaped instead, so what a
// run wrote cannot disguise itself or rewrite the operator's screen. JSON
// output (--json) stays exact: encoding/json escapes control characters
// itself.

// visibleString returns s with every control character but newline and tab,
// every bidi control and every byte that is not UTF-8 written as a Go escape
// (\x1b, \a, \r, \u202e, \xff).
func visibleString(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r):
			q := fmt.Sprintf("%+q", string(r)) // "\x1b", "\a", "\u202e"
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// needsEscape reports whether visibleString would change s.
func needsEscape(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || (r != '\n' && r != '\t' && (unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r))) {
			return true
		}
	}
	return false
}

// visibleWriter writes through visibleString. Each Write is escaped on its
// own: callers write whole lines or documents.
type visibleWriter struct{ w io.Writer }

// Write escapes p and writes it; it reports len(p) on success.
func (v visibleWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(v.w, visibleString(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// visible returns w wrapped in a visibleWriter.
func visible(w io.Writer) io.Writer { return visibleWriter{w} }

// outputWriter is where a run's output bytes go: w itself, or, when w is a
// terminal, w through visible (a pipe or file gets the bytes exactly).
func outputWriter(w io.Writer, forceVisible bool) io.Writer {
	if forceVisible || isTerminal(w) {
		return visible(w)
	}
	return w
}
