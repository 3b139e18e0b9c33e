// Command loadtest is `make loadtest`: the end-to-end benchmark of issue 12.
// It builds the real cmd/dedupesvc and cmd/payments-server, runs them on
// loopback (one Dedupe service on a throwaway PostgreSQL database, one on
// the embedded SQLite store, each with its own payments server in front,
// and a second payments server with the replay cache on in front of the
// PostgreSQL one), drives them with ghz, and measures the store's own
// reserve INSERT and Finish UPDATE with pgbench: the floor pair. Every row
// runs once a round, rounds interleaved, with the load average read beside
// each round. It then prints the medians across rounds of every row and
// issue 12's ratio table, and leaves the raw ghz JSON and pgbench output in
// the results directory.
//
//	go run ./internal/loadtest -ghz PATH [-duration 10s] [-rounds 3] [-rows REGEXP]
//
// Every flag also reads an environment variable (LOADTEST_DURATION,
// LOADTEST_ROUNDS, ...); go run ./internal/loadtest -h lists them. It
// refuses to start without pgbench, and removes its databases, temporary
// directories and child processes when it ends or is interrupted.
package main
