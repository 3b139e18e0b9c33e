package dedupesvc_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
)

// BenchmarkOutcomeCipherSealOpen measures the cipher alone, in memory: one
// Seal (Finish) and one Open (a replay) of an outcome.
func BenchmarkOutcomeCipherSealOpen(b *testing.B) {
	c, err := dedupesvc.NewOutcomeCipher([]dedupesvc.OutcomeKey{key("k1", 1)})
	if err != nil {
		b.Fatal(err)
	}
	aad := dedupesvc.OutcomeAAD(dedupesvc.RecordID{Namespace: "svc", Scope: "/pkg.S/M|tenant", Key: "key-1"}, "type.googleapis.com/test.A")
	for _, size := range []int{1 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("size=%dKiB", size>>10), func(b *testing.B) {
			value := bytes.Repeat([]byte("x"), size)
			b.SetBytes(int64(size))
			for b.Loop() {
				id, sealed, err := c.Seal(aad, value)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := c.Open(id, aad, sealed); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
