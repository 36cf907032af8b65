// Command natsidle is the baseline of the worker's idle memory benchmark: a
// static Go program that connects to NATS (the URL in its only argument),
// creates a JetStream context, and then does nothing until it is killed. Its
// resident set is what any Go process holding a NATS connection costs.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: natsidle NATS_URL")
		os.Exit(2)
	}
	nc, err := nats.Connect(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "natsidle:", err)
		os.Exit(1)
	}
	defer nc.Close()
	if _, err := jetstream.New(nc); err != nil {
		fmt.Fprintln(os.Stderr, "natsidle:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	<-sigs
}
