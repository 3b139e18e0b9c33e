// Package gatecore is the transport-free core of an idemgate gate: it
// reserves a call's idempotency key with the Dedupe service (Begin), keeps
// the reservation's lease while the handler runs, settles it (Finish or
// Release, retried in the background within a budget), follows up a Begin
// whose answer was lost, and counts what the caller does not see.
//
// It knows nothing of gRPC servers or MCP: a front end (the gRPC
// interceptor, mcpgate) reads the key, names the scope, fingerprints the
// request, decides what a handler's answer means, and encodes the stored
// outcome; gatecore does the rest through the Dedupe client interface only.
// Its errors are gRPC status errors with one ErrorInfo whose reason is one
// of the Reason constants, so every front end refuses with the same reasons.
package gatecore
