package connectgate

import (
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemgate/idemgate/internal/grpcerr"
)

// DefaultMaxRequestBytes is the largest request message a handler mounted
// with Gate.HandlerOptions reads, compressed or decompressed: 4 MiB,
// grpc-go's default receive limit, so the Connect listener refuses what the
// gRPC listener beside it refuses.
const DefaultMaxRequestBytes = 4 << 20

// DefaultMaxResponseBytes is the largest response message a handler mounted
// with Gate.HandlerOptions sends: 4 MiB. It is above
// the default outcome limit (1 MiB, WithMaxOutcomeBytes), so every stored
// outcome can be replayed.
const DefaultMaxResponseBytes = 4 << 20

// ReasonRequestTooLarge: the request message, as sent or once decompressed,
// is over the gate's WithMaxRequestBytes. CodeResourceExhausted (what
// grpc-go answers for an over-size message); it was refused before it was
// decoded, so the key was not reserved and the handler did not run. The
// ErrorInfo metadata "limit_bytes" gives the limit. httpgate's refusal of an
// over-size body has the same reason.
const ReasonRequestTooLarge = "IDEMPOTENCY_REQUEST_TOO_LARGE"

// envelopePrefix is the length of the gRPC, gRPC-Web and Connect streaming
// envelope's prefix: a flags byte and a 4-byte big-endian message length.
const envelopePrefix = 5

// HandlerOptions returns the connect.HandlerOptions to build a generated
// handler with: the gate's deterministic codecs, then extra, then the gate's
// interceptor (so interceptors in extra, such as authentication, run before
// it), then the gate's limits.
//
// The codecs encode a response the same way every time, so a first answer
// and its replays carry the same bytes: binary protobuf (also what the gRPC
// and gRPC-Web protocols send) with map fields in key order, where
// connect-go's own codec writes a map in Go's random order, and protojson
// compacted, as its spacing varies between builds. A connect.WithCodec in
// extra replaces the gate's of its name: make yours deterministic too.
//
// The limits are applied by connect-go while it reads the request, before
// any interceptor sees it: connect.WithReadMaxBytes and a gzip decompressor
// that stops at WithMaxRequestBytes with the gate's refusal (connect-go's
// own refuses without a reason, after inflating the rest of a bomb to count
// it), and connect.WithSendMaxBytes of WithMaxResponseBytes. A
// WithReadMaxBytes, WithSendMaxBytes or gzip WithCompression in extra is
// refused: HandlerOptions panics, naming the Gate's option to set instead
// (connect-go would apply whichever came last, so one of the two limits
// would silently not hold). The gate's interceptor is offered only here,
// not alone, because connect-go's interceptors only see decoded messages:
// mount with HandlerOptions and HTTPMiddleware.
func (g *Gate) HandlerOptions(extra ...connect.HandlerOption) []connect.HandlerOption {
	for _, o := range extra {
		if err := conflicting(reflect.ValueOf(o)); err != nil {
			panic(err)
		}
	}
	limit := g.opts.maxRequest
	return append(append(codecOptions(), extra...),
		connect.WithInterceptors(gateInterceptor{g: g}),
		connect.WithReadMaxBytes(limit),
		connect.WithSendMaxBytes(g.opts.maxResponse),
		// Drop connect-go's gzip, then add the bounded one under its name,
		// so Accept-Encoding still lists gzip once.
		connect.WithCompression("gzip", nil, nil),
		connect.WithCompression("gzip",
			func() connect.Decompressor { return &boundedGzip{limit: int64(limit)} },
			func() connect.Compressor { return gzip.NewWriter(nil) }),
	)
}

