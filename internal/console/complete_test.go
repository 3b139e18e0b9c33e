package console_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"html"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/console"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

// paymentsFiles describes the fixture's method, /payments.v1.Payments/Charge,
// built here from descriptor protos: no Go package of it exists, so the
// test binary links none of its types and only the descriptors decode
// them, as in a Dedupe service that never links its tool servers' code.
func paymentsFiles(t *testing.T) *protoregistry.Files {
	t.Helper()
	field := func(name string, n int32, typ descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(n), Type: typ.Enum(),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()}
	}
	fd := &descriptorpb.FileDescriptorProto{
		Name: proto.String("payments/v1/payments.proto"), Package: proto.String("payments.v1"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("ChargeRequest"), Field: []*descriptorpb.FieldDescriptorProto{field("amount_cents", 1, descriptorpb.FieldDescriptorProto_TYPE_INT64)}},
			{Name: proto.String("ChargeResponse"), Field: []*descriptorpb.FieldDescriptorProto{
				field("charge_id", 1, descriptorpb.FieldDescriptorProto_TYPE_STRING), field("amount_cents", 2, descriptorpb.FieldDescriptorProto_TYPE_INT64)}},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Payments"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: proto.String("Charge"), InputType: proto.String(".payments.v1.ChargeRequest"), OutputType: proto.String(".payments.v1.ChargeResponse")}}}},
	}
	files, err := protodesc.NewFiles(&descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{fd}})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func withDescriptors(files *protoregistry.Files) func(*console.Config) {
	return func(c *console.Config) { c.Descriptors = files }
}

// chargeResponse is a payments.v1.ChargeResponse packed as the interceptor
// stores it.
func chargeResponse(t *testing.T, files *protoregistry.Files, chargeID string, cents int64) *anypb.Any {
	t.Helper()
	d, err := files.FindDescriptorByName("payments.v1.ChargeResponse")
	if err != nil {
		t.Fatal(err)
	}
	md := d.(protoreflect.MessageDescriptor)
	msg := dynamicpb.NewMessage(md)
	msg.Set(md.Fields().ByName("charge_id"), protoreflect.ValueOfString(chargeID))
	msg.Set(md.Fields().ByName("amount_cents"), protoreflect.ValueOfInt64(cents))
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, msg, proto.MarshalOptions{Deterministic: true}); err != nil {
		t.Fatal(err)
	}
	return a
}

// finishWith makes a completed record of key storing outcome, through srv.
func finishWith(t *testing.T, srv *dedupesvc.Server, key string, outcome *anypb.Any) {
	t.Helper()
	fp := sha256.Sum256([]byte(key))
	resp, err := srv.Begin(toolContext(), &idemgatev1.BeginRequest{Scope: scope, Key: key, Fingerprint: fp[:], AttemptToken: "attempt-" + key,
		Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Finish(toolContext(), &idemgatev1.FinishRequest{Scope: scope, Key: key, AttemptToken: "attempt-" + key,
		Epoch: resp.GetReserved().GetEpoch(), Outcome: outcome}); err != nil {
		t.Fatalf("Finish %s: %v", key, err)
	}
}

var outcomePre = regexp.MustCompile(`(?s)<pre id="outcome">(.*?)</pre>`)

// shownJSON is the outcome a record page shows, parsed as JSON.
func shownJSON(t *testing.T, page string) map[string]any {
	t.Helper()
	m := outcomePre.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("the record page shows no outcome:\n%s", page)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(html.UnescapeString(m[1])), &v); err != nil {
		t.Fatalf("the outcome shown is not JSON (%v):\n%s", err, m[1])
	}
	return v
}

// A key's page decodes a stored outcome whose type only the descriptors
// know (inside a StoredOutcome too, as the interceptor stores a response
// with metadata); without them it stays base64, pointing to
// -console-descriptors.
func TestRecordPageDecodesOutcomesWithDescriptors(t *testing.T) {
	t.Parallel()
	files := paymentsFiles(t)
	outcome := chargeResponse(t, files, "ch_1", 4200)
	stored, err := anypb.New(&idemgatev1.StoredOutcome{Result: outcome,
		Header: []*idemgatev1.MetadataEntry{{Key: "x-charge", Values: [][]byte{[]byte("ch_2")}}}})
	if err != nil {
		t.Fatal(err)
	}

	without := newFixture(t)
	finishWith(t, without.srv, "paid-1", outcome)
	b := without.browser(t)
	b.signedIn()
	_, page := b.get("/record?" + refForm("paid-1").Encode())
	if !strings.Contains(page, "base64") || !strings.Contains(page, "-console-descriptors") || strings.Contains(page, "ch_1") {
		t.Fatalf("without descriptors: want the outcome in base64 and a hint at -console-descriptors:\n%s", page)
	}

	with := newFixture(t, withDescriptors(files))
	finishWith(t, with.srv, "paid-1", outcome)
	finishWith(t, with.srv, "paid-2", stored)
	b = with.browser(t)
	b.signedIn()
	resp, page := b.get("/record?" + refForm("paid-1").Encode())
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "decoded to JSON") {
		t.Fatalf("with descriptors: %s, want the outcome decoded:\n%s", resp.Status, page)
	}
	if got := shownJSON(t, page); got["chargeId"] != "ch_1" || got["amountCents"] != "4200" {
		t.Errorf("paid-1's outcome shown as %v, want chargeId ch_1, amountCents \"4200\"", got)
	}
	_, page = b.get("/record?" + refForm("paid-2").Encode())
	got := shownJSON(t, page)
	result, _ := got["result"].(map[string]any)
	if result["@type"] != "type.googleapis.com/payments.v1.ChargeResponse" || result["chargeId"] != "ch_1" || got["header"] == nil {
		t.Errorf("paid-2's stored outcome shown as %v, want its header and its result decoded", got)
	}
}

