// Package polyglottest runs the callers in other languages (examples/python,
// examples/typescript) against the real dedupesvc and payments-server
// binaries and checks what each decodes: a replay with the same bytes, the
// reasons of a keyless call and of a reused key, and retries with the same
// key while the Dedupe service is down. It also checks that the payments
// server's -reflection serves the google.rpc error details.
//
// The examples need /usr/bin/python3 with grpcio and protobuf (Debian's
// python3-grpcio and python3-protobuf) and node with examples/typescript's
// dependencies (npm ci there). Without them the tests skip, except under
// CI=true, where they fail: .ci/run installs them.
package polyglottest
