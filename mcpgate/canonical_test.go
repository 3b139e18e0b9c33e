package mcpgate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"
)

// members is an object of n members, each a number, named in the order
// json.Marshal writes a map: sorted, the order jcs's insertion sort walked
// to the end of its list for every member.
func members(n int) []byte {
	args := make(map[string]json.RawMessage, n)
	for i := range n {
		args[fmt.Sprintf("k%07d", i)] = json.RawMessage("1")
	}
	b, err := json.Marshal(args)
	if err != nil {
		panic(err)
	}
	return b
}

// The canonical form's work (bytes written, name comparisons) grows as
// n log n with the number of members, and linearly with nesting: doubling
// the input at most doubles it, and a bit. jcs compared each member with
// every one before it (40000 members: 800 million comparisons, 4 CPU-s).
func TestCanonicalWorkGrowsNLogN(t *testing.T) {
	for _, tc := range []struct {
		name string
		of   func(n int) []byte
		n    int
	}{
		{"members", members, 20000},
		{"nesting", func(n int) []byte { return []byte(nestedObjects(n, 1000)) }, 2000},
		{"nested members", func(n int) []byte { return []byte(`{"a":[` + string(members(n)) + `]}`) }, 20000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			work := func(n int) int {
				_, w, err := canonicalJSON(tc.of(n))
				if err != nil {
					t.Fatal(err)
				}
				return w
			}
			small, large := work(tc.n), work(2*tc.n)
			if float64(large) > 2.3*float64(small) {
				t.Fatalf("work for %d is %d, for %d %d: more than 2.3 times", tc.n, small, 2*tc.n, large)
			}
		})
	}
}

// nestedObjects is n levels of objects of two members around a string of
// size bytes.
func nestedObjects(n, size int) string {
	return strings.Repeat(`{"b":`, n) + `"` + strings.Repeat("x", size) + `"` + strings.Repeat(`,"a":0}`, n)
}

// The canonical form is jcs's, byte for byte, for every input jcs accepted,
// and an error for every input jcs refused; the one exception is a lone
// surrogate in a member name, which jcs read past (fingerprinting a part of
// the input) and the gate refuses, as jcs refused a lone surrogate in a
// value.
func FuzzCanonicalJSONIsJCS(f *testing.F) {
	for _, g := range []string{
		`{}`, `{"a":null}`, `{"b":{"z":1,"a":[{"y":2,"x":1}]},"a":"<&>"}`,
		`{"n":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001,-0,1e21,1e-7,5e-324,1e400]}`,
		`{"s":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","t":"\ud83d\ude00\ud800\u0041"}`,
		`{"n":{"\u20ac":1,"\r":2,"\ufb33":3,"1":4,"\ud83d\ude00":5,"\u0080":6,"\u00f6":7,"":8}}`,
		`{"n":{"a":1,"a":2}}`, `{"a":{"\ud800xx,":1}}`, "{\"s\":\"a\xffb\",\"n\":{\"\xfe\":1,\"\xff\":2}}",
	} {
		f.Add([]byte(g))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var args map[string]json.RawMessage
		if json.Unmarshal(in, &args) != nil {
			return
		}
		b, err := json.Marshal(args)
		if err != nil {
			return
		}
		want, jcsErr := jcs.Transform(b)
		got, _, err := canonicalJSON(b)
		switch {
		case jcsErr != nil && err == nil:
			t.Fatalf("%s: canonical %s, but jcs refused it: %v", b, got, jcsErr)
		case jcsErr == nil && errors.Is(err, errLoneSurrogate):
		case jcsErr == nil && err != nil:
			t.Fatalf("%s: %v, but jcs gave %s", b, err, want)
		case !bytes.Equal(got, want):
			t.Fatalf("%s: canonical\n%s\nwant jcs's\n%s", b, got, want)
		}
	})
}
