package gatecore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/gatecore"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// lossyDedupe loses the answer of the first Begin (after reserving) and
// records every Release.
type lossyDedupe struct {
	idemgatev1.DedupeServiceClient
	// earlier answers ReleaseLostBegins as a service of an earlier version.
	earlier  bool
	mu       sync.Mutex
	begins   []*idemgatev1.BeginRequest
	releases []*idemgatev1.ReleaseRequest
	lost     []*idemgatev1.ReleaseLostBeginsRequest
}

func (d *lossyDedupe) ReleaseLostBegins(_ context.Context, req *idemgatev1.ReleaseLostBeginsRequest, _ ...grpc.CallOption) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lost = append(d.lost, req)
	if d.earlier {
		return nil, status.Error(codes.Unimplemented, "unknown method ReleaseLostBegins")
	}
	return &idemgatev1.ReleaseLostBeginsResponse{Released: 1}, nil
}

func (d *lossyDedupe) Begin(_ context.Context, req *idemgatev1.BeginRequest, _ ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.begins = append(d.begins, req)
	if len(d.begins) == 1 {
		return nil, status.Error(codes.Unavailable, "the connection broke after the reservation")
	}
	return &idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_Reserved_{Reserved: &idemgatev1.BeginResponse_Reserved{Epoch: 1}}}, nil
}

func (d *lossyDedupe) Heartbeat(context.Context, *idemgatev1.HeartbeatRequest, ...grpc.CallOption) (*idemgatev1.HeartbeatResponse, error) {
	return &idemgatev1.HeartbeatResponse{}, nil
}

func (d *lossyDedupe) Release(_ context.Context, req *idemgatev1.ReleaseRequest, _ ...grpc.CallOption) (*idemgatev1.ReleaseResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.releases = append(d.releases, req)
	return &idemgatev1.ReleaseResponse{}, nil
}

// A Begin whose answer was lost fails closed, and the reservation it may
// have made is released by its attempt (ReleaseLostBegins), so the key is
// free for the retry; a service of an earlier version, which answers that
// UNIMPLEMENTED, gets the same Begin re-sent and what it reserved released.
func TestALostBeginIsFollowedUpAndReleased(t *testing.T) {
	for _, earlier := range []bool{false, true} {
		t.Run(fmt.Sprintf("earlier service %v", earlier), func(t *testing.T) {
			d := &lossyDedupe{earlier: earlier}
			e := gatecore.New(d, gatecore.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			c := gatecore.NewCall("tool", "scope", "key-1", []byte("fp"), gatecore.Policy{Lease: 10 * time.Second, MaxWait: time.Second, ExecutionTimeout: time.Minute}, time.Hour)

			_, err := e.Begin(context.Background(), c)
			if grpcerr.Reason(err) != idemgate.ReasonStoreUnavailable || status.Code(err) != codes.Unavailable {
				t.Fatalf("Begin = %v, want UNAVAILABLE %s", err, idemgate.ReasonStoreUnavailable)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := e.Close(ctx); err != nil {
				t.Fatalf("Close: %v", err)
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if len(d.lost) != 1 || len(d.lost[0].GetLostBegins()) != 1 {
				t.Fatalf("ReleaseLostBegins calls = %v, want one naming the attempt", d.lost)
			}
			if l := d.lost[0].GetLostBegins()[0]; l.GetScope() != "scope" || l.GetKey() != "key-1" || l.GetAttemptToken() != c.Token {
				t.Fatalf("ReleaseLostBegins named %v, want the lost attempt", l)
			}
			if !earlier {
				if len(d.begins) != 1 || len(d.releases) != 0 {
					t.Fatalf("Begins = %v, Releases = %v; want no Begin re-sent and no Release", d.begins, d.releases)
				}
			} else {
				if len(d.begins) != 2 || d.begins[1].GetAttemptToken() != c.Token || d.begins[1].GetMaxWait().AsDuration() != 0 {
					t.Fatalf("Begins = %v, want the same attempt re-sent once without waiting", d.begins)
				}
				if len(d.releases) != 1 || d.releases[0].GetEpoch() != 1 || d.releases[0].GetAttemptToken() != c.Token || d.releases[0].GetOutcomeUnknown() {
					t.Fatalf("Releases = %v, want the follow-up's reservation released", d.releases)
				}
			}
			if s := e.Stats(); s.LostBegins != 1 {
				t.Fatalf("LostBegins = %d, want 1", s.LostBegins)
			}
		})
	}
}

// What Begin's answers mean: in flight and another request are refusals
// with the interceptor's reasons; outcome unknown names the key.
func TestBeginAnswers(t *testing.T) {
	for _, tc := range []struct {
		answer *idemgatev1.BeginResponse
		kind   gatecore.Kind
		reason string
	}{
		{&idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_InFlight_{InFlight: &idemgatev1.BeginResponse_InFlight{}}}, 0, idemgate.ReasonInFlight},
		{&idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_FingerprintMismatch_{FingerprintMismatch: &idemgatev1.BeginResponse_FingerprintMismatch{}}}, 0, idemgate.ReasonKeyReused},
		{&idemgatev1.BeginResponse{Result: &idemgatev1.BeginResponse_OutcomeUnknown_{OutcomeUnknown: &idemgatev1.BeginResponse_OutcomeUnknown{}}}, gatecore.Unknown, idemgate.ReasonOutcomeUnknown},
	} {
		e := gatecore.New(fixedDedupe{tc.answer}, gatecore.Options{})
		c := gatecore.NewCall("tool", "scope", "k", nil, gatecore.Policy{Lease: time.Second}, time.Hour)
		b, err := e.Begin(context.Background(), c)
		if b.Kind != tc.kind || grpcerr.Reason(err) != tc.reason {
			t.Errorf("Begin answered %v: kind %v, error %v; want kind %v, reason %s", tc.answer, b.Kind, err, tc.kind, tc.reason)
		}
	}
}

type fixedDedupe struct{ answer *idemgatev1.BeginResponse }

func (f fixedDedupe) Begin(context.Context, *idemgatev1.BeginRequest, ...grpc.CallOption) (*idemgatev1.BeginResponse, error) {
	return f.answer, nil
}

func (fixedDedupe) Heartbeat(context.Context, *idemgatev1.HeartbeatRequest, ...grpc.CallOption) (*idemgatev1.HeartbeatResponse, error) {
	panic("not called")
}

func (fixedDedupe) Finish(context.Context, *idemgatev1.FinishRequest, ...grpc.CallOption) (*idemgatev1.FinishResponse, error) {
	panic("not called")
}

func (fixedDedupe) Release(context.Context, *idemgatev1.ReleaseRequest, ...grpc.CallOption) (*idemgatev1.ReleaseResponse, error) {
	panic("not called")
}

func (fixedDedupe) Resolve(context.Context, *idemgatev1.ResolveRequest, ...grpc.CallOption) (*idemgatev1.ResolveResponse, error) {
	panic("not called")
}

func (fixedDedupe) ReleaseLostBegins(context.Context, *idemgatev1.ReleaseLostBeginsRequest, ...grpc.CallOption) (*idemgatev1.ReleaseLostBeginsResponse, error) {
	panic("not called")
}
