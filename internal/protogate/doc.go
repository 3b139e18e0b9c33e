// Package protogate is what every gate of protobuf methods shares, whatever
// carries the call (gRPC in interceptor, Connect in connectgate): each
// method's policy resolved once from its descriptor (Resolve), the key from
// its carrier and the request's key field (Method.Key), the request's
// fingerprint, what a handler error means (Method.Classify), what an
// idemgate.Reconciler's answer means (Method.Reconciled), and the stored
// outcome with the response metadata it replays (Wrap, Decode). It builds
// on package idemgate's names (Policy, Reconciler, the reasons); idemgate
// imports none of it.
//
// Both gates name a record alike (the policy's action or the full method
// "/pkg.Service/Method", which is also the Connect procedure, then the
// tenant), so one key used over gRPC and over Connect names one action.
package protogate