// An outcome the service seals: the admin API opens it for the console,
// which decodes it; a replica without the outcome key shows why it
// cannot, as before.
func TestSealedOutcomesDecodeWhenOpenedOnly(t *testing.T) {
	t.Parallel()
	files := paymentsFiles(t)
	pool, schema := pgtest.Schema(t)
	store := pgstore.New(pool, pgstore.WithChannel(schema), pgstore.WithoutNotify())
	cipher, err := dedupesvc.NewOutcomeCipher([]dedupesvc.OutcomeKey{{ID: "k1", Key: make([]byte, dedupesvc.OutcomeKeyBytes)}})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	sealing := dedupesvc.NewServer(store, dedupesvc.WithOutcomeCipher(cipher), dedupesvc.WithLogger(slog.New(slog.NewJSONHandler(logs, nil))))
	finishWith(t, sealing, "paid-1", chargeResponse(t, files, "ch_1", 4200))

	opened := consoleOver(t, store, sealing, pool, logs, withDescriptors(files))
	b := opened.browser(t)
	b.signedIn()
	_, page := b.get("/record?" + refForm("paid-1").Encode())
	if got := shownJSON(t, page); got["chargeId"] != "ch_1" {
		t.Errorf("the opened outcome shown as %v, want chargeId ch_1", got)
	}

	keyless := dedupesvc.NewServer(store, dedupesvc.WithLogger(slog.New(slog.NewJSONHandler(logs, nil))))
	sealed := consoleOver(t, store, keyless, pool, logs, withDescriptors(files))
	b = sealed.browser(t)
	b.signedIn()
	_, page = b.get("/record?" + refForm("paid-1").Encode())
	if !strings.Contains(page, "The stored outcome cannot be read") || strings.Contains(page, `id="outcome"`) {
		t.Errorf("a sealed outcome the service cannot open: want why, and no outcome:\n%s", page)
	}
}

// postForm posts the form of the record key names, with the session's
// CSRF token and fields.
func (b *browser) postForm(path, csrf string, fields map[string]string) (*http.Response, string) {
	b.t.Helper()
	form := refForm(fields["key"])
	form.Set("csrf", csrf)
	for k, v := range fields {
		form.Set(k, v)
	}
	return b.post(path, form)
}

// hiddenField matches the value of a form's hidden field name.
func hiddenField(name string) *regexp.Regexp {
	return regexp.MustCompile(`name="` + name + `" value="([^"]*)"`)
}

