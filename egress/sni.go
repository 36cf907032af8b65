package egress

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
)

// errHelloRead stops the TLS handshake once the ClientHello has been read.
var errHelloRead = errors.New("client hello read")

// helloConn feeds a tls.Server from r and refuses every write, so the
// handshake reads the ClientHello and never answers it.
type helloConn struct {
	net.Conn
	r io.Reader
}

func (c helloConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c helloConn) Write(p []byte) (int, error) { return 0, errors.New("read-only") }

// readClientHello reads a TLS ClientHello from conn and returns its server
// name (SNI, "" when the hello has none) and every byte read, which the
// caller must forward upstream first. The parsing is crypto/tls's own: a
// tls.Server is handed the bytes and stopped in GetConfigForClient. It
// returns an error when the bytes are not a TLS ClientHello.
func readClientHello(conn net.Conn) (sni string, read []byte, err error) {
	var buf bytes.Buffer
	var hello *tls.ClientHelloInfo
	srv := tls.Server(helloConn{Conn: conn, r: io.TeeReader(conn, &buf)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			hello = h
			return nil, errHelloRead
		},
	})
	herr := srv.Handshake()
	if hello == nil {
		if herr == nil {
			herr = errors.New("no client hello")
		}
		return "", buf.Bytes(), herr
	}
	return hello.ServerName, buf.Bytes(), nil
}
