package gatecore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"github.com/idemgate/idemgate/internal/vocab"
)

// withCall returns ctx carrying c's identity under the reservation of
// epoch, which idemgate.KeyFromContext and its siblings read, whatever gate
// ran the handler.
func withCall(ctx context.Context, c *Call, epoch int64) context.Context {
	return vocab.WithCall(ctx, &vocab.Call{Key: c.Key, DownstreamKey: downstreamKey(c.Scope, c.Key), Scope: c.Scope, Epoch: epoch})
}

// downstreamKey is "idg_" and 32 hex digits of a SHA-256 of the scope and
// the caller's key.
func downstreamKey(scope, key string) string {
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return "idg_" + hex.EncodeToString(h.Sum(nil)[:16])
}
