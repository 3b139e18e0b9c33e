package mcpgate_test

import (
	"encoding/hex"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/mcpgate"
)

// goldenFingerprints are fingerprints computed by the gate before its
// canonical JSON was rewritten to run in linear time (with
// github.com/gowebpki/jcs): stored records are keyed by them, so every
// input that fingerprinted then must fingerprint to the same bytes, and
// every input refused then (err) is refused still.
var goldenFingerprints = []struct {
	name, args string
	keyArgs    []string
	exclude    []string
	want       string // hex, or "err"
}{
	{"empty", `{}`, nil, nil, "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"},
	{"null arguments are no arguments", `{"a": null}`, nil, nil, "d091f9c83c091f79652fe8786375b3fe4ce0861a56f5bfbafedbe431877ff0e8"},
	{"flat", `{"customerId": "c", "amountCents": 5}`, nil, nil, "73a35d468824cc6f7927f2e209d0f5ae896c880bfe30a1b46937718ed5511cec"},
	{"key and exclusion", `{"amount": 1e2, "request_id": "k", "sent_at": "now"}`, []string{"request_id"}, []string{"sent_at"}, "4d4bbe59c6aad22442cde199a6a8a5f034405fcd78fb5a81c24ef249de1c45f1"},
	{"numbers", `{"n": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001, 0, -0, 1e21, 1e-7, 9007199254740993, 5e-324, 1.7976931348623157e308, 295147905179352830000, -1.5e-9, 123456789012345678901234567890, 1e+21, 999999999999999999999, 0.1, -0.0, 1E-6, 1e-6, 0.000001, 1e-5]}`, nil, nil, "fda6f96bb3bf6435ceafdc25c1774bdc99c55171416556ed15e32026ebfa5a24"},
	{"strings and escapes", `{"s": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/", "t": "\b\f\n\r\t\u0001\u001f\u007f\u0080", "h": "<&>\u2028\u2029", "e": ""}`, nil, nil, "b5145b3c3165924c82609a1b9f7b5c8589111d5c001569d58f07c39f799336f9"},
	{"surrogate pairs", `{"emoji": "\ud83d\ude00 😀", "\ud83d\ude00": 1, "\ufb33": 2, "\u20ac": 3}`, nil, nil, "b65e44eb3b7c1cfa12ba28a582c4a65443c87c6f8ad174db44c2f89e2d42c471"},
	{"a high surrogate swallows the escape after it", `{"s": "\ud800\u0041", "t": "\udc00\u0041"}`, nil, nil, "aa4c9cc27489c3dc7064c8ae8797657c0e842828d32fd1fef4b4526a35a1ac7c"},
	{"member order by UTF-16 code units", `{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew", "1": "One", "\ud83d\ude00": "Emoji", "\u0080": "Control", "\u00f6": "o", "nested": {"\ufb33": 1, "\ud83d\ude00": 2, "\u00f6": 3, "o": 4, "": 5, "aa": 6, "a": 7, "ab": 8}}`, nil, nil, "603b37944e48f381d3445641a47535138e17a1034cfec709e6504867a89a691e"},
	{"nested unsorted", `{"b": {"z": 1, "a": [{"y": 2, "x": 1}, [], {}, [[{"q": {"p": null}}]]]}, "a": "<&>", "c": [true, false, null, "x", 1.0, {"k": "v"}]}`, nil, nil, "5a58637397e0b01022b6872e0d9a846395262694d4b6729c05828c04314fa65c"},
	{"whitespace", "{ \"a\" :\t[ 1 ,\n 2 ] , \"b\" : { \"c\" : \"d\" } }", nil, nil, "61da759e4ad964d511e7a8b6f846c41fbce28840ab4545f35ecbcbffbe6d4aba"},
	{"keys needing escapes", `{"a\"b": 1, "a\\b": 2, "a\nb": 3, "a\u0000b": 4, "n": {"x\"": 1, "x\u0001": 2, "x/": 3, "x\/y": 4}}`, nil, nil, "6f34a6652eee3eec97c162d356432a6d24ba617bfa1f366db6ae298c672e1ddf"},
	{"non-ASCII", `{"ключ": "значение", "日本": {"語": "テキスト", "あ": 1}, "ä": "é"}`, nil, nil, "ee70ecaa2ed1768e5b959912528e83f83758216ec1727e4a12545afd61bcdede"},
	{"invalid UTF-8 in a string", "{\"s\": \"a\xffb\xc3\", \"n\": {\"k\xfe\": \"\xed\xa0\x80\"}}", nil, nil, "182f6bc8cc96c8bd929c664e0ae3c8a0a589089367ee75c956fd8203daa546fb"},
	{"deep", `{"d": [[[[[[[[[[[[[[[[{"a": [[[[{"b": {"c": {"d": [1, {"e": "f"}]}}}]]]]}]]]]]]]]]]]]]]]]}`, nil, nil, "f17c7e3eabcebc2180c834eb0c475ae5947a71b15b07964b7db64fbc1b0096be"},
	{"keys excluded only at the top", `{"request_id": "k", "nested": {"request_id": "k2"}}`, []string{"request_id"}, []string{"nested_missing"}, "c18d6fd40d08488635aaa90aef322a756b4a74ed02d3cd227b43a81b328384af"},
	{"top-level duplicate: the last wins", `{"a": 1, "a": 2}`, nil, nil, "7e8059f495589fcd981232cc11d00b00da3802c01d688fa1cf1f6bed6e5bb33c"},
	{"big integers that round alike", `{"a": 9007199254740993}`, nil, nil, "65c07d758377f303542fde97a8fe78f29a66c1e062b8f80fed3106a6d106d88b"},
	{"nested duplicate", `{"n": {"a": 1, "a": 2}}`, nil, nil, "err"},
	{"nested duplicate apart", `{"n": {"a": 1, "b": 3, "a": 2}}`, nil, nil, "err"},
	{"number out of range", `{"n": 1e400}`, nil, nil, "err"},
	{"lone high surrogate", `{"s": "\ud800x"}`, nil, nil, "err"},
	{"lone low surrogate", `{"s": "\udc00"}`, nil, nil, "err"},
	{"lone surrogate in a nested key", `{"n": {"\ud800": 1}}`, nil, nil, "err"},
	// The one input whose fingerprint changed: jcs read past a lone surrogate
	// in a nested member's name and fingerprinted what it had read so far,
	// {"a":{}} here, so unequal arguments collided. Refused now, as a lone
	// surrogate anywhere else always was.
	{"lone surrogate in a nested key, then text jcs resynchronized on", `{"a": {"\ud800xx,": 1}}`, nil, nil, "err"},
}

