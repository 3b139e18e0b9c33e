package connectbomb

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"io"
	"testing"
)

// A bomb inflates, with the gzip reader every Connect handler uses, to
// exactly the message it stands for: field 1 holding n bytes of 'a', then
// the tail; and it stays about a thousandth of that.
func TestGzipInflatesToTheMessage(t *testing.T) {
	for _, n := range []int{0, 1, member - 1, member, member + 1, 3*member + 12345} {
		bomb := Gzip(n, ChargeAmount)
		zr, err := gzip.NewReader(bytes.NewReader(bomb))
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		got, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("n=%d: inflating: %v", n, err)
		}
		want := binary.AppendUvarint([]byte{0x0a}, uint64(n))
		want = append(append(want, bytes.Repeat([]byte{'a'}, n)...), ChargeAmount...)
		if !bytes.Equal(got, want) {
			t.Fatalf("n=%d: inflates to %d bytes, want the %d of the message", n, len(got), len(want))
		}
		if n >= member && len(bomb) > n/500 {
			t.Errorf("n=%d: the bomb is %d bytes, want at most a 500th of what it inflates to", n, len(bomb))
		}
	}
}

// Building a 256 MiB bomb compresses one member, not 256 MiB: the race
// detector's instrumentation made the whole compression 20 CPU-seconds of
// cmd/payments-server's test. Counted in bytes given to the compressor, not
// timed.
func TestGzipCompressesOneMember(t *testing.T) {
	before := compressedBytes.Load()
	Gzip(256<<20, nil)
	if got := compressedBytes.Load() - before; got > 2*member {
		t.Fatalf("building a 256 MiB bomb compressed %d bytes, want at most two members' (%d)", got, 2*member)
	}
}
