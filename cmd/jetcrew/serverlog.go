package main

import (
	"fmt"

	"github.com/rs/zerolog"
)

// serverLogger routes the embedded nats-server's log to zerolog. Server
// notices (its start-up banner, stream restores) are logged at debug level,
// warnings and errors at theirs; debug and trace lines only reach the
// server when the level asks for them (see enable).
//
// The server calls Fatalf when it cannot go on (for example the port is
// taken). serverLogger logs it as an error and reports it on fatal instead
// of exiting the process, so `jetcrew up` can shut down cleanly.
type serverLogger struct {
	log   zerolog.Logger
	fatal chan string // buffered; the first fatal message
}

func newServerLogger(log zerolog.Logger) *serverLogger {
	return &serverLogger{
		log:   log.With().Str("component", "nats-server").Logger(),
		fatal: make(chan string, 1),
	}
}

// enable returns the debug and trace flags for SetLoggerV2 matching the
// logger's level.
func (l *serverLogger) enable() (debug, trace bool) {
	lvl := l.log.GetLevel()
	return lvl <= zerolog.DebugLevel, lvl <= zerolog.TraceLevel
}

// Noticef implements server.Logger.
func (l *serverLogger) Noticef(format string, v ...any) { l.log.Debug().Msgf(format, v...) }

// Warnf implements server.Logger.
func (l *serverLogger) Warnf(format string, v ...any) { l.log.Warn().Msgf(format, v...) }

// Errorf implements server.Logger.
func (l *serverLogger) Errorf(format string, v ...any) { l.log.Error().Msgf(format, v...) }

// Fatalf implements server.Logger: see serverLogger.
func (l *serverLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error().Bool("fatal", true).Msg(msg)
	select {
	case l.fatal <- msg:
	default:
	}
}

// Debugf implements server.Logger.
func (l *serverLogger) Debugf(format string, v ...any) { l.log.Debug().Msgf(format, v...) }

// Tracef implements server.Logger.
func (l *serverLogger) Tracef(format string, v ...any) { l.log.Trace().Msgf(format, v...) }