// HTTPMiddleware bounds the bytes read from the body of each request to a
// unary or server-streaming procedure to WithMaxRequestBytes (plus the
// 5-byte envelope prefix of the gRPC, gRPC-Web and Connect streaming
// protocols), before connect-go reads it: a request whose Content-Length,
// or whose envelope prefix, says more is refused before its message is
// read, and one that sends more is refused as it crosses the limit, with
// CodeResourceExhausted and ReasonRequestTooLarge in the request's protocol
// (connect.ErrorWriter). Without it connect-go reads an over-size body to
// its end to discard it. Client- and bidi-streaming procedures (known to
// the gate's descriptor registry, WithFiles) pass unbounded: their limit is
// per message, from HandlerOptions; they are told by the request's URL
// path, so mount the handler at the path its constructor returns. Wrap the
// handler built with HandlerOptions:
//
//	path, h := paymentsv1connect.NewPaymentsServiceHandler(svc, gate.HandlerOptions()...)
//	mux.Handle(path, gate.HTTPMiddleware(h))
func (g *Gate) HTTPMiddleware(next http.Handler) http.Handler {
	writer := connect.NewErrorWriter()
	limit := int64(g.opts.maxRequest)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || g.clientStreaming(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		enveloped := isEnveloped(r.Header.Get("Content-Type"))
		bodyLimit := limit
		if enveloped {
			bodyLimit += envelopePrefix
		}
		if r.ContentLength > bodyLimit {
			_ = writer.Write(w, r, requestTooLarge(limit, fmt.Sprintf("the request body's Content-Length %d is over", r.ContentLength)))
			return
		}
		r.Body = &boundedBody{body: r.Body, limit: bodyLimit, message: limit, enveloped: enveloped}
		next.ServeHTTP(w, r)
	})
}

// clientStreaming reports whether path names a client- or bidi-streaming
// procedure in the gate's registry ("/pkg.Service/Method").
func (g *Gate) clientStreaming(path string) bool {
	g.streamsOnce.Do(func() { g.streams = clientStreamingProcedures(g.opts.files) })
	return g.streams[path]
}

func clientStreamingProcedures(files *protoregistry.Files) map[string]bool {
	out := map[string]bool{}
	files.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				if md := sd.Methods().Get(j); md.IsStreamingClient() {
					out["/"+string(sd.FullName())+"/"+string(md.Name())] = true
				}
			}
		}
		return true
	})
	return out
}

// isEnveloped reports whether a request of this Content-Type carries its
// message in an envelope: gRPC, gRPC-Web and Connect streaming.
func isEnveloped(contentType string) bool {
	ct := strings.ToLower(contentType)
	return strings.HasPrefix(ct, "application/grpc") || strings.HasPrefix(ct, "application/connect+")
}

// requestTooLarge is the refusal of a request over limit bytes; what says
// why it is.
func requestTooLarge(limit int64, what string) *connect.Error {
	return connectError(grpcerr.New(codes.ResourceExhausted, ReasonRequestTooLarge,
		fmt.Sprintf("idemgate: %s this server's limit of %d bytes for a request message, so it was not read and nothing ran; send a smaller request", what, limit),
		map[string]string{"limit_bytes": strconv.FormatInt(limit, 10)}, 0))
}

