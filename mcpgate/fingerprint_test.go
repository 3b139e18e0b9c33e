package mcpgate_test

import (
	"crypto/sha256"
	"encoding/json"
	"testing"

	"github.com/idemgate/idemgate/mcpgate"
)

// The fingerprint is the SHA-256 of RFC 8785 canonical JSON; the vectors
// are the RFC's (appendix B numbers, section 3.2.2 and 3.2.3 examples).
func TestFingerprintIsRFC8785(t *testing.T) {
	for _, tc := range []struct{ name, in, canonical string }{
		{"numbers, strings and literals (3.2.2)",
			`{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
			  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
			  "literals": [null, true, false]}`,
			`{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`},
		{"member order by UTF-16 code units (3.2.3)",
			`{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh", "1": "One",
			  "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis"}`,
			"{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"},
		{"appendix B numbers", `{"a": [0, -0, 1e21, 1e-7, 9007199254740992, 5e-324, 1.7976931348623157e308, 295147905179352830000]}`,
			`{"a":[0,0,1e+21,1e-7,9007199254740992,5e-324,1.7976931348623157e+308,295147905179352830000]}`},
		{"nested objects are sorted too", `{"b": {"z": 1, "a": [{"y": 2, "x": 1}]}, "a": "<&>"}`,
			`{"a":"<&>","b":{"a":[{"x":1,"y":2}],"z":1}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args map[string]json.RawMessage
			if err := json.Unmarshal([]byte(tc.in), &args); err != nil {
				t.Fatal(err)
			}
			got, err := mcpgate.Fingerprint(args, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := sha256.Sum256([]byte(tc.canonical)); string(got) != string(want[:]) {
				t.Fatalf("fingerprint of %s is not the SHA-256 of %s", tc.in, tc.canonical)
			}
		})
	}
}

func TestFingerprintLeavesOutTheKeyAndExcludedArguments(t *testing.T) {
	fp := func(in string) []byte {
		var args map[string]json.RawMessage
		if err := json.Unmarshal([]byte(in), &args); err != nil {
			t.Fatal(err)
		}
		b, err := mcpgate.Fingerprint(args, map[string]bool{"request_id": true}, map[string]bool{"sent_at": true})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	base := fp(`{"amount": 100}`)
	if string(fp(`{"amount": 1e2, "request_id": "k", "sent_at": "now"}`)) != string(base) {
		t.Fatal("the key argument, an excluded argument or the spelling of a number changed the fingerprint")
	}
	if string(fp(`{"amount": 101}`)) == string(base) {
		t.Fatal("another amount has the same fingerprint")
	}
}
