package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/outcomejson"
	"github.com/idemgate/idemgate/internal/tokenfile"
)

// sortOrders maps list's -sort to the admin API's order.
var sortOrders = map[string]idemgatev1.RecordOrder{
	"expiry":     idemgatev1.RecordOrder_RECORD_ORDER_UNSPECIFIED,
	"replays":    idemgatev1.RecordOrder_RECORD_ORDER_REPLAYS,
	"replay-age": idemgatev1.RecordOrder_RECORD_ORDER_REPLAY_AGE,
}

// showRecord prints a record, its replays and ages (as of now), and its
// stored outcome as JSON, through resolver.
func showRecord(out io.Writer, r *idemgatev1.Record, now time.Time, resolver outcomejson.Resolver) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(w, "%s\t%s\n", k, v) }
	row("namespace", safe(r.GetRef().GetNamespace()))
	row("scope", safe(r.GetRef().GetScope()))
	row("key", safe(r.GetRef().GetKey()))
	row("state", safe(r.GetState()))
	row("epoch", fmt.Sprint(r.GetEpoch()))
	if r.GetOutcomeTypeUrl() == "" && r.GetOutcomeSize() == 0 {
		row("outcome_type", "- (no outcome stored)") // in flight, released or outcome-unknown
	} else {
		row("outcome_type", fmt.Sprintf("%s (%d bytes)", safe(r.GetOutcomeTypeUrl()), r.GetOutcomeSize()))
	}
	row("lease_expires_at", stamp(r.GetLeaseExpiresAt().AsTime()))
	if r.GetCompletedAt() != nil {
		row("completed_at", fmt.Sprintf("%s (%s ago)", stamp(r.GetCompletedAt().AsTime()), age(now.Sub(r.GetCompletedAt().AsTime()))))
	} else {
		row("completed_at", "-")
	}
	row("expires_at", stamp(r.GetExpiresAt().AsTime()))
	// The count lags by the service's flush interval and loses what a
	// crashed replica had not flushed: say it is a lower bound.
	row("replays", fmt.Sprintf("%d (at least; counted by the service, flushed every -replay-flush-interval)", r.GetReplayCount()))
	if r.GetLastReplayedAt() != nil {
		last := r.GetLastReplayedAt().AsTime()
		row("last_replayed_at", fmt.Sprintf("%s (%s ago, %s after completion)", stamp(last), age(now.Sub(last)), age(replayAge(r))))
	} else {
		row("last_replayed_at", "-")
	}
	w.Flush()
	switch {
	case r.GetOutcome() != nil:
		fmt.Fprintln(out, "outcome, as every duplicate receives it:")
		printOutcome(out, r.GetOutcome(), resolver, "  ")
	case r.GetOutcomeError() != "":
		fmt.Fprintf(out, "outcome: cannot be read: %s\n", safe(r.GetOutcomeError()))
	}
}

// replayAge is how long after completion r was last replayed.
func replayAge(r *idemgatev1.Record) time.Duration {
	if r.GetLastReplayedAt() == nil || r.GetCompletedAt() == nil {
		return 0
	}
	return r.GetLastReplayedAt().AsTime().Sub(r.GetCompletedAt().AsTime())
}

