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
// It runs on PostgreSQL servers of its own, durable as production servers
// are (fsync on), started with pgtest's pieces, so every process of a
// server serves this run: before and after each row it reads from /proc
// the CPU time of the payments server, its Dedupe service and the server
// (the postmaster, its children and the children it reaped), and prints
// the CPU seconds each spent per 1,000 calls, which a loaded machine
// cannot bend as it bends throughput, with the server's write transactions
// and WAL bytes per call. Beside the floor pair it runs the pair batched as
// the store's group commit commits it (2 connections, half the callers'
// statements in each transaction), a Dedupe service with group commit off,
// and, with -stores citus, the same gated rows on a Citus coordinator with
// two workers (each node's CPU apart). After the rounds it measures what
// the stored records take on disk, per million.
//
//	go run ./internal/testing/loadtest -ghz PATH [-duration 10s] [-rounds 3] [-rows REGEXP]
//
// Every flag also reads an environment variable (LOADTEST_DURATION,
// LOADTEST_ROUNDS, ...); go run ./internal/testing/loadtest -h lists them. It
// refuses to start without pgbench, and removes its databases, temporary
// directories and child processes when it ends or is interrupted.
package main
