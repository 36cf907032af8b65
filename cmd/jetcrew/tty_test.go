package main

import (
	"bytes"
	"io"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// tty opens a pseudo-terminal and returns its terminal end, for a command's
// stdout (isTerminal is true of it), and a function that closes it and
// returns every byte written to it. Output processing is off, so the bytes
// read are exactly those written.
func tty(t *testing.T) (*os.File, func() string) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err, "a pseudo-terminal")
	t.Cleanup(func() { _ = ptm.Close() })
	require.NoError(t, unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	require.NoError(t, err)
	pts, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err)
	tio, err := unix.IoctlGetTermios(int(pts.Fd()), unix.TCGETS)
	require.NoError(t, err)
	tio.Oflag &^= unix.OPOST
	require.NoError(t, unix.IoctlSetTermios(int(pts.Fd()), unix.TCSETS, tio))
	var got bytes.Buffer
	done := make(chan struct{})
	go func() { // ends when the terminal end closes (EIO)
		defer close(done)
		_, _ = io.Copy(&got, ptm)
	}()
	return pts, func() string {
		_ = pts.Close()
		<-done
		return got.String()
	}
}
