// Package outagetest holds fault tests that take the store away from a
// running holder for longer than its lease: the real dedupesvc binary is
// killed, or its PostgreSQL cluster crashed, between the handler's return
// and its Finish. It has no code of its own, only tests, built with the tag
// faults: `make faults` runs them (CI does), `make test` does not.
package outagetest
