package interceptor

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/protogate"
	"github.com/idemgate/idemgate/internal/replayfields"
)

// A duplicate must see what the first caller saw, response metadata
// included, so the handler's header and trailer are recorded while it runs
// and stored with its outcome (idemgate.v1.StoredOutcome).

// metadataRecorder is the call's grpc.ServerTransportStream as the handler
// sees it: every header and trailer the handler sets is recorded for the
// stored outcome, then goes to the real stream unchanged.
//
// What is recorded is what the caller got, or would have got had it
// stayed: once the caller has cancelled or timed out, grpc-go refuses all
// metadata ("SendHeader called multiple times"), but the handler runs on
// (its context is detached from the caller's) and every duplicate must
// replay what it set. So the recorder keeps gRPC's own rule itself (no
// header after the header was sent, which it refuses as the stream would,
// recording nothing), records what the stream took, and what it refused
// once the caller was gone, and tells the handler the stream's refusal only
// while the caller is still there (then recording nothing: the caller never
// got it): a handler that checks the error must not fail an action whose
// side effect ran only because its caller left. Only what is set through
// the recorder is recorded, so what the interceptor set before
// (idempotency-key-derived) is not.
//
// grpc.SetSendCompressor and grpc.ClientSupportedCompressors need gRPC's own
// stream type, so they fail inside a gated handler, as they do under any
// interceptor that wraps the stream (gRPC's OpenTelemetry metrics do too).
type metadataRecorder struct {
	grpc.ServerTransportStream
	// caller is the caller's context: its end is the stream's, after which
	// the stream's refusals are not the handler's concern.
	caller context.Context

	mu              sync.Mutex
	header, trailer metadata.MD
	// headerSent: the handler sent the header (SendHeader), so gRPC
	// refuses any further header.
	headerSent bool
	// keep says which keys are stored (the gate's replayable); nil:
	// replayableKey.
	keep func(string) bool
}

// recordMetadata returns ctx with a recorder in place of the stream of the
// call whose context is caller, and the recorder. Without a stream in ctx
// (a call not made through a gRPC server) it returns ctx unchanged and a nil
// recorder, which records nothing.
func recordMetadata(ctx, caller context.Context, keep func(string) bool) (context.Context, *metadataRecorder) {
	stream := grpc.ServerTransportStreamFromContext(ctx)
	if stream == nil {
		return ctx, nil
	}
	r := &metadataRecorder{ServerTransportStream: stream, caller: caller, keep: keep}
	return grpc.NewContextWithServerTransportStream(ctx, r), r
}

// SetHeader implements grpc.ServerTransportStream.
func (r *metadataRecorder) SetHeader(md metadata.MD) error {
	return r.recordHeader(md, false, r.ServerTransportStream.SetHeader)
}

// SendHeader implements grpc.ServerTransportStream.
func (r *metadataRecorder) SendHeader(md metadata.MD) error {
	return r.recordHeader(md, true, r.ServerTransportStream.SendHeader)
}

// recordHeader forwards md and records it as header, unless the header was
// sent already.
func (r *metadataRecorder) recordHeader(md metadata.MD, send bool, forward func(metadata.MD) error) error {
	r.mu.Lock()
	sent := r.headerSent
	r.mu.Unlock()
	if sent {
		return forward(md) // gRPC refuses it too; the caller never saw it
	}
	return r.forward(md, &r.header, send, forward)
}

// SetTrailer implements grpc.ServerTransportStream.
func (r *metadataRecorder) SetTrailer(md metadata.MD) error {
	return r.forward(md, &r.trailer, false, r.ServerTransportStream.SetTrailer)
}

