package coordination

import (
	"path"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// PatternsOverlap reports whether two claimed patterns (cleaned by
// relay.ValidatePattern) could cover a common path. A pattern covers every
// path it matches and everything under those paths: claiming "src" claims
// "src/a.go", as "src/**" does. Segments are matched one by one: "**" as a
// whole segment stands for any number of segments (none included), any
// other segment is a path.Match pattern ('*', '?', '[…]' within one
// segment).
//
// Names are also compared folded (foldName): "Src/A.go" overlaps "src/a.go",
// and a name in Unicode's decomposed form (NFD) overlaps its composed form
// (NFC), as they name one file on a case-insensitive or normalising host.
//
// The check is conservative: it may say two patterns overlap when no path
// matches both, never the reverse. Two segments overlap when they are
// equal, when one is literal and the other matches it, or, both being
// globs, when their literal prefixes (before the first '*', '?' or '[')
// and literal suffixes (after the last '*', '?' or ']') agree: so
// "*.go" and "*_test.go" overlap, "a*" and "b*" do not, and "*.go" and
// "x?" are said to overlap though no name matches both.
func PatternsOverlap(a, b string) bool {
	// Everything under a covered path is covered: each pattern ends in an
	// implicit "**".
	as := append(strings.Split(a, "/"), "**")
	bs := append(strings.Split(b, "/"), "**")
	memo := make(map[[2]int]bool)
	var rec func(i, j int) bool
	rec = func(i, j int) bool {
		if i == len(as) {
			return onlyDoubleStars(bs[j:])
		}
		if j == len(bs) {
			return onlyDoubleStars(as[i:])
		}
		k := [2]int{i, j}
		if v, ok := memo[k]; ok {
			return v
		}
		var v bool
		switch {
		case as[i] == "**":
			// It matches no segment, or b's segment j and maybe more.
			v = rec(i+1, j) || rec(i, j+1)
		case bs[j] == "**":
			v = rec(i, j+1) || rec(i+1, j)
		default:
			v = segmentsOverlap(as[i], bs[j]) && rec(i+1, j+1)
		}
		memo[k] = v
		return v
	}
	return rec(0, 0)
}

func onlyDoubleStars(segs []string) bool {
	for _, s := range segs {
		if s != "**" {
			return false
		}
	}
	return true
}

// segmentsOverlap reports whether some name could match both path.Match
// patterns x and y (conservatively: see PatternsOverlap), as they are or
// once folded (foldName).
func segmentsOverlap(x, y string) bool {
	return rawSegmentsOverlap(x, y) || rawSegmentsOverlap(foldName(x), foldName(y))
}

// foldName is a name, or a segment's pattern, in Unicode normalisation
// form C and lower case (Unicode's simple mappings, no locale's): names
// that differ only in case or normalisation are one file on the
// case-insensitive or normalising file systems of macOS and Windows, where
// a group's results may be applied, so claims treat them as one.
func foldName(s string) string { return strings.ToLower(norm.NFC.String(s)) }

// rawSegmentsOverlap is segmentsOverlap on x and y as given.
func rawSegmentsOverlap(x, y string) bool {
	gx, gy := isGlob(x), isGlob(y)
	switch {
	case !gx && !gy:
		return x == y
	case !gx:
		ok, err := path.Match(y, x)
		return ok || err != nil
	case !gy:
		ok, err := path.Match(x, y)
		return ok || err != nil
	}
	px, py := literalPrefix(x), literalPrefix(y)
	if !strings.HasPrefix(px, py) && !strings.HasPrefix(py, px) {
		return false
	}
	sx, sy := literalSuffix(x), literalSuffix(y)
	return strings.HasSuffix(sx, sy) || strings.HasSuffix(sy, sx)
}

func isGlob(s string) bool { return strings.ContainsAny(s, "*?[") }

// literalPrefix is s up to its first glob metacharacter: every name s
// matches starts with it.
func literalPrefix(s string) string {
	if i := strings.IndexAny(s, "*?["); i >= 0 {
		return s[:i]
	}
	return s
}

// literalSuffix is s after its last glob metacharacter ('*', '?' or the
// ']' closing a class): every name s matches ends with it.
func literalSuffix(s string) string {
	if i := strings.LastIndexAny(s, "*?]"); i >= 0 {
		return s[i+1:]
	}
	return s
}