func TestFingerprintKeepsItsGoldenValues(t *testing.T) {
	set := func(names []string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	for _, g := range goldenFingerprints {
		var args map[string]json.RawMessage
		if err := json.Unmarshal([]byte(g.args), &args); err != nil {
			t.Fatalf("%s: %v", g.name, err)
		}
		fp, err := mcpgate.Fingerprint(args, set(g.keyArgs), set(g.exclude))
		switch {
		case g.want == "err" && err == nil:
			t.Errorf("%s: fingerprint %x, want an error", g.name, fp)
		case g.want == "err":
		case err != nil:
			t.Errorf("%s: %v, want %s", g.name, err, g.want)
		case hex.EncodeToString(fp) != g.want:
			t.Errorf("%s: fingerprint %x, want %s", g.name, fp, g.want)
		}
	}
}

// nested is n levels of objects of two members, the first member holding
// the next level, around a string of size bytes: every level is reordered.
func nested(n, size int) string {
	var b strings.Builder
	for range n {
		b.WriteString(`{"b":`)
	}
	b.WriteString(`"` + strings.Repeat("x", size) + `"`)
	for range n {
		b.WriteString(`,"a":0}`)
	}
	return `{"v":` + b.String() + `}`
}

// The fingerprint allocates in proportion to its input, however deep the
// input nests: jcs built each level's text anew, so n levels around a big
// string allocated n copies of it (2000 levels, 90 KB of arguments: 165 MB).
// Work is counted in bytes allocated, not in time.
func TestFingerprintAllocatesInProportionToItsInput(t *testing.T) {
	in := nested(2000, 64<<10)
	var args map[string]json.RawMessage
	if err := json.Unmarshal([]byte(in), &args); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := mcpgate.Fingerprint(args, nil, nil); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if allocated, limit := after.TotalAlloc-before.TotalAlloc, uint64(32*len(in)); allocated > limit {
		t.Fatalf("the fingerprint of %d bytes nested 2000 deep allocated %d bytes, want at most %d (32 times the input)", len(in), allocated, limit)
	}
}
