// Command loadtest is `make loadtest`: the end-to-end benchmark of issues 12
// and 19. It builds the real cmd/dedupesvc and cmd/payments-server, runs them
// on loopback (one Dedupe service on a throwaway PostgreSQL database, one on
// the embedded SQLite store, each with its own payments server in front;
// more payments servers in front of the PostgreSQL one, with the replay
// cache on and with ChargeCard under FINISH_POLICY_AFTER_REPLY; and one
// that runs its own Dedupe service in-process on the same database), drives
// them with ghz, and measures the store's own reserve INSERT and Finish
// UPDATE with pgbench: the floor pair, at 1, 16 and 64 clients. Every row
// runs once a round, rounds interleaved, with the load average read beside
// each round; the replay rows also read, from the PostgreSQL Dedupe
// service's metrics, how many replays it served, which gives the replay
// cache's hit ratio. It then prints the medians across rounds of every row
// and issue 19's ratio table, and leaves the raw ghz JSON and pgbench output
// in the results directory.
//
//	go run ./internal/testing/loadtest -ghz PATH [-duration 10s] [-rounds 3] [-rows REGEXP]
//
// Every flag also reads an environment variable (LOADTEST_DURATION,
// LOADTEST_ROUNDS, ...); go run ./internal/testing/loadtest -h lists them. It
// refuses to start without pgbench, and removes its databases, temporary
// directories and child processes when it ends or is interrupted.
package main
