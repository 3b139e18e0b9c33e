// Package vocab holds what package idemgate's exported names create or
// read but do not show: the call a gated handler's context carries
// (idemgate.KeyFromContext and its siblings read it), the mark a handler
// puts on its error (idemgate.FinalError and its siblings), and a
// Reconciler's answer (idemgate.Resolution). The engine (gatecore,
// protogate) reaches their insides and an adopter must not, and Go shares
// unexported state only within a package, so they live here, in a leaf
// that package idemgate and the engine both import. It imports no other
// package of this module (idemgate's TestVocabularyIsALeaf).
package vocab
