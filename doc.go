// Package idemgate holds the protocol's vocabulary that every gate shares,
// whatever its transport: the idempotency metadata names, the ErrorInfo
// reasons of its refusals, what a gated handler reads from its context (the
// key, the downstream key, the fencing token), the resolved Policy of a
// method, the marks a handler puts on its error (FinalError and its
// siblings), reconcilers, the health name WatchDedupe reports, and the
// buckets of the gates' latency histograms.
//
// The gates themselves live in their transport's package: interceptor
// (gRPC), connectgate (Connect, gRPC-Web), httpgate (HTTP) and mcpgate
// (MCP). Each of them uses these names, so a handler or a caller written
// against this package works behind any of them, and importing one gate
// does not pull in another.
//
// It is a leaf the gates build on: their shared engine (internal/gatecore)
// imports this package, never the reverse, so a handler that imports only
// this package links no gate and no engine.
package idemgate
