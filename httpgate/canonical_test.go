package httpgate

import (
	"bytes"
	"net/http"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// canonicalCorpus are bodies at the edges of JSON, JCS and the legacy
// decoder: escapes, surrogates, numbers, nesting, invalid forms.
var canonicalCorpus = []string{
	`{"b":1,"a":[1,2.50,{"d":null,"c":true}],"€":"x","\u00e9":"\u0001\n"}`,
	`{"peach":"This sorting order","péché":"is wrong according to French","pêche":"but canonicalization MUST","sin":"ignore locale","\ud83d\ude00":1,"\ufb33":2}`,
	`[1e300, -0, 0.000001, 1e-7, 123456789012345680000, "\u2028"]`,
	`"just a string"`, `1`, `-0`, `0`, `-0.0`, `1.5e+20`, `1e21`, `1e-6`, `1e-7`, `123e-2`, `1E2`, `1e+02`,
	`999999999999999`, `-999999999999999`, `9999999999999999`, `9007199254740993`, `9007199254740992`,
	`0.10000000000000001`, `0.1`, `1e400`, `-1e400`, `1e-400`, `0e-400`, `0e99999999999999999999`, `1e99999999999999999999`,
	`1.000000000000000000000000000000`, `100000000000000000000000000000`, `5e-324`, `1.7976931348623157e308`,
	`01`, `-`, `1.`, `.5`, `+1`, `1e`, `1e+`, `--1`, `-01`, `00`,
	`true`, `false`, `null`, `tru`, `nul`, `truex`, `[true,false,null]`,
	`{}`, `[]`, `{ }`, `[ ]`, ` {"a" : [ 1 , 2 ] } `, "\t\n\r{\"a\":1}\n",
	`{"a":1,}`, `[1,]`, `[,1]`, `{,}`, `{"a" 1}`, `{"a":1 "b":2}`, `[1 2]`, `{"a"}`, `{1:2}`, `{"a":1}{}`, `1 2`, ``, ` `,
	`{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `{"a":{"a":1},"b":{"a":1,"a":1}}`,
	`"\ud800"`, `"\udc00"`, `"\ud800\udc00"`, `"\ud800\u0041"`, `"\ud800\ud800\udc00"`, `"\uDBFF\uDFFF"`, `"\ufffd"`, "\"\uFFFD\"",
	`{"\ud800":1}`, `{"\udc00":1}`, `{"\ufffd":1}`, "{\"\uFFFD\":1}", `{"\ud83d\ude00":1,"\uffff":2,"\ue000":3}`,
	`"\/\b\f\n\r\t\"\\\u0000\u001f\u007f\u0080"`, `"\x"`, `"\u12"`, `"\u12G4"`, "\"a\x01\"", "\"\x7f\"", `"\'"`,
	`{"a\u0000":1,"a":2,"a\u0001":3,"A":4,"":5}`, `{"é":1,"e\u0301":2,"\u00e9x":3}`,
	`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`,
	strings.Repeat("[", 64) + strings.Repeat("]", 64), strings.Repeat("[", 65) + strings.Repeat("]", 65),
	strings.Repeat("[", 65) + "1" + strings.Repeat("]", 65), strings.Repeat(`{"a":`, 64) + "1" + strings.Repeat("}", 64),
	strings.Repeat(`{"a":`, 65) + "1" + strings.Repeat("}", 65), strings.Repeat(`{"a":`, 65) + "{}" + strings.Repeat("}", 65),
	"\xff", `"` + "\xed\xa0\x80" + `"`, `{"a":"b"}` + "\x00",
	`{"z":{"y":[{"x":1,"w":2},{}],"v":"\u00e9"},"a":[]}`,
	`{"/":1,"\/":2}`, `{"\u0022":1,"\"":2}`, `{"\u005c":1,"\\":2}`, `{"a\"b":1,"a":2,"a\u0000":3}`,
	`{"\uD83D\uDE00":1,"\ud83d\ude00":2}`, `{"😀":1,"\ud83d\ude00":2}`, `{"\ud83d\ude00x":1,"😀":2,"\uffff":3}`,
}

// canonicalOf is the new canonical form of body, or its error.
func canonicalOf(body []byte) ([]byte, error) {
	c, err := parseCanonical(body)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	c.writeTo(&out)
	if out.Len() != c.size {
		panic("canonical size " + strconv.Itoa(c.size) + ", wrote " + strconv.Itoa(out.Len()))
	}
	return out.Bytes(), nil
}

// loneSurrogateName matches a member name holding a surrogate escape, the
// one kind of body whose canonical form changed (item 9): the legacy form
// read a lone one as U+FFFD.
var loneSurrogateName = regexp.MustCompile(`(?i)"(?:[^"\\]|\\.)*\\ud[89a-f][0-9a-f]{2}(?:[^"\\]|\\.)*"\s*:`)

// sameAsLegacy fails unless the new canonical form of body is the legacy
// one, byte for byte, or both refuse it, or the body has a member name with
// a lone surrogate, which only the new one refuses.
func sameAsLegacy(t *testing.T, body []byte) {
	t.Helper()
	want, wantErr := legacyCanonicalJSON(body)
	got, err := canonicalOf(body)
	switch {
	case wantErr != nil && err != nil:
	case wantErr == nil && err == nil:
		if !bytes.Equal(got, want) {
			t.Errorf("%q: canonical %q, legacy %q", body, got, want)
		}
	case err != nil && loneSurrogateName.Match(body) && bytes.Contains(want, []byte("\uFFFD")):
		// Item 9: such names are fingerprinted as their bytes now.
	default:
		t.Errorf("%q: canonical %q (%v), legacy %q (%v)", body, got, err, want, wantErr)
	}
}

func TestCanonicalJSONMatchesTheLegacyOne(t *testing.T) {
	for _, body := range canonicalCorpus {
		sameAsLegacy(t, []byte(body))
	}
	// Wide and mixed bodies: sorting many names, numbers of every form.
	var wide strings.Builder
	wide.WriteString("{")
	for i := range 5000 {
		if i > 0 {
			wide.WriteString(",")
		}
		wide.WriteString(strconv.Quote("k" + strconv.Itoa(i*7919%5000)))
		wide.WriteString(":")
		wide.WriteString([]string{"1", "2.50", `"\u00e9"`, `{"b":1,"a":[1e-7]}`, "-0", "12345678.9"}[i%6])
	}
	wide.WriteString("}")
	sameAsLegacy(t, []byte(wide.String()))
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, body := range canonicalCorpus {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sameAsLegacy(t, body)
	})
}

// wideBody is a 0.9 MB object of 100,000 members, in reverse order, as
// issue 30 measured.
func wideBody() []byte {
	var b bytes.Buffer
	b.WriteString("{")
	for i := range 100000 {
		if i > 0 {
			b.WriteString(",")
		}
		name := strconv.FormatInt(int64(1679615-i), 36) // 4 digits
		b.WriteString(`"` + name + `":1`)
	}
	b.WriteString("}")
	return b.Bytes()
}

// TestCanonicalJSONMemoryBound: the bytes allocated to fingerprint a body
// stay within the bound docs/gating.md states, 2.4 per byte of body plus
// 5 KiB, for the shapes that cost the most per byte (many members, many
// small objects, deep nesting). The legacy form allocated ~35 per byte.
func TestCanonicalJSONMemoryBound(t *testing.T) {
	r := jsonRequestInternal()
	nested := strings.Repeat(`{"a":`, 63) + "1" + strings.Repeat("}", 63)
	for name, body := range map[string][]byte{
		"wide":    wideBody(),
		"members": []byte(`{` + strings.Repeat(`"":0,`, 50000) + `"":0}`),
		"objects": []byte(`[` + strings.Repeat(`{"":0},`, 50000) + `{"":0}]`),
		"nested":  []byte(`[` + strings.Repeat(nested+",", 2000) + nested + `]`),
		"strings": []byte(`["` + strings.Repeat(`\u00e9\n`, 50000) + `"]`),
	} {
		Fingerprint(r, "POST /x", nil, body) // warm up
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		const runs = 3
		for range runs {
			Fingerprint(r, "POST /x", nil, body)
		}
		runtime.ReadMemStats(&after)
		perRun := float64(after.TotalAlloc-before.TotalAlloc) / runs
		bound := 2.4*float64(len(body)) + 5<<10
		t.Logf("%s: %d bytes of body, %.0f bytes allocated (%.2f per byte), bound %.0f", name, len(body), perRun, perRun/float64(len(body)), bound)
		if perRun > bound {
			t.Errorf("%s: %.0f bytes allocated for %d bytes of body, over the bound %.0f", name, perRun, len(body), bound)
		}
	}
}

// TestCanonicalJSONDepthBound: a value nested deeper than maxJSONDepth
// makes the body fingerprinted as its bytes (the parser never recurses
// further), and one at the bound is canonical.
func TestCanonicalJSONDepthBound(t *testing.T) {
	at := strings.Repeat("[", maxJSONDepth) + "1" + strings.Repeat("]", maxJSONDepth)
	if _, err := parseCanonical([]byte(at)); err != nil {
		t.Errorf("a value %d deep: %v", maxJSONDepth, err)
	}
	over := strings.Repeat("[", maxJSONDepth+1) + "1" + strings.Repeat("]", maxJSONDepth+1)
	if _, err := parseCanonical([]byte(over)); err == nil {
		t.Errorf("a value %d deep is canonical", maxJSONDepth+1)
	}
	if _, err := parseCanonical([]byte(strings.Repeat("[", 1<<20))); err == nil {
		t.Error("a megabyte of [ is canonical")
	}
}

func BenchmarkFingerprintWide(b *testing.B) {
	r := jsonRequestInternal()
	body := wideBody()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		Fingerprint(r, "POST /x", nil, body)
	}
}

func BenchmarkFingerprintSmall(b *testing.B) {
	r := jsonRequestInternal()
	body := []byte(`{"customer":"cus_1","amount":500,"currency":"eur","metadata":{"order":"o-1","note":"caf\u00e9"}}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		Fingerprint(r, "POST /x", nil, body)
	}
}

func jsonRequestInternal() *http.Request {
	r, _ := http.NewRequest(http.MethodPost, "http://api.test/x", nil)
	r.Header.Set("Content-Type", "application/json")
	return r
}
