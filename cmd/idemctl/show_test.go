package main

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"

	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
)

// hostileRunes are what a tenant's outcome may hold to make a terminal show
// something other than the bytes: bidirectional overrides and isolates
// (the "Trojan Source" reordering), marks, zero-width and line-breaking
// format characters, a C1 control.
var hostileRunes = []rune{
	'\u202a', '\u202b', '\u202c', '\u202d', '\u202e', // embeddings and overrides
	'\u2066', '\u2067', '\u2068', '\u2069', // isolates
	'\u200e', '\u200f', '\u061c', // marks
	'\u200b', '\ufeff', '\u2028', '\u2029', // zero width, line and paragraph separators
	'\u009b', // CSI
}

// TestShowEscapesBidiAndControlCharacters: every string show prints from a
// stored outcome (a response's JSON fields, its metadata, a stored error's
// message) comes out with bidirectional and other control characters
// escaped, readable text untouched.
func TestShowEscapesBidiAndControlCharacters(t *testing.T) {
	t.Parallel()
	hostile := "ch_" + string(hostileRunes) + "_é"
	charge, err := anypb.New(&paymentsv1.ChargeCardResponse{ChargeId: hostile, CustomerId: "cust_17"})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := anypb.New(&idemgatev1.StoredOutcome{Result: charge,
		Header: []*idemgatev1.MetadataEntry{{Key: "x-note", Values: [][]byte{[]byte(hostile)}}}})
	if err != nil {
		t.Fatal(err)
	}
	resolver, err := typesResolver("")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printOutcome(&out, stored, resolver, "")
	text := out.String()
	for _, r := range hostileRunes {
		if strings.ContainsRune(text, r) {
			t.Errorf("show printed %U raw:\n%s", r, text)
		}
	}
	for _, want := range []string{`\u202e`, `\u2066`, `\u200b`, "cust_17", "chargeId"} {
		if !strings.Contains(text, want) {
			t.Errorf("show does not print %q:\n%s", want, text)
		}
	}
	if !strings.Contains(text, "_é") {
		t.Errorf("show escaped printable non-ASCII text in the JSON:\n%s", text)
	}
}
