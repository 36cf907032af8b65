// Package bench holds jetcrew's benchmarks: programs that measure a figure
// together with its baseline in the same run (a bare JetStream loop, a bare
// Docker create+start, a bare NATS request/reply), and write both to
// bench/results.json and the results table of BENCHMARKS.md.
//
// They are tests behind the build tag "bench", so `go test ./...` and `make
// test` never run them. Run them with `make bench`, which builds the binaries
// and the sandbox image first; it is the same as
//
//	go test -tags bench -count=1 -timeout 15m -v ./bench
//
// They need a reachable Docker engine with jetcrew-sandbox:latest, and
// bin/jetcrew and bin/jetcrew-bridge (make build). CPU profiles of the hot
// paths are written to bench/*.prof (git-ignored); BENCHMARKS.md says what
// they show.
package bench
