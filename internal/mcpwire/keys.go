package mcpwire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemgate/idemgate/internal/httplimits"
	"io"
	"net/http"
	"sync"

	"google.golang.org/grpc/codes"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

const (
	// MetaKey is the _meta member of a tools/call request that carries the
	// idempotency key: the carrier every MCP client can set.
	MetaKey = "io.idemgate/idempotency-key"
	// MetaReplayed is the _meta member of a CallToolResult that says whether
	// the result is the stored outcome of an earlier call with the key (true)
	// or of this call (false). Set on every result of a successful call.
	MetaReplayed = "io.idemgate/replayed"
	// MetaKeyDerived is the _meta member set to true when the tool server
	// deduplicated a keyless call on its fingerprint (keyless FINGERPRINT).
	MetaKeyDerived = "io.idemgate/key-derived"
	// MetaError is the _meta member of an error result: an object with the
	// gRPC code name ("FAILED_PRECONDITION"), the ErrorInfo reason, domain and
	// metadata, the message, and the RetryInfo delay as retryAfterSeconds
	// when the tool server sent one.
	MetaError = "io.idemgate/error"
	// ParamKey is SEP-3182's tools/call parameter carrying the key (a
	// proposal, not part of the MCP specification).
	ParamKey = "idempotencyKey"
	// CapabilityName names the idempotency capability, with the settings
	// {"metaKey": MetaKey, "param": ParamKey} (CapabilitySettings): a member
	// of capabilities.experimental, which clients before 2026-07-28 read, and
	// the extension identifier in capabilities.extensions (2026-07-28), on
	// the initialize and the server/discover results (AdvertiseIdempotency).
	CapabilityName = "io.idemgate/idempotency"

	// ParamMetaKey is where KeyReader and HTTPMiddleware move SEP-3182's
	// parameter, since the SDK drops unknown members of the params. A value a
	// client sends under this name itself is overwritten or removed.
	ParamMetaKey = "io.idemgate/sep3182-idempotency-key"

	// maxLiftBytes bounds the messages the key carriers parse; a longer one
	// passes through unchanged (the SDK refuses it). The SDK's default.
	maxLiftBytes = 16 << 20
)

// ReasonArgumentsInvalid is the ErrorInfo reason of a tool call whose
// arguments are not what the tool takes. INVALID_ARGUMENT; nothing ran. Fix
// the arguments.
const ReasonArgumentsInvalid = "MCP_ARGUMENTS_INVALID"

// ReasonArgumentsTooLarge is the ErrorInfo reason of a gated tool call
// whose arguments are over the gate's size limit. INVALID_ARGUMENT; nothing
// ran. Send smaller arguments.
const ReasonArgumentsTooLarge = "MCP_ARGUMENTS_TOO_LARGE"

// ReasonUnauthenticated is the ErrorInfo reason of a gated tool call over
// HTTP without an authenticated identity to name its tenant by.
// UNAUTHENTICATED; nothing ran. Call with credentials.
const ReasonUnauthenticated = "MCP_CALLER_UNAUTHENTICATED"

// CallKey returns the key of a tools/call from its _meta: MetaKey first,
// then SEP-3182's parameter as moved there by the carriers. Both present and
// different is IDEMPOTENCY_KEY_CONFLICT, a key that is not a string or not
// printable ASCII IDEMPOTENCY_KEY_INVALID; the tool server checks the rest
// (length, spaces) with the same reasons. "" with ok false: no key.
func CallKey(meta map[string]any) (key string, ok bool, err error) {
	k1, ok1, err := metaString(meta, MetaKey)
	if err != nil {
		return "", false, err
	}
	k2, ok2, err := metaString(meta, ParamMetaKey)
	if err != nil {
		return "", false, err
	}
	switch {
	case ok1 && ok2 && k1 != k2:
		return "", false, grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyConflict,
			"_meta[\""+MetaKey+"\"] and the idempotencyKey parameter carry different keys; send one, or the same in both", nil, 0)
	case ok1:
		key, ok = k1, true
	case ok2:
		key, ok = k2, true
	default:
		return "", false, nil
	}
	if err := CheckKeyChars(key); err != nil {
		return "", false, err
	}
	return key, true, nil
}

// CheckKeyChars refuses, IDEMPOTENCY_KEY_INVALID, a key with a byte that
// is not printable ASCII, before it reaches a gRPC header; the tool server
// checks the rest (length, spaces) with the same reason.
func CheckKeyChars(key string) error {
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyInvalid,
				"the idempotency key must be 1 to 255 bytes of printable ASCII", nil, 0)
		}
	}
	return nil
}

func metaString(meta map[string]any, name string) (string, bool, error) {
	v, ok := meta[name]
	if !ok || v == nil {
		return "", false, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", false, grpcerr.New(codes.InvalidArgument, idemgate.ReasonKeyInvalid,
			"the idempotency key must be a JSON string", nil, 0)
	}
	return s, true, nil
}

