package sqlitestore_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// BenchmarkOutcomeCipher measures what -outcome-keys-file costs a key's
// life through the Dedupe service on the embedded store: a reserving Begin,
// the Finish that stores the outcome, and one duplicate Begin that replays
// it, without and with the cipher. Compare cipher=off and cipher=on of one
// run (benchstat -col /cipher), never absolute times: the store's fsyncs
// dominate them.
func BenchmarkOutcomeCipher(b *testing.B) {
	keys := []dedupesvc.OutcomeKey{{ID: "k1", Key: bytes.Repeat([]byte{1}, dedupesvc.OutcomeKeyBytes)}}
	for _, size := range []int{1 << 10, 64 << 10} {
		for _, on := range []bool{false, true} {
			name := fmt.Sprintf("size=%dKiB/cipher=off", size>>10)
			var opts []dedupesvc.Option
			if on {
				name = fmt.Sprintf("size=%dKiB/cipher=on", size>>10)
				c, err := dedupesvc.NewOutcomeCipher(keys)
				if err != nil {
					b.Fatal(err)
				}
				opts = append(opts, dedupesvc.WithOutcomeCipher(c))
			}
			b.Run(name, func(b *testing.B) {
				ctx := context.Background()
				s, err := sqlitestore.Open(ctx, b.TempDir())
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				srv := dedupesvc.NewServer(s, append(opts, dedupesvc.WithCallerRate(0, 0))...)
				outcome := &anypb.Any{TypeUrl: "type.googleapis.com/test.A", Value: bytes.Repeat([]byte("x"), size)}
				fp := make([]byte, dedupesvc.FingerprintBytes)
				i := 0
				b.SetBytes(int64(size))
				for b.Loop() {
					i++
					req := &idemgatev1.BeginRequest{Scope: "/pkg.S/M", Key: fmt.Sprint("k-", i), Fingerprint: fp, AttemptToken: "t",
						Lease: durationpb.New(1e10), Retention: durationpb.New(36e11)}
					begun, err := srv.Begin(ctx, req)
					if err != nil || begun.GetReserved() == nil {
						b.Fatalf("Begin = %v, %v", begun, err)
					}
					if _, err := srv.Finish(ctx, &idemgatev1.FinishRequest{Scope: "/pkg.S/M", Key: req.Key, AttemptToken: "t",
						Epoch: begun.GetReserved().GetEpoch(), Outcome: outcome}); err != nil {
						b.Fatal(err)
					}
					req.AttemptToken = "t2"
					if got, err := srv.Begin(ctx, req); err != nil || len(got.GetCompleted().GetOutcome().GetValue()) != size {
						b.Fatalf("replay = %v, %v", got, err)
					}
				}
			})
		}
	}
}
