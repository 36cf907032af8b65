package main

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// defaultNATSURL is the server commands talk to when neither --nats nor
// NATS_URL names one: where `jetcrew up` listens by default.
const defaultNATSURL = "nats://127.0.0.1:4222"

// natsFlag adds --nats to cmd, storing into dst.
func natsFlag(cmd *cobra.Command, dst *string) {
	cmd.Flags().StringVar(dst, "nats", "", "NATS server URL(s), comma-separated (default $NATS_URL, else the NATS context's, else "+defaultNATSURL+")")
}

// natsURL resolves the server to use: the --nats flag, else $NATS_URL (as
// the nats CLI does), else "": the NATS context's URL, else defaultNATSURL
// (see natsOptions).
func (a *app) natsURL(flag string) string {
	if flag != "" {
		return flag
	}
	return a.getenv("NATS_URL")
}

// connect connects to the NATS server(s) at urls (empty: the context's, else
// defaultNATSURL) with the connection options every command takes (see
// connOptions: context, credentials, TLS), then extra. Connection events are
// logged without credentials.
func (a *app) connect(urls, name string, extra ...nats.Option) (*nats.Conn, error) {
	urls, opts, err := a.natsOptions(urls)
	if err != nil {
		return nil, err
	}
	return a.dial(urls, name, append(opts, extra...)...)
}

// dial connects to urls with opts only (no connection options from flags or
// contexts: `jetcrew up`'s own connection uses it).
func (a *app) dial(urls, name string, extra ...nats.Option) (*nats.Conn, error) {
	log := a.log.With().Str("nats", redactURL(urls)).Logger()
	opts := append([]nats.Option{
		nats.Name(name),
		nats.Timeout(5 * time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn().Err(err).Msg("disconnected from NATS")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("server", redactURL(nc.ConnectedUrl())).Msg("reconnected to NATS")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn().Err(err).Msg("NATS error")
		}),
	}, extra...)
	nc, err := nats.Connect(urls, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w (is `jetcrew up` running? set --nats or NATS_URL, and --context or --creds when the server wants credentials)", redactURL(urls), err)
	}
	log.Debug().Str("server", redactURL(nc.ConnectedUrl())).Msg("connected to NATS")
	return nc, nil
}

// dispatcher connects to NATS at urls as name and returns a dispatcher on
// that connection and the function that closes it.
//
// A permissions violation the server reports on that connection ends the
// command at once with that error (a refused request would otherwise wait
// for its timeout): the user's role may not do what the command does.
func (a *app) dispatcher(urls, name string) (*dispatcher.Dispatcher, func(), error) {
	nc, err := a.connect(urls, name, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) && a.refuse != nil {
			a.refuse(fmt.Errorf("the NATS server refused: %w (this user's role may not do this; docs/security.md lists what each role may do)", err))
			return
		}
		a.log.Warn().Err(err).Msg("NATS error")
	}))
	if err != nil {
		return nil, nil, err
	}
	d, err := dispatcher.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return d, nc.Close, nil
}

// runDispatcher is the prologue of the commands that take a RUN_ID (status,
// watch, cancel, replay, result, diff, apply, artifacts): it refuses an id
// that cannot be a run id (messages.ValidateToken) with a usage error,
// before connecting, then connects as dispatcher does, as name, to the
// server the command's --nats flag (urlFlag) or NATS_URL names (natsURL).
func (a *app) runDispatcher(urlFlag, id, name string) (*dispatcher.Dispatcher, func(), error) {
	if err := messages.ValidateToken("run id", id); err != nil {
		return nil, nil, usageError(err)
	}
	return a.dispatcher(a.natsURL(urlFlag), name)
}

// redactURL returns a NATS URL list with any password or token replaced,
// fit for logs and error messages.
func redactURL(s string) string {
	out := make([]byte, 0, len(s))
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != ',' {
			continue
		}
		part := s[start:i]
		if u, err := url.Parse(part); err == nil && u.User != nil {
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			} else {
				u.User = url.User("xxxxx")
			}
			part = u.String()
		}
		out = append(out, part...)
		if i < len(s) {
			out = append(out, ',')
		}
		start = i + 1
	}
	return string(out)
}
