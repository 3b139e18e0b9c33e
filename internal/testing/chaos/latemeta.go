package chaos

import (
	"bytes"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	testingv1 "github.com/idemgate/idemgate/gen/idemgate/testing/v1"
)

// A caller that gives up before its handler sets response metadata: the
// handler's context is detached from the caller's, so it runs on, and the
// header and trailer it sets once the caller has gone (which grpc-go
// refuses on the finished stream) must still be stored with the outcome and
// replayed to every duplicate, byte for byte.

// LateMetadataSuffix ends the key of an action whose handler, after its
// side effect, waits until its caller has given up and only then sets its
// response metadata; every caller of such an action gives up on its first
// try as soon as the side effect is in a ledger.
const LateMetadataSuffix = "-m"

// The response metadata a late-metadata handler sets, both derived from its
// response so the checker knows what every answer must carry.
const (
	// MetadataPrefix starts every key the chaos tool sets; the workload
	// records those.
	MetadataPrefix = "x-chaos-"
	// ChargeIDHeader is a header: the response's charge_id.
	ChargeIDHeader = MetadataPrefix + "charge-id"
	// ResponseTrailer is a binary trailer: the response's wire bytes.
	ResponseTrailer = MetadataPrefix + "response-bin"
)

// checkMetadata holds every OK answer of a late-metadata action to the
// metadata its handler set: the charge id header and the response trailer,
// byte for byte, on a replay as on the first answer.
func (r *Report) checkMetadata(key string, f *actionFacts) {
	if !strings.HasSuffix(key, LateMetadataSuffix) {
		return
	}
	r.LateMetadataActions++
	for _, e := range f.ends {
		if e.CallerGone {
			r.LateMetadataRuns++
		}
	}
	for _, a := range f.attempts {
		if a.Code == "Canceled" && a.Attempt == 1 {
			r.GaveUp++
		}
	}
	for _, a := range f.attempts {
		if a.Code != "OK" {
			continue
		}
		resp := &testingv1.ChargeResponse{}
		if err := proto.Unmarshal(a.Response, resp); err != nil {
			continue // a phantom: checkAction reports it
		}
		header, trailer := a.Header[ChargeIDHeader], a.Trailer[ResponseTrailer]
		if len(header) == 1 && bytes.Equal(header[0], []byte(resp.GetChargeId())) && len(trailer) == 1 && bytes.Equal(trailer[0], a.Response) {
			continue
		}
		r.MissingMetadata++
		r.violate("%s: caller %d got an OK (attempt %d, try %d, replayed %t) without the metadata its handler set: header %s %q, trailer %s %d values",
			key, a.Caller, a.Attempt, a.Try, a.Replayed, ChargeIDHeader, header, ResponseTrailer, len(trailer))
		return
	}
}

// metadataLine is the report's line about late-metadata actions, empty
// when the scenario had none.
func (r *Report) metadataLine() string {
	if r.LateMetadataActions == 0 {
		return ""
	}
	return fmt.Sprintf("  late-metadata actions %d, first tries given up %d, handlers that set metadata after their caller left %d, answers without it %d\n",
		r.LateMetadataActions, r.GaveUp, r.LateMetadataRuns, r.MissingMetadata)
}

// checkMetadataCoverage fails a run with late-metadata actions none of
// whose handlers set its metadata after its caller left: it tested nothing.
func (r *Report) checkMetadataCoverage() {
	if r.LateMetadataActions > 0 && r.LateMetadataRuns == 0 {
		r.violate("%d late-metadata actions, but no handler set its metadata after its caller gave up: the run did not test it", r.LateMetadataActions)
	}
}
