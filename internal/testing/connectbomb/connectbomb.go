// Package connectbomb builds compressed request bombs for tests of Connect
// handlers' request limits: a small gzip body that inflates to a protobuf
// message whose field 1 (a string) holds many bytes, and the connect-go
// client options that send it as any request's compressed message, over the
// Connect, gRPC or gRPC-Web protocol, so a test needs neither the inflated
// message in memory nor a hand-built HTTP request.
package connectbomb

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"io"
	"sync/atomic"

	"connectrpc.com/connect"
)

// Gzip returns the gzip of a protobuf message whose field 1, a string (the
// payload of testing.v1.MutateRequest, the customer_id of
// payments.v1.ChargeCardRequest), holds n bytes of 'a', followed by the
// encoded fields in tail (nil for none). 256 MiB compress to about 270 KB.
//
// The gzip is a series of members (RFC 1952 allows many; Go's gzip.Reader,
// which Connect handlers use, reads them as one stream): the field's head
// with the bytes that do not fill a member, then one member of `member`
// bytes of 'a', compressed once and repeated, then the tail. Compressing
// the whole message instead cost 20 CPU-seconds under the race detector.
func Gzip(n int, tail []byte) []byte {
	head := binary.AppendUvarint([]byte{0x0a}, uint64(n)) // field 1, length-delimited
	out := gzipMember(append(head, bytes.Repeat([]byte{'a'}, n%member)...))
	if full := n / member; full > 0 {
		out = append(out, bytes.Repeat(gzipMember(bytes.Repeat([]byte{'a'}, member)), full)...)
	}
	return append(out, gzipMember(tail)...)
}

// member is how many bytes of 'a' each repeated member of a bomb inflates to.
const member = 1 << 20

// compressedBytes counts the bytes Gzip has given the compressor, for the test
// that it compresses one member and not the whole message.
var compressedBytes atomic.Int64

// gzipMember returns p compressed as one gzip member.
func gzipMember(p []byte) []byte {
	compressedBytes.Add(int64(len(p)))
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	_, _ = zw.Write(p)
	_ = zw.Close()
	return buf.Bytes()
}

// ChargeAmount encodes payments.v1.ChargeCardRequest's amount_cents (field
// 2, a varint) of 100 cents, so a bomb with this tail is a valid charge.
var ChargeAmount = []byte{0x10, 100}

// ClientOptions make a connect-go client send bomb, whatever the request, as
// its gzip-compressed message: it registers a "gzip" compressor that writes
// bomb in place of what it is given, and asks for it.
func ClientOptions(bomb []byte) []connect.ClientOption {
	return []connect.ClientOption{
		connect.WithAcceptCompression("gzip",
			func() connect.Decompressor { return &gzip.Reader{} },
			func() connect.Compressor { return &compressor{bomb: bomb} }),
		connect.WithSendCompression("gzip"),
	}
}

// compressor writes bomb to its sink on Close, whatever was written to it.
type compressor struct {
	bomb []byte
	sink io.Writer
}

func (c *compressor) Write(p []byte) (int, error) { return len(p), nil }

func (c *compressor) Close() error {
	_, err := c.sink.Write(c.bomb)
	return err
}

func (c *compressor) Reset(w io.Writer) { c.sink = w }