// boundedBody is a request body that fails with ReasonRequestTooLarge
// once more than limit bytes were read or, enveloped, once the first
// envelope prefix announces a message over message bytes: it reads the
// prefix ahead, so connect-go, which checks the announced length itself,
// gets the gate's refusal first.
type boundedBody struct {
	body      io.ReadCloser
	limit     int64
	message   int64
	enveloped bool
	read      int64
	// prefix holds the first envelope prefix once read ahead; prefixAt is
	// how much of it was handed on.
	prefix    []byte
	prefixAt  int
	prefixErr error
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.enveloped && b.prefix == nil && b.prefixErr == nil {
		prefix := make([]byte, envelopePrefix)
		n, err := io.ReadFull(b.body, prefix)
		b.read += int64(n)
		b.prefix = prefix[:n]
		if err == nil {
			if size := int64(binary.BigEndian.Uint32(prefix[1:])); size > b.message {
				b.prefix, b.prefixErr = nil, requestTooLarge(b.message, fmt.Sprintf("the request's envelope announces a message of %d bytes, over", size))
				return 0, b.prefixErr
			}
		} else if err != io.ErrUnexpectedEOF && err != io.EOF {
			b.prefixErr = err
		} else {
			b.prefixErr = io.EOF
		}
	}
	if b.prefixAt < len(b.prefix) {
		n := copy(p, b.prefix[b.prefixAt:])
		b.prefixAt += n
		return n, nil
	}
	if b.prefixErr != nil {
		return 0, b.prefixErr
	}
	if b.read > b.limit {
		return 0, requestTooLarge(b.message, "the request body is over")
	}
	if room := b.limit - b.read + 1; int64(len(p)) > room {
		p = p[:room] // one byte past the limit tells an over-size body
	}
	n, err := b.body.Read(p)
	b.read += int64(n)
	if b.read > b.limit {
		return n - int(b.read-b.limit), requestTooLarge(b.message, "the request body is over")
	}
	return n, err
}

func (b *boundedBody) Close() error { return b.body.Close() }

// boundedGzip is a gzip connect.Decompressor that fails with
// ReasonRequestTooLarge once it would yield more than limit bytes, so a
// small compressed body cannot inflate past the limit, and is not inflated
// further to learn by how much.
type boundedGzip struct {
	r     gzip.Reader
	limit int64
	n     int64
}

func (d *boundedGzip) Read(p []byte) (int, error) {
	if d.n > d.limit {
		return 0, requestTooLarge(d.limit, "the request message decompresses to more than")
	}
	if room := d.limit - d.n + 1; int64(len(p)) > room {
		p = p[:room]
	}
	n, err := d.r.Read(p)
	d.n += int64(n)
	if d.n > d.limit {
		return n - int(d.n-d.limit), requestTooLarge(d.limit, "the request message decompresses to more than")
	}
	return n, err
}

// Reset implements connect.Decompressor.
func (d *boundedGzip) Reset(r io.Reader) error {
	d.n = 0
	return d.r.Reset(r)
}

// Close implements connect.Decompressor.
func (d *boundedGzip) Close() error { return d.r.Close() }

// limitsState is the part of a Gate that mounting needs: the procedures
// HTTPMiddleware leaves unbounded, resolved on first use.
type limitsState struct {
	streamsOnce sync.Once
	streams     map[string]bool
}

// conflicting reports an option that would override one of the gate's limits:
// connect-go's read or send limit, or its gzip compression (the gate's
// bounded decompressor is registered under that name), looking inside
// connect.WithHandlerOptions and connect.WithOptions groups. connect-go's
// options are opaque types; their concrete names are stable API in practice
// (the constructors return them), and an option of an unknown type passes.
func conflicting(v reflect.Value) error {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct || v.Type().PkgPath() != "connectrpc.com/connect" {
		return nil
	}
	switch v.Type().Name() {
	case "readMaxBytesOption":
		return errors.New("connectgate: HandlerOptions: connect.WithReadMaxBytes would override the gate's request limit; set connectgate.WithMaxRequestBytes on the Gate instead")
	case "sendMaxBytesOption":
		return errors.New("connectgate: HandlerOptions: connect.WithSendMaxBytes would override the gate's response limit; set connectgate.WithMaxResponseBytes on the Gate instead")
	case "compressionOption":
		if f := v.FieldByName("Name"); f.IsValid() && f.Kind() == reflect.String && f.String() == "gzip" {
			return errors.New(`connectgate: HandlerOptions: connect.WithCompression("gzip", ...) would replace the gate's gzip decompressor, which stops at connectgate.WithMaxRequestBytes; leave gzip to the gate and set that limit on the Gate instead`)
		}
	case "handlerOptionsOption", "optionsOption":
		if f := v.FieldByName("options"); f.IsValid() && f.Kind() == reflect.Slice {
			for i := range f.Len() {
				if err := conflicting(f.Index(i)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