// Completing an outcome-unknown record with JSON: the resolve page names
// the method's response type; the JSON is shown back as it will be stored
// with the consequence, changing nothing; confirmed, the record is
// completed with exactly those bytes, replayed by the next Begin, and
// audited. Bad JSON, a method the descriptors lack, a form without the
// session's CSRF token, or a console without descriptors change nothing.
func TestCompleteWithAJSONOutcome(t *testing.T) {
	t.Parallel()
	files := paymentsFiles(t)
	f := newFixture(t, withDescriptors(files))
	f.unknown(t, "blocked-1")
	b := f.browser(t)
	csrf := b.signedIn()

	resp, page := b.get("/resolve?" + refForm("blocked-1").Encode())
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, `id="complete-type">payments.v1.ChargeResponse</code>`) || !strings.Contains(page, `name="outcome_json"`) {
		t.Fatalf("resolve page with descriptors: %s, want a JSON form for payments.v1.ChargeResponse:\n%s", resp.Status, page)
	}

	for name, text := range map[string]string{
		"not JSON":          `{"chargeId": "ch_1"`,
		"a wrong type":      `{"chargeId": 42}`,
		"an unknown field":  `{"chargeId": "ch_1", "refunded": true}`,
		"empty":             ``,
		"not of a message":  `["ch_1"]`,
		"confirmed, broken": `{"chargeId": }`,
	} {
		fields := map[string]string{"key": "blocked-1", "resolution": "complete", "outcome_json": text}
		if strings.HasPrefix(name, "confirmed") {
			fields["confirm"], fields["type_url"] = "yes", "type.googleapis.com/payments.v1.ChargeResponse"
		}
		resp, page := b.postForm("/resolve", csrf, fields)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(page, "not a valid payments.v1.ChargeResponse") || !strings.Contains(page, "Nothing was changed") {
			t.Errorf("complete with %s JSON: %s, want 400 naming the type:\n%s", name, resp.Status, page)
		}
	}
	if got := f.state(t, "blocked-1"); got != "unknown" {
		t.Fatalf("blocked-1 is %s after refused outcomes, want unknown", got)
	}

	text := `{"chargeId": "ch_1", "amountCents": "4200"}`
	resp, page = b.postForm("/resolve", csrf, map[string]string{"key": "blocked-1", "resolution": "complete", "outcome_json": text})
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, `id="confirm-complete"`) || !strings.Contains(page, "Every retry with this key gets this outcome") ||
		!strings.Contains(page, "the side effect never runs again") {
		t.Fatalf("complete's review: %s, want the confirmation with its consequence:\n%s", resp.Status, page)
	}
	if got := f.state(t, "blocked-1"); got != "unknown" {
		t.Fatalf("blocked-1 is %s after the review alone, want unknown", got)
	}
	confirm := map[string]string{"key": "blocked-1", "resolution": "complete", "confirm": "yes",
		"outcome_json": html.UnescapeString(field(t, hiddenField("outcome_json"), page)), "type_url": field(t, hiddenField("type_url"), page)}

	// The confirmation without the session's CSRF token: refused.
	form := refForm("blocked-1")
	for k, v := range confirm {
		form.Set(k, v)
	}
	if resp, _ := b.post("/resolve", form); resp.StatusCode != http.StatusForbidden || f.state(t, "blocked-1") != "unknown" {
		t.Fatalf("the confirmation without a CSRF token: %s, record %s; want 403 and no change", resp.Status, f.state(t, "blocked-1"))
	}

	resp, page = b.postForm("/resolve", csrf, confirm)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "Completed") || !strings.Contains(page, "every retry with this key gets this outcome") {
		t.Fatalf("complete, confirmed: %s\n%s", resp.Status, page)
	}
	want := chargeResponse(t, files, "ch_1", 4200)
	got, err := f.admin.GetRecord(context.Background(), &idemgatev1.GetRecordRequest{Ref: ref("blocked-1"), IncludeOutcome: true})
	if err != nil {
		t.Fatal(err)
	}
	if rec := got.GetRecord(); rec.GetState() != "completed" || !proto.Equal(rec.GetOutcome(), want) {
		t.Fatalf("blocked-1 after the confirmation: %s with %v, want completed with %v", rec.GetState(), rec.GetOutcome(), want)
	}
	// The next call with the key is a replay of exactly those bytes.
	replay, _ := f.begin(t, "blocked-1")
	if !proto.Equal(replay.GetCompleted().GetOutcome(), want) {
		t.Fatalf("Begin after the completion: %v, want a replay of %v", replay, want)
	}
	if !strings.Contains(f.logs.String(), `"msg":"console: operator action","by":"oncall","action":"resolve_complete","namespace":"tools","scope":"`+scope+`","key":"blocked-1","result":"ok"`) ||
		!strings.Contains(f.logs.String(), `"type_url":"type.googleapis.com/payments.v1.ChargeResponse"`) {
		t.Errorf("no audit line for the completion:\n%s", f.logs)
	}
	if strings.Count(f.logs.String(), `"action":"resolve_complete"`) != 1 {
		t.Errorf("refused outcomes or the review left audit lines:\n%s", f.logs)
	}
	// Another outcome confirmed now that it is completed: the admin API
	// refuses (the same outcome again is taken as a retry of this one).
	confirm["outcome_json"] = `{"chargeId":"ch_9"}`
	if resp, page := b.postForm("/resolve", csrf, confirm); resp.StatusCode != http.StatusConflict || !strings.Contains(page, "RECORD_NOT_UNKNOWN") {
		t.Errorf("completing a completed record with another outcome: %s, want 409:\n%s", resp.Status, page)
	}
	if got, _ := f.admin.GetRecord(context.Background(), &idemgatev1.GetRecordRequest{Ref: ref("blocked-1"), IncludeOutcome: true}); !proto.Equal(got.GetRecord().GetOutcome(), want) {
		t.Errorf("blocked-1's outcome changed to %v by a refused complete", got.GetRecord().GetOutcome())
	}

	// A method the descriptors do not describe: refused, named.
	other := "/shop.v1.Orders/Place|acme"
	fp := sha256.Sum256([]byte("x"))
	begun, err := f.srv.Begin(toolContext(), &idemgatev1.BeginRequest{Scope: other, Key: "order-1", Fingerprint: fp[:], AttemptToken: "a",
		Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.Release(toolContext(), &idemgatev1.ReleaseRequest{Scope: other, Key: "order-1", AttemptToken: "a", Epoch: begun.GetReserved().GetEpoch(), OutcomeUnknown: true}); err != nil {
		t.Fatal(err)
	}
	otherRef := url.Values{"ns": {namespace}, "scope": {other}, "key": {"order-1"}}.Encode()
	if _, page := b.get("/resolve?" + otherRef); !strings.Contains(page, `id="complete-unavailable"`) || !strings.Contains(page, "/shop.v1.Orders/Place is not in -console-descriptors") {
		t.Errorf("resolve page of a method the descriptors lack: want why it cannot complete:\n%s", page)
	}
	form = refForm("order-1")
	form.Set("scope", other)
	form.Set("csrf", csrf)
	form.Set("resolution", "complete")
	form.Set("outcome_json", `{}`)
	if resp, page := b.post("/resolve", form); resp.StatusCode != http.StatusBadRequest || !strings.Contains(page, "not in -console-descriptors") {
		t.Errorf("complete of a method the descriptors lack: %s, want 400:\n%s", resp.Status, page)
	}

	// Without descriptors the resolve page points to idemctl, and a
	// complete is refused.
	plain := newFixture(t)
	plain.unknown(t, "blocked-1")
	pb := plain.browser(t)
	pcsrf := pb.signedIn()
	if _, page := pb.get("/resolve?" + refForm("blocked-1").Encode()); !strings.Contains(page, "idemctl resolve -complete-json") || strings.Contains(page, `name="outcome_json"`) {
		t.Errorf("resolve page without descriptors: want idemctl named and no JSON form:\n%s", page)
	}
	if resp, page := pb.postForm("/resolve", pcsrf, map[string]string{"key": "blocked-1", "resolution": "complete", "outcome_json": text, "confirm": "yes",
		"type_url": "type.googleapis.com/payments.v1.ChargeResponse"}); resp.StatusCode != http.StatusBadRequest || !strings.Contains(page, "-console-descriptors") {
		t.Errorf("complete without descriptors: %s, want 400 naming -console-descriptors:\n%s", resp.Status, page)
	}
	if got := plain.state(t, "blocked-1"); got != "unknown" {
		t.Errorf("blocked-1 is %s after a complete without descriptors, want unknown", got)
	}
}
