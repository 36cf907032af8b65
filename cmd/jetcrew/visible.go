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
// run wrote cannot disguise itself or rewrite the operator's screen, and so
// is every name a run chose (its files, artifacts and objects), with
// newline and tab too, wherever it is printed. JSON output (--json) stays
// exact: encoding/json escapes C0 control characters itself, and inertJSON
// writes the others a terminal obeys as \u escapes, which decode to the
// same strings.

// visibleString returns s with every control character but newline and tab,
// every bidi control and every byte that is not UTF-8 written as a Go escape
// (\x1b, \a, \r, \u202e, \xff).
func visibleString(s string) string { return escape(s, true) }

// visibleName returns s, one field of a line (a file name a run chose, an
// artifact's, an object's), escaped as visibleString escapes it and with
// newline and tab escaped too (\n, \t), so that a name forges no line or
// column of a listing.
func visibleName(s string) string { return escape(s, false) }

// escape writes every control character, every bidi control and every byte
// that is not UTF-8 in s as a Go escape; newline and tab stay as they are
// when layout is true.
func escape(s string, layout bool) string {
	if !needsEscape(s, layout) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case layout && (r == '\n' || r == '\t'):
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

// needsEscape reports whether escape would change s.
func needsEscape(s string, layout bool) bool {
	for _, r := range s {
		if r == utf8.RuneError || (!(layout && (r == '\n' || r == '\t')) && (unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r))) {
			return true
		}
	}
	return false
}

// inertJSON returns the JSON document b with every DEL, C1 control and bidi
// control (which encoding/json leaves as they are) written as a \uXXXX
// escape: the document decodes to exactly the same values, and a terminal
// shows it without obeying or reordering anything. Those characters occur
// in JSON only inside strings, where the escape is valid.
func inertJSON(b []byte) []byte {
	s := string(b)
	if !strings.ContainsFunc(s, jsonUnsafe) {
		return b
	}
	var out strings.Builder
	for _, r := range s {
		if jsonUnsafe(r) {
			fmt.Fprintf(&out, `\u%04x`, r)
		} else {
			out.WriteRune(r)
		}
	}
	return []byte(out.String())
}

// jsonUnsafe reports whether r is a character encoding/json leaves raw that
// a terminal obeys or that reorders text: DEL, a C1 control, a bidi control.
func jsonUnsafe(r rune) bool {
	return r == 0x7f || (r >= 0x80 && r <= 0x9f) || unicode.Is(unicode.Bidi_Control, r)
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
