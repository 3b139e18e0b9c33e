// Package gatecore is the transport-free core of an idemgate gate: it
// reserves a call's idempotency key with the Dedupe service (Begin), keeps
// the reservation's lease while the handler runs, settles it (Finish or
// Release, retried in the background within a budget), follows up a Begin
// whose answer was lost, and counts what the caller does not see.
//
// Engine.Gate is a gated call's whole lifecycle, the same for every
// transport: the replay cache, Begin, a reconciler for a lost outcome, the
// handler under a renewed lease, the settlement its verdict asks for (before
// the answer, or right after it under FINISH_POLICY_AFTER_REPLY), and the
// fenced answer. A front end (the gRPC interceptor, mcpgate, connectgate,
// httpgate) reads the key, names the scope, fingerprints the request, and
// implements Transport: how a stored outcome becomes its answer, how the
// handler runs and what its answer means (a Verdict; handlers can mark
// their errors with idemgate.FinalError, RetryableError and
// OutcomeUnknownError, which Marked reads), and where its replay headers
// go. Observer gives every front end the same logging of a failing Dedupe
// service, its start-up check and its health.
// Its errors are gRPC status errors with one ErrorInfo whose reason is one
// of package idemgate's Reason constants, so every front end refuses with
// the same reasons.
//
// It builds on package idemgate, the vocabulary every gate shares (the
// reasons, ErrFenced and ErrExecutionTimeout, the marks, the health names,
// the call a handler's context carries), never the reverse: idemgate
// imports no engine, so a handler that imports only it links none
// (idemgate's TestVocabularyIsALeaf). What idemgate's names hide from an
// adopter but the engine reads (the mark on an error, the call in a
// context) is in internal/vocab, a leaf both import.
package gatecore