// forward passes md to the stream and records it into *into (marking the
// header sent with send) when the stream took it or refused it because the
// caller is gone: then the handler is told nil, since what it set is
// recorded and replayed. A refusal while the caller is there (something
// outside the gate sent the header) reached nobody, so it is not recorded,
// as a duplicate must replay what the caller got, and the handler is told.
func (r *metadataRecorder) forward(md metadata.MD, into *metadata.MD, send bool, forward func(metadata.MD) error) error {
	err := forward(md)
	if err != nil && !callerGone(r.caller) {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.headerSent = r.headerSent || send
	r.recordLocked(into, md)
	return nil
}

// callerGone reports, after the stream refused metadata, whether that was
// because the caller gave up: grpc-go refuses everything on a finished
// stream, with "SendHeader called multiple times" (ErrIllegalHeaderWrite).
// It marks the stream finished a moment before it cancels the caller's
// context, so a refusal waits up to callerGoneGrace for that.
func callerGone(caller context.Context) bool {
	if caller.Err() != nil {
		return true
	}
	t := time.NewTimer(callerGoneGrace)
	defer t.Stop()
	select {
	case <-caller.Done():
		return true
	case <-t.C:
		return false
	}
}

// callerGoneGrace bounds callerGone's wait: a refusal while the caller is
// there (a header set after something outside the gate sent the header)
// waits this long before it is reported. The window it covers is two
// adjacent statements in grpc-go, so it is generous for a starved
// scheduler: a refusal wrongly passed on can make a handler fail an action
// whose side effect ran, and only a misused stream pays the wait.
const callerGoneGrace = time.Second

// metadataRefused logs that the stream refused the gate's own metadata: as
// a warning while the caller is there, at debug level once it gave up,
// since nobody reads that stream any more (the outcome is stored as usual).
func (g *Gate) metadataRefused(ctx context.Context, msg string, attrs ...any) {
	level := slog.LevelWarn
	if callerGone(ctx) {
		level = slog.LevelDebug
		attrs = append(attrs, slog.String("why", "the caller gave up"))
	}
	g.opts.logger.Log(ctx, level, msg, attrs...)
}

// recordLocked appends a copy of md to *into, as the stream joins it: the
// handler may reuse md after the call. r.mu is held.
func (r *metadataRecorder) recordLocked(into *metadata.MD, md metadata.MD) {
	if *into == nil {
		*into = metadata.MD{}
	}
	for k, vs := range md {
		k = strings.ToLower(k) // as the transport sends it
		(*into)[k] = append((*into)[k], vs...)
	}
}

// wrap returns the outcome to store for result (protogate.Wrap): result
// itself when the handler set no metadata worth replaying, else a
// StoredOutcome that holds result, header and trailer. An error passes
// through.
func (r *metadataRecorder) wrap(result *anypb.Any, err error) (*anypb.Any, error) {
	if err != nil || r == nil {
		return result, err
	}
	r.mu.Lock()
	header, trailer := protogate.Metadata(r.header), protogate.Metadata(r.trailer)
	r.mu.Unlock()
	keep := r.keep
	if keep == nil {
		keep = replayableKey
	}
	return protogate.Wrap(result, nil, header, trailer, keep)
}

// replayableKey reports whether a handler's metadata key is replayed. The
// transport owns pseudo-headers, the "grpc-" namespace (grpc-status,
// grpc-message, grpc-status-details-bin, which a replayed error carries by
// itself), content-type, te and user-agent; gRPC drops or overwrites what a
// handler sets there. The interceptor sets its own headers on every replay.
func replayableKey(k string) bool {
	return protogate.ReplayableKey(k, idemgate.ReplayedHeader, idemgate.KeyDerivedHeader, idemgate.ExpiresAtHeader, idemgate.OriginalTimeHeader) && (replayfields.Rule{}).Stored(k)
}

// replayable is replayableKey less the keys of WithPerCallerMetadata: the
// per-caller fields (internal/replayfields) are never stored nor replayed.
func (g *Gate) replayable(k string) bool {
	return replayableKey(k) && g.opts.perCaller.Stored(k)
}

// kept is md with only the keys keep holds: a record stored before a key
// became per-caller replays without it.
func kept(md metadata.MD, keep func(string) bool) metadata.MD {
	var out metadata.MD
	for k, vs := range md {
		if keep(k) {
			if out == nil {
				out = metadata.MD{}
			}
			out[k] = vs
		}
	}
	return out
}

// replayedMetadata is the header and trailer a stored outcome replays.
type replayedMetadata struct {
	header, trailer metadata.MD
}

// replayMetadata sets the stored header and trailer on a duplicate's
// response. It cannot fail the replay: the outcome is what matters, and a
// stream that refuses metadata is logged.
func (g *Gate) replayMetadata(ctx context.Context, md replayedMetadata) {
	if err := grpc.SetHeader(ctx, kept(md.header, g.replayable)); err != nil {
		g.metadataRefused(ctx, "idemgate: could not replay the stored header", slog.Any("error", err))
	}
	if err := grpc.SetTrailer(ctx, kept(md.trailer, g.replayable)); err != nil {
		g.metadataRefused(ctx, "idemgate: could not replay the stored trailer", slog.Any("error", err))
	}
}

// resultTypeURL names the type of the result an outcome holds.
var resultTypeURL = protogate.ResultTypeURL
