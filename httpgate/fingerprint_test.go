package httpgate_test

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"

	"github.com/idemgate/idemgate/httpgate"
)

func jsonRequest(method, path string, hdr ...string) *http.Request {
	r, _ := http.NewRequest(method, "http://api.test"+path, nil)
	r.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	return r
}

func TestFingerprintCanonicalisesJSONAsJCSDoes(t *testing.T) {
	for _, body := range []string{
		`{"b":1,"a":[1,2.50,{"d":null,"c":true}],"€":"x","\u00e9":"\u0001\n"}`,
		`{"peach":"This sorting order","péché":"is wrong according to French","pêche":"but canonicalization MUST","sin":"ignore locale","\ud83d\ude00":1,"\ufb33":2}`,
		`[1e300, -0, 0.000001, 1e-7, 123456789012345680000, "\u2028"]`,
		`"just a string"`,
	} {
		want, err := jcs.Transform([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		r := jsonRequest(http.MethodPost, "/x")
		if !bytes.Equal(httpgate.Fingerprint(r, "POST /x", nil, []byte(body)), httpgate.Fingerprint(r, "POST /x", nil, want)) {
			t.Errorf("%s and its JCS form %s fingerprint differently", body, want)
		}
	}
}

func TestFingerprintTellsRequestsApart(t *testing.T) {
	base := httpgate.Fingerprint(jsonRequest(http.MethodPost, "/charges"), "POST /charges", []string{"X-Tenant"}, []byte(`{"a":1}`))
	for name, fp := range map[string][]byte{
		"method":      httpgate.Fingerprint(jsonRequest(http.MethodPatch, "/charges"), "POST /charges", []string{"X-Tenant"}, []byte(`{"a":1}`)),
		"route":       httpgate.Fingerprint(jsonRequest(http.MethodPost, "/charges"), "POST /refunds", []string{"X-Tenant"}, []byte(`{"a":1}`)),
		"path":        httpgate.Fingerprint(jsonRequest(http.MethodPost, "/charges/2"), "POST /charges", []string{"X-Tenant"}, []byte(`{"a":1}`)),
		"query":       httpgate.Fingerprint(jsonRequest(http.MethodPost, "/charges?x=1"), "POST /charges", []string{"X-Tenant"}, []byte(`{"a":1}`)),
		"header":      httpgate.Fingerprint(jsonRequest(http.MethodPost, "/charges", "X-Tenant", "t2"), "POST /charges", []string{"X-Tenant"}, []byte(`{"a":1}`)),
		"body":        httpgate.Fingerprint(jsonRequest(http.MethodPost, "/charges"), "POST /charges", []string{"X-Tenant"}, []byte(`{"a":2}`)),
		"invalid":     httpgate.Fingerprint(jsonRequest(http.MethodPost, "/charges"), "POST /charges", []string{"X-Tenant"}, []byte(`{"a":1`)),
		"duplicate":   httpgate.Fingerprint(jsonRequest(http.MethodPost, "/charges"), "POST /charges", []string{"X-Tenant"}, []byte(`{"a":1,"a":1}`)),
		"header name": httpgate.Fingerprint(jsonRequest(http.MethodPost, "/charges"), "POST /charges", []string{"X-Other"}, []byte(`{"a":1}`)),
	} {
		if bytes.Equal(fp, base) {
			t.Errorf("a different %s fingerprints the same", name)
		}
	}
	// A header not named does not enter it.
	if !bytes.Equal(base, httpgate.Fingerprint(jsonRequest(http.MethodPost, "/charges", "X-Trace", "1"), "POST /charges", []string{"X-Tenant"}, []byte(` {"a" : 1} `))) {
		t.Error("an unnamed header or JSON whitespace changed the fingerprint")
	}
	// A body that is not JSON is its bytes: whitespace counts.
	text := jsonRequest(http.MethodPost, "/charges")
	text.Header.Set("Content-Type", "text/plain")
	if bytes.Equal(httpgate.Fingerprint(text, "POST /charges", nil, []byte("a")), httpgate.Fingerprint(text, "POST /charges", nil, []byte("a "))) {
		t.Error("two text bodies fingerprint the same")
	}
}

// Two JSON bodies that read alike only through a double or a replaced
// surrogate are two requests: such a body is fingerprinted as its bytes.
func TestFingerprintKeepsWhatCanonicalFormWouldLose(t *testing.T) {
	r := jsonRequest(http.MethodPost, "/transfers")
	for _, pair := range [][2]string{
		{`{"to":9007199254740993}`, `{"to":9007199254740992}`},
		{`{"amount":0.10000000000000001}`, `{"amount":0.1}`},
		{`{"note":"\ud800"}`, `{"note":"\ud801"}`},
		{`{"note":"\ud800"}`, `{"note":"\ufffd"}`},
		// Member names too (issue 30 item 9).
		{`{"\ud800":1}`, `{"\udc00":1}`},
		{`{"\ud800":1}`, `{"\ufffd":1}`},
		{`{"a":{"x\udbff":1}}`, `{"a":{"x\ud800":1}}`},
	} {
		if bytes.Equal(httpgate.Fingerprint(r, "POST /transfers", nil, []byte(pair[0])), httpgate.Fingerprint(r, "POST /transfers", nil, []byte(pair[1]))) {
			t.Errorf("%s and %s fingerprint the same", pair[0], pair[1])
		}
	}
	// What a double holds exactly is still canonical.
	for _, pair := range [][2]string{{`{"a":1e2}`, `{"a":100}`}, {`{"a":2.50}`, `{"a":2.5}`}, {`{"a":-0.0010}`, `{"a":-1e-3}`}} {
		if !bytes.Equal(httpgate.Fingerprint(r, "POST /transfers", nil, []byte(pair[0])), httpgate.Fingerprint(r, "POST /transfers", nil, []byte(pair[1]))) {
			t.Errorf("%s and %s fingerprint differently", pair[0], pair[1])
		}
	}
}

// TestFingerprintOfHostileBodies runs the bodies a quadratic canonicaliser
// chokes on (a wide object, deep nesting); it asserts only the results, as
// the test never measures time.
func TestFingerprintOfHostileBodies(t *testing.T) {
	r := jsonRequest(http.MethodPost, "/x")
	var wide strings.Builder
	wide.WriteString("{")
	for i := range 200000 {
		if i > 0 {
			wide.WriteString(",")
		}
		wide.WriteString(`"k` + strconv.Itoa(200000-i) + `":1`)
	}
	wide.WriteString("}")
	// Unique names in reverse order: sorted, not insertion-sorted.
	a := httpgate.Fingerprint(r, "POST /x", nil, []byte(wide.String()))
	if !bytes.Equal(a, httpgate.Fingerprint(r, "POST /x", nil, []byte(wide.String()))) {
		t.Fatal("the wide body fingerprints differently twice")
	}
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	if len(httpgate.Fingerprint(r, "POST /x", nil, []byte(deep))) != 32 {
		t.Fatal("no fingerprint for the deep body")
	}
}
