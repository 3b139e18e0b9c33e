package main

import (
	"bytes"
	"encoding/hex"
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

// TestShowSaysWhyAnOutcomeWasNotStored: show tells a marker stored for the
// stored-bytes quota from one for the size limit, and reads one an older
// version stored (no cause) as the size limit, as it was.
func TestShowSaysWhyAnOutcomeWasNotStored(t *testing.T) {
	t.Parallel()
	// ResultTooLarge{size_bytes: 2000, type_url: ...MutateResponse} as a
	// gate before the cause field wrote it.
	older, err := hex.DecodeString("08d00f1236747970652e676f6f676c65617069732e636f6d2f6964656d676174652e74657374696e672e76312e4d7574617465526573706f6e7365")
	if err != nil {
		t.Fatal(err)
	}
	quota, err := anypb.New(&idemgatev1.ResultTooLarge{SizeBytes: 2000, TypeUrl: "type.googleapis.com/x.R",
		Cause: idemgatev1.ResultTooLargeCause_RESULT_TOO_LARGE_CAUSE_STORED_BYTES_QUOTA})
	if err != nil {
		t.Fatal(err)
	}
	resolver, err := typesResolver("")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		marker        *anypb.Any
		want, notWant string
	}{
		{"written by an older version", &anypb.Any{TypeUrl: "type.googleapis.com/idemgate.v1.ResultTooLarge", Value: older}, "over the size limit", "quota"},
		{"stored-bytes quota", quota, "stored-outcome quota (-caller-max-bytes)", "over the size limit"},
	} {
		var out bytes.Buffer
		printOutcome(&out, tc.marker, resolver, "")
		if text := out.String(); !strings.Contains(text, tc.want) || strings.Contains(text, tc.notWant) || !strings.Contains(text, "IDEMPOTENCY_RESULT_TOO_LARGE") {
			t.Errorf("%s: show printed %q; want it to say %q and IDEMPOTENCY_RESULT_TOO_LARGE, not %q", tc.name, text, tc.want, tc.notWant)
		}
	}
}
