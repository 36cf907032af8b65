package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
)

// newLogger returns the program's logger: JSON lines on w, or zerolog's
// console format when w is a terminal. level is a zerolog level name.
func newLogger(w io.Writer, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("--log-level %q: want trace, debug, info, warn or error", level)
	}
	out := w
	if isTerminal(w) {
		// Log fields hold what runs wrote (reasons): shown escaped, and
		// so without colours.
		out = zerolog.ConsoleWriter{Out: visible(w), NoColor: true, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(out).Level(lvl).With().Timestamp().Logger(), nil
}

// isTerminal reports whether w is a character device such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
