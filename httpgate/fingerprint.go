package httpgate

import (
	"crypto/sha256"
	"encoding/binary"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// fingerprintVersion starts every fingerprint, so a change of what enters
// it never matches an older record by accident.
const fingerprintVersion = "idemgate/httpgate/v1"

// Fingerprint is the SHA-256 that tells a retry of a request from another
// request with the same key: of the method, the route pattern, the request
// target (escaped path and raw query), the header fields named in headers
// (names case-insensitive, values in order), the media type of the body
// and the body: in RFC 8785 canonical JSON when the media type is JSON
// (application/json or +json) and the body is valid JSON, else its bytes.
// So a retry that re-encodes its JSON body (other key order, other
// whitespace, 1.0 for 1) is the same request, and any other difference is
// another one. It takes time linear in the body (four passes over it), plus
// sorting each object's names, and allocates at most 2.4 bytes per byte
// of body plus 5 KiB (canonical.go).
func Fingerprint(r *http.Request, route string, headers []string, body []byte) []byte {
	h := sha256.New()
	field := func(s []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write(s)
	}
	field([]byte(fingerprintVersion))
	field([]byte(r.Method))
	field([]byte(route))
	field([]byte(r.URL.EscapedPath()))
	field([]byte(r.URL.RawQuery))
	for _, name := range headers {
		field([]byte(strings.ToLower(name)))
		values := r.Header.Values(name)
		field([]byte(strconv.Itoa(len(values))))
		for _, v := range values {
			field([]byte(v))
		}
	}
	mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	field([]byte(mediaType))
	if isJSON(mediaType) {
		if c, err := parseCanonical(body); err == nil {
			// field(canonical form), streamed: its length, then its bytes.
			field([]byte("jcs"))
			var n [8]byte
			binary.BigEndian.PutUint64(n[:], uint64(c.size))
			h.Write(n[:])
			c.writeTo(h)
			return h.Sum(nil)
		}
	}
	field([]byte("bytes"))
	field(body)
	return h.Sum(nil)
}

func isJSON(mediaType string) bool {
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}
