package console

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// visible returns s as text a page can show: invalid UTF-8 becomes U+FFFD,
// and every control character but newline and tab, and every character
// that reorders text (bidi overrides and isolates), becomes a visible
// stand-in: C0 controls their Unicode control picture (ESC is "␛"), DEL
// "␡", the others "<U+XXXX>". What a run printed can then neither hide
// text nor move it around on the page.
func visible(s string) string {
	if !strings.ContainsFunc(s, needsPicture) && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		switch {
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r < 0x20:
			b.WriteRune(0x2400 + r)
		case r == 0x7f:
			b.WriteRune('\u2421')
		case needsPicture(r):
			fmt.Fprintf(&b, "<U+%04X>", r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// needsPicture reports whether r must not reach the page as itself.
func needsPicture(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x200e, r == 0x200f, r == 0x061c:
		return true
	}
	return false
}

// utf8Carry splits b into the longest prefix that does not end inside a
// UTF-8 sequence and the incomplete sequence after it (at most 3 bytes), so
// a character split across two output chunks is shown whole.
func utf8Carry(b []byte) (whole, rest []byte) {
	for i := 1; i <= 3 && i <= len(b); i++ {
		c := b[len(b)-i]
		if c < 0x80 {
			return b, nil // ASCII: nothing pending
		}
		if c >= 0xc0 { // a lead byte: is its sequence complete?
			need := 2
			switch {
			case c >= 0xf0:
				need = 4
			case c >= 0xe0:
				need = 3
			}
			if need > i {
				return b[:len(b)-i], b[len(b)-i:]
			}
			return b, nil
		}
	}
	return b, nil
}