// LiftMessage moves SEP-3182's idempotencyKey parameter of a tools/call
// request (or of each in a batch) into params._meta under ParamMetaKey. Any
// other message, and anything that does not parse, comes back unchanged.
func LiftMessage(msg []byte) []byte {
	trimmed := bytes.TrimSpace(msg)
	if len(trimmed) == 0 || len(trimmed) > maxLiftBytes || !bytes.Contains(trimmed, []byte(`tools/call`)) {
		return msg
	}
	if trimmed[0] == '[' {
		var batch []json.RawMessage
		if json.Unmarshal(trimmed, &batch) != nil {
			return msg
		}
		changed := false
		for i, m := range batch {
			if out, ok := liftRequest(m); ok {
				batch[i], changed = out, true
			}
		}
		if !changed {
			return msg
		}
		out, err := json.Marshal(batch)
		if err != nil {
			return msg
		}
		return out
	}
	if out, ok := liftRequest(trimmed); ok {
		return out
	}
	return msg
}

func liftRequest(msg []byte) ([]byte, bool) {
	var req map[string]json.RawMessage
	if json.Unmarshal(msg, &req) != nil {
		return nil, false
	}
	var method string
	if json.Unmarshal(req["method"], &method) != nil || method != "tools/call" {
		return nil, false
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(req["params"], &params) != nil || params == nil {
		return nil, false
	}
	var meta map[string]json.RawMessage
	if raw, ok := params["_meta"]; ok && json.Unmarshal(raw, &meta) != nil {
		return nil, false // not an object: the SDK refuses the request
	}
	key, hasKey := params[ParamKey]
	if _, forged := meta[ParamMetaKey]; !hasKey && !forged {
		return nil, false
	}
	delete(params, ParamKey)
	if meta == nil {
		meta = map[string]json.RawMessage{}
	}
	delete(meta, ParamMetaKey)
	if hasKey {
		meta[ParamMetaKey] = key
	}
	var err error
	if params["_meta"], err = json.Marshal(meta); err != nil {
		return nil, false
	}
	if req["params"], err = json.Marshal(params); err != nil {
		return nil, false
	}
	out, err := json.Marshal(req)
	return out, err == nil
}

// KeyReader wraps the input of a newline-delimited JSON-RPC stream (an MCP
// server's stdin) so that SEP-3182's idempotencyKey parameter of every
// tools/call reaches the server: use it as the Reader of an mcp.IOTransport.
// Every other message passes through unchanged. Closing it closes r when r
// is an io.Closer (the SDK closes its transport's Reader when the session
// ends), and does nothing else.
func KeyReader(r io.Reader) io.ReadCloser {
	return &keyReader{src: bufio.NewReaderSize(r, 64<<10), under: r}
}

type keyReader struct {
	// under is the wrapped reader, closed by Close when it is a Closer.
	under io.Reader
	src   *bufio.Reader
	buf   []byte // the rewritten line not yet read
	err   error
}

// Close closes the wrapped reader when it is an io.Closer.
func (k *keyReader) Close() error {
	if c, ok := k.under.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

func (k *keyReader) Read(p []byte) (int, error) {
	for len(k.buf) == 0 {
		if k.err != nil {
			return 0, k.err
		}
		line, err := k.readLine()
		k.err = err
		if len(line) > 0 {
			nl := len(line) > 0 && line[len(line)-1] == '\n'
			k.buf = LiftMessage(line)
			if nl && (len(k.buf) == 0 || k.buf[len(k.buf)-1] != '\n') {
				k.buf = append(k.buf, '\n')
			}
		}
	}
	n := copy(p, k.buf)
	k.buf = k.buf[n:]
	return n, nil
}

// readLine reads one line with its newline; a line longer than
// maxLiftBytes is returned in pieces, which liftMessage leaves alone.
func (k *keyReader) readLine() ([]byte, error) {
	var line []byte
	for {
		chunk, err := k.src.ReadSlice('\n')
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			if len(line) > maxLiftBytes {
				return line, nil
			}
			continue
		}
		return line, err
	}
}

// HTTPMiddleware wraps a streamable HTTP MCP handler so that SEP-3182's
// idempotencyKey parameter of a tools/call POSTed to it reaches the server.
// It reads the body, at most l.MaxBodyBytes, and hands the handler the
// rewritten one; a longer body gets 413, before any of it is read when its
// Content-Length says so. The bodies it holds at once, taken as their bytes
// arrive, are at most l.MaxBufferedBytes across requests and
// l.MaxBufferedBytesPerIP for one client address: a body that would pass
// either gets 503 with Retry-After. The answers to a request are held
// within l.MaxAnswerBytes and l.MaxAnswerBytesPerIP until its response is
// written or its writing fails (HoldAnswers). l's zero fields take their
// defaults.
func HTTPMiddleware(next http.Handler, l HTTPLimits) http.Handler {
	l = l.WithDefaults()
	budget := &byteBudget{left: l.MaxBufferedBytes, perIP: l.MaxBufferedBytesPerIP, held: map[string]int64{}}
	answers := newAnswers(l)
	tooLarge := func(w http.ResponseWriter) {
		http.Error(w, fmt.Sprintf("request body exceeds %d bytes", l.MaxBodyBytes), http.StatusRequestEntityTooLarge)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		if r.ContentLength > l.MaxBodyBytes {
			w.Header().Set("Connection", "close") // the body is not read
			tooLarge(w)
			return
		}
		client := httplimits.RemoteIPGroup(r.RemoteAddr)
		body, held, err := budget.read(client, http.MaxBytesReader(w, r.Body, l.MaxBodyBytes), r.ContentLength)
		defer budget.give(client, held)
		if err != nil {
			var mbe *http.MaxBytesError
			switch {
			case errors.As(err, &mbe):
				tooLarge(w)
			case errors.Is(err, errBudget):
				w.Header().Set("Connection", "close")
				w.Header().Set("Retry-After", "1")
				http.Error(w, "the server holds as many request bodies as it takes at once; retry", http.StatusServiceUnavailable)
			default:
				http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
			}
			return
		}
		body = LiftMessage(body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r, answered := answers.account(r, client)
		defer answered()
		next.ServeHTTP(w, r)
	})
}

// errBudget: reading a body would hold more than the budget's bytes.
var errBudget = errors.New("request bodies over the memory budget")

// byteBudget is the bytes of request bodies that may be held at once, in
// all and by one client address.
type byteBudget struct {
	mu    sync.Mutex
	left  int64
	perIP int64
	held  map[string]int64 // by client address; no entry once it holds none
}

func (b *byteBudget) take(client string, n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.left || b.held[client]+n > b.perIP {
		return false
	}
	b.left -= n
	b.held[client] += n
	return true
}

func (b *byteBudget) give(client string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.left += n
	if b.held[client] -= n; b.held[client] <= 0 {
		delete(b.held, client)
	}
}

// bodyPiece is the size of the pieces a body is read in; piecePool keeps
// them between bodies, so a stream of refused bodies leaves no garbage for
// the heap to grow by.
const bodyPiece = 64 << 10

var piecePool = sync.Pool{New: func() any { p := make([]byte, bodyPiece); return &p }}

// read reads r whole for client, taking from the budget what it holds as
// the bytes arrive, whatever the request's Content-Length declares: a
// client declaring megabytes and sending a byte holds one piece. It
// returns the bytes taken, to give back when the body is done with.
func (b *byteBudget) read(client string, r io.Reader, length int64) ([]byte, int64, error) {
	if length > 0 {
		return b.readLength(client, r, length)
	}
	return b.readPieces(client, r)
}

// readLength reads a body of length bytes into a buffer that doubles as
// its bytes arrive, from one piece up to length: what is taken is the
// buffer's capacity (at most twice what arrived, or one piece), and for
// the moment it grows the old buffer's too; never more than one and a half
// times length.
func (b *byteBudget) readLength(client string, r io.Reader, length int64) ([]byte, int64, error) {
	var buf []byte
	for int64(len(buf)) < length {
		if len(buf) == cap(buf) {
			grown := min(length, max(bodyPiece, 2*int64(cap(buf))))
			if !b.take(client, grown) {
				return nil, int64(cap(buf)), errBudget
			}
			next := make([]byte, len(buf), grown)
			copy(next, buf)
			b.give(client, int64(cap(buf)))
			buf = next
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break // net/http reads no further than the Content-Length
		}
		if err != nil {
			return nil, int64(cap(buf)), err
		}
	}
	return buf, int64(cap(buf)), nil
}

// readPieces reads a body of unknown length (chunked) in pieces, taking
// each as it comes, then the joined body, so what is held never passes
// what was taken: twice the body while it is joined.
func (b *byteBudget) readPieces(client string, r io.Reader) ([]byte, int64, error) {
	var (
		pieces []*[]byte
		held   int64
		total  int
	)
	defer func() {
		for _, p := range pieces {
			piecePool.Put(p)
		}
	}()
	for {
		if !b.take(client, bodyPiece) {
			return nil, held, errBudget
		}
		held += bodyPiece
		p := piecePool.Get().(*[]byte)
		pieces = append(pieces, p)
		n, err := fill(r, *p)
		total += n
		if n == 0 && err == io.EOF {
			// The body ended with the last piece: this one holds nothing.
			b.give(client, bodyPiece)
			held -= bodyPiece
			break
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			// A chunked body cut before its last chunk (io.ErrUnexpectedEOF
			// from net/http) is an error, not the end of the body.
			return nil, held, err
		}
	}
	if !b.take(client, int64(total)) {
		return nil, held, errBudget
	}
	body := make([]byte, 0, total)
	for _, p := range pieces {
		body = append(body, (*p)[:min(len(*p), total-len(body))]...)
	}
	// The pieces go back to the pool; the joined body stays held.
	b.give(client, held)
	return body, int64(total), nil
}

// fill reads into p until it is full or r fails, and returns r's error as
// r gave it: io.ReadFull would turn an io.EOF after part of p into
// io.ErrUnexpectedEOF, and so hide whether the body ended or was cut.
func fill(r io.Reader, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := r.Read(p[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
