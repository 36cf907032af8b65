package dispatcher_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// Example submits a run and follows it to its end. The NATS server is
// embedded and the worker runs a fake runtime here; in production both are
// `jetcrew up`, and the dispatcher only needs a connection.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	dir, err := os.MkdirTemp("", "jetcrew-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		log.Fatal(err)
	}
	go srv.Start()
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		log.Fatal("nats-server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	// A worker whose fake containers read the prompt as a tiny script; its
	// shell profile has coordination off, so no jetcrew-bridge is needed.
	stateDir, err := os.MkdirTemp("", "jc")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(stateDir)
	shell, off := profile.ShellProfile(), false
	shell.Coordination = &off
	w, err := worker.New(nc, worker.Config{ID: "example", Runtime: workertest.NewRuntime(),
		Profiles: profile.Profiles{"shell": shell}, StateDir: stateDir})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer w.Stop(context.Background())

	d, err := dispatcher.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	id, err := d.Submit(ctx, messages.RunRequest{Profile: "shell", Prompt: "out hello; exit 3"})
	if err != nil {
		log.Fatal(err)
	}
	fin, err := d.Watch(ctx, id, func(ev dispatcher.WatchEvent) error {
		if ev.Type == messages.EventOutput {
			fmt.Printf("%s: %s", ev.Stream, ev.Data)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("finished:", fin.State, *fin.ExitCode)

	st, err := d.Status(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("state:", st.State, st.Reason)
	// Output:
	// stdout: hello
	// finished: failed 3
	// state: failed exit code 3
}