// age prints a duration to the second (milliseconds under one).
func age(d time.Duration) string {
	if d < time.Second && d > -time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

var (
	storedOutcomeName = (&idemgatev1.StoredOutcome{}).ProtoReflect().Descriptor().FullName()
	statusName        = (&status.Status{}).ProtoReflect().Descriptor().FullName()
	tooLargeName      = (&idemgatev1.ResultTooLarge{}).ProtoReflect().Descriptor().FullName()
)

// printOutcome prints a stored outcome as the interceptor stored it: the
// response metadata and result of a StoredOutcome, a final error's code,
// message and details, the too-large marker (and why: the size limit or the
// stored-bytes quota), or the response as JSON. A
// type the resolver does not know is printed as its type URL and base64.
func printOutcome(out io.Writer, a *anypb.Any, resolver outcomejson.Resolver, indent string) {
	switch a.MessageName() {
	case storedOutcomeName:
		stored := &idemgatev1.StoredOutcome{}
		if err := proto.Unmarshal(a.GetValue(), stored); err != nil {
			raw(out, a, indent, err)
			return
		}
		for _, md := range []struct {
			name    string
			entries []*idemgatev1.MetadataEntry
		}{{"header", stored.GetHeader()}, {"trailer", stored.GetTrailer()}} {
			for _, e := range md.entries {
				for _, v := range e.GetValues() {
					value := safe(string(v))
					if strings.HasSuffix(e.GetKey(), "-bin") {
						value = base64.StdEncoding.EncodeToString(v)
					}
					fmt.Fprintf(out, "%s%s %s: %s\n", indent, md.name, safe(e.GetKey()), value)
				}
			}
		}
		printOutcome(out, stored.GetResult(), resolver, indent)
	case statusName:
		st := &status.Status{}
		if err := proto.Unmarshal(a.GetValue(), st); err != nil {
			raw(out, a, indent, err)
			return
		}
		fmt.Fprintf(out, "%sa stored error, replayed to every duplicate:\n", indent)
		fmt.Fprintf(out, "%s  code: %s\n", indent, codes.Code(st.GetCode()))
		fmt.Fprintf(out, "%s  message: %s\n", indent, safe(st.GetMessage()))
		for _, d := range st.GetDetails() {
			fmt.Fprintf(out, "%s  detail:\n", indent)
			printMessage(out, d, resolver, indent+"    ")
		}
	case tooLargeName:
		marker := &idemgatev1.ResultTooLarge{}
		if err := proto.Unmarshal(a.GetValue(), marker); err != nil {
			raw(out, a, indent, err)
			return
		}
		why := "was over the size limit"
		if marker.GetCause() == idemgatev1.ResultTooLargeCause_RESULT_TOO_LARGE_CAUSE_STORED_BYTES_QUOTA {
			why = "was within the size limit but would have taken its caller over its stored-outcome quota (-caller-max-bytes)"
		}
		fmt.Fprintf(out, "%snot stored: the response (%s, %d bytes) %s; duplicates get IDEMPOTENCY_RESULT_TOO_LARGE\n",
			indent, safe(marker.GetTypeUrl()), marker.GetSizeBytes(), why)
	default:
		printMessage(out, a, resolver, indent)
	}
}

// printMessage prints one Any as protobuf JSON, or raw when its type is
// unknown or it does not decode.
func printMessage(out io.Writer, a *anypb.Any, resolver outcomejson.Resolver, indent string) {
	text, name, err := outcomejson.ToJSON(a, resolver)
	if errors.Is(err, protoregistry.NotFound) {
		raw(out, a, indent, errors.New("a type idemctl does not know; pass -descriptors set.binpb (buf build -o set.binpb)"))
		return
	}
	if err != nil {
		raw(out, a, indent, err)
		return
	}
	fmt.Fprintf(out, "%s%s\n", indent, safe(string(name)))
	for line := range strings.Lines(string(text)) {
		fmt.Fprintf(out, "%s%s\n", indent, safeLine(strings.TrimRight(line, "\n")))
	}
}

func raw(out io.Writer, a *anypb.Any, indent string, why error) {
	fmt.Fprintf(out, "%s%s (%d bytes: %s), base64:\n%s%s\n", indent, safe(a.GetTypeUrl()), len(a.GetValue()), safe(why.Error()),
		indent, base64.StdEncoding.EncodeToString(a.GetValue()))
}

// safeLine escapes what safe would in a line of JSON, keeping the printable
// non-ASCII runes the JSON already holds readable: protojson escapes C0
// controls, not C1 ones, which some terminals obey, nor format characters:
// the bidirectional embeddings, overrides and isolates (U+202A-U+202E,
// U+2066-U+2069) and marks that make a terminal show text in another order
// than its bytes, and zero-width ones; nor the line and paragraph
// separators.
func safeLine(s string) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || unicode.In(r, unicode.Zl, unicode.Zp) || r == unicode.ReplacementChar {
			fmt.Fprintf(&b, `\u%04x`, r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// typesResolver returns the types idemctl links (the example's, idemgate's,
// google.rpc's), and those of a FileDescriptorSet when one is given.
func typesResolver(descriptorFile string) (outcomejson.Resolver, error) {
	if descriptorFile == "" {
		return outcomejson.Types(nil), nil
	}
	files, err := outcomejson.ReadFile("-descriptors", descriptorFile)
	if err != nil {
		return nil, err
	}
	return outcomejson.Types(files), nil
}

// readTokenFile reads a bearer token from a file only its owner may read,
// as the service requires of its own token file.
func readTokenFile(path string) (string, error) {
	raw, err := tokenfile.ReadPrivate("-token-file", path, "the secret it sends")
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(raw))
	if token == "" || strings.ContainsAny(token, " \t\r\n") {
		return "", fmt.Errorf("-token-file %s must hold one token on one line", path)
	}
	return token, nil
}

// consequences says, per state, what forgetting a record does.
var consequences = map[string]string{
	"completed": "Its outcome is stored and replayed to every duplicate. Forgetting it makes the next call with this key run the side effect AGAIN (a second charge, a second e-mail), as for a key never seen.",
	"released":  "Its attempt gave the key up without a side effect. Forgetting it lets the key be used with another request.",
	"in_flight": "An attempt holds this key NOW and may be running its side effect. Forgetting it lets a duplicate run the side effect AGAIN, beside it; the holder's outcome will be refused and never replayed. Only with -force.",
	"unknown":   "Its side effect may or may not have happened. Prefer settling it: idemctl resolve. Forgetting it lets the next call run the side effect AGAIN. Only with -force.",
}

// forget shows the record and what forgetting it does, asks the operator
// to type its key (unless yes), and forgets it. Each RPC gets its own
// context from rpcCtx, made right before it: the operator's typing does
// not count against ForgetRecord's timeout. Force is sent only if asked
// for and the record shown needed it (in flight or outcome unknown), so a
// record that was settled when shown and changed while the operator typed
// is refused by the service, not forced away unseen; it is shown again.
func forget(rpcCtx func() (context.Context, context.CancelFunc), admin idemgatev1.AdminServiceClient, ref *idemgatev1.RecordRef, force, yes bool,
	stdin io.Reader, stdout, stderr io.Writer, fail func(error) int) int {
	if ref.GetScope() == "" || ref.GetKey() == "" {
		fmt.Fprintln(stderr, "idemctl forget: -scope and -key name the record (and -namespace, with authentication)")
		return 2
	}
	state, err := describeForForget(rpcCtx, admin, ref, stderr)
	if err != nil {
		return fail(err)
	}
	unsettled := state == "in_flight" || state == "unknown"
	if unsettled && !force {
		fmt.Fprintln(stderr, "idemctl: not forgotten: the record is "+state+"; pass -force to forget it anyway")
		return 1
	}
	if !yes {
		fmt.Fprintf(stderr, "Type the key (%s) to forget it: ", safe(ref.GetKey()))
		line, _ := bufio.NewReader(stdin).ReadString('\n')
		if strings.TrimRight(line, "\r\n") != ref.GetKey() {
			fmt.Fprintln(stderr, "\nidemctl: not forgotten: the answer was not the key")
			return 1
		}
	}
	ctx, cancel := rpcCtx()
	defer cancel()
	forgot, err := admin.ForgetRecord(ctx, &idemgatev1.ForgetRecordRequest{Ref: ref, Force: force && unsettled})
	if grpcerr.Reason(err) == dedupesvc.ReasonRecordNotSettled {
		fmt.Fprintf(stderr, "idemctl: not forgotten: the record changed since it was shown (it was %s); as it is now:\n", safe(state))
		if _, err := describeForForget(rpcCtx, admin, ref, stderr); err != nil {
			return fail(err)
		}
		fmt.Fprintln(stderr, "Run idemctl forget again to decide on it as it is now.")
		return 1
	}
	if err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "forgot %s %s %s (was %s, epoch %s): the next call with this key runs the side effect\n",
		safe(ref.GetNamespace()), safe(ref.GetScope()), safe(ref.GetKey()), safe(forgot.GetRecord().GetState()), strconv.FormatInt(forgot.GetRecord().GetEpoch(), 10))
	return 0
}

// describeForForget reads the record and prints it with what forgetting it
// does; it returns the record's state.
func describeForForget(rpcCtx func() (context.Context, context.CancelFunc), admin idemgatev1.AdminServiceClient, ref *idemgatev1.RecordRef, stderr io.Writer) (string, error) {
	ctx, cancel := rpcCtx()
	defer cancel()
	resp, err := admin.GetRecord(ctx, &idemgatev1.GetRecordRequest{Ref: ref})
	if err != nil {
		return "", err
	}
	r := resp.GetRecord()
	state := r.GetState()
	fmt.Fprintf(stderr, "record %s %s %s: %s, epoch %d, %d replays counted.\n%s\n", safe(ref.GetNamespace()), safe(ref.GetScope()), safe(ref.GetKey()),
		safe(state), r.GetEpoch(), r.GetReplayCount(), consequences[state])
	return state, nil
}
