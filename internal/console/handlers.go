package console

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/outcomejson"
)

// page is what every template gets: the layout's fields and the page's own
// in Data.
type page struct {
	Title    string
	Operator string
	CSRF     string
	Data     any
}

// render writes the page, rendered whole first so a template error is a
// 500, not half a page.
func (c *Console) render(w http.ResponseWriter, status int, name string, p page) {
	var buf bytes.Buffer
	if err := c.pages[name].Execute(&buf, p); err != nil {
		c.cfg.Logger.Error("console: rendering a page failed", slog.String("page", name), slog.Any("error", err))
		http.Error(w, "The console could not render this page; its log says why.", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// errorPage is the error template's data.
type errorPage struct {
	Status  int
	Message string
}

// fail answers with an error page saying what went wrong and what to do.
func (c *Console) fail(w http.ResponseWriter, _ *http.Request, op *operator, code int, title, message string) {
	p := page{Title: title, Data: errorPage{Status: code, Message: message}}
	if op != nil {
		p.Operator, p.CSRF = op.caller.Name, op.session.csrf
	}
	c.render(w, code, "error", p)
}

// apiFail answers with the admin API's error, as idemctl prints it, with
// what to do about it.
func (c *Console) apiFail(w http.ResponseWriter, r *http.Request, op operator, err error) {
	st := status.Convert(err)
	code, advice := http.StatusInternalServerError, "Check the service's log and its store's health, then try again."
	switch st.Code() {
	case codes.InvalidArgument:
		code, advice = http.StatusBadRequest, "Correct the address or form and try again."
	case codes.NotFound:
		code, advice = http.StatusNotFound, "It was never begun, has expired and been swept, or was forgotten. Look it up again from the overview."
	case codes.FailedPrecondition:
		code, advice = http.StatusConflict, "The record is not in the state this action needs. Open the record again to see it as it is now."
	case codes.Unimplemented:
		code, advice = http.StatusNotImplemented, "This service's store does not support it."
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable:
		code, advice = http.StatusServiceUnavailable, "The store did not answer in time; check its health and try again."
	}
	msg := st.Message()
	if reason := grpcerr.Reason(err); reason != "" {
		msg = reason + ": " + msg
	}
	if r.Context().Err() == nil {
		c.fail(w, r, &op, code, "The service refused: "+st.Code().String(), msg+". "+advice)
	}
}

// recordRow is one record as the pages list it.
type recordRow struct {
	Namespace, Scope, Method, Tenant, Key, State string
	Epoch, Replays                               int64
	// Since is when an outcome-unknown record's lease ran out: since then
	// it blocks its key. Age is how long ago.
	Since, Age string
	// Expires is when the record counts as absent.
	Expires string
	// LastReplay and ReplayAge: the last counted replay and how long after
	// completion it came.
	LastReplay, ReplayAge string
	// Query names the record in a link's query string.
	Query template.URL
}

func rowOf(r *idemgatev1.Record, now time.Time) recordRow {
	ref := r.GetRef()
	row := recordRow{Namespace: ref.GetNamespace(), Scope: ref.GetScope(), Method: dedupesvc.MethodOf(ref.GetScope()), Tenant: tenantOf(ref.GetScope()),
		Key: ref.GetKey(), State: r.GetState(), Epoch: r.GetEpoch(), Replays: r.GetReplayCount(),
		Expires: stamp(r.GetExpiresAt().AsTime()), Query: refQuery(ref)}
	if r.GetState() == dedupesvc.StateUnknown {
		since := r.GetLeaseExpiresAt().AsTime()
		row.Since, row.Age = stamp(since), age(now.Sub(since))
	}
	if r.GetLastReplayedAt() != nil {
		row.LastReplay = stamp(r.GetLastReplayedAt().AsTime())
		if r.GetCompletedAt() != nil {
			row.ReplayAge = age(r.GetLastReplayedAt().AsTime().Sub(r.GetCompletedAt().AsTime()))
		}
	}
	return row
}

func refQuery(ref *idemgatev1.RecordRef) template.URL {
	return template.URL(url.Values{"ns": {ref.GetNamespace()}, "scope": {ref.GetScope()}, "key": {ref.GetKey()}}.Encode()) // #nosec G203 -- built by url.Values.Encode
}

// refOf reads the record a request names (query or form); the admin API
// validates it.
func refOf(r *http.Request) *idemgatev1.RecordRef {
	return &idemgatev1.RecordRef{Namespace: r.FormValue("ns"), Scope: r.FormValue("scope"), Key: r.FormValue("key")}
}

// tenantOf is the tenant part of a scope ("method|tenant"), "" without one.
func tenantOf(scope string) string {
	_, tenant, _ := strings.Cut(scope, "|")
	return tenant
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

// age prints a duration to the second (milliseconds under one), as idemctl.
func age(d time.Duration) string {
	if d < time.Second && d > -time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// consequences says, per state, what forgetting a record does (idemctl
// forget says the same).
var consequences = map[string]string{
	dedupesvc.StateCompleted: "Its outcome is stored and replayed to every duplicate. Forgetting it makes the next call with this key run the side effect AGAIN (a second charge, a second e-mail), as for a key never seen.",
	dedupesvc.StateReleased:  "Its attempt gave the key up without a side effect. Forgetting it lets the key be used with another request.",
	dedupesvc.StateInFlight:  "An attempt holds this key NOW and may be running its side effect. Forgetting it lets a duplicate run the side effect AGAIN, beside it; the holder's outcome will be refused and never replayed.",
	dedupesvc.StateUnknown:   "Its side effect may or may not have happened. Prefer settling it (Resolve). Forgetting it lets the next call run the side effect AGAIN.",
}

func consequence(state string) string { return consequences[state] }

func unsettled(state string) bool {
	return state == dedupesvc.StateInFlight || state == dedupesvc.StateUnknown
}

// --- sign-in ---

type loginPage struct {
	LoginCSRF string
	// CertIdentity is the admin identity of the request's client
	// certificate, when it has one: signing in needs no token then.
	CertIdentity string
	Error        string
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.showLogin(w, r, http.StatusOK, "")
}

// showLogin renders the sign-in form with a fresh pre-session CSRF token,
// kept in a cookie the POST must match (double submit): a sign-in cannot be
// forged from another site.
func (c *Console) showLogin(w http.ResponseWriter, r *http.Request, code int, msg string) {
	token := randomToken()
	c.setCookie(w, r, "idemgate_console_login", token, 600)
	c.render(w, code, "login", page{Title: "Sign in", Data: loginPage{LoginCSRF: token, CertIdentity: c.certAdmin(r), Error: msg}})
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, nil, http.StatusBadRequest, "Unreadable form", "The sign-in form could not be read ("+err.Error()+"). Open the sign-in page again.")
		return
	}
	ck, err := r.Cookie(c.cookieName(r, "idemgate_console_login"))
	if err != nil || !equal(r.PostForm.Get("login_csrf"), ck.Value) {
		c.fail(w, r, nil, http.StatusForbidden, "Form refused", "The sign-in form did not come from this console's sign-in page (or that page is older than 10 minutes). Open the sign-in page again.")
		return
	}
	token := strings.TrimSpace(r.PostForm.Get("token"))
	if token == "" && c.certAdmin(r) == "" {
		c.showLogin(w, r, http.StatusBadRequest, "Paste a bearer token with the admin role from the service's token file.")
		return
	}
	caller, err := c.cfg.Authenticator.Authenticate(credentialContext(r, token))
	switch {
	case err != nil:
		c.refusedLogin(r, "invalid_token", "")
		c.showLogin(w, r, http.StatusForbidden, "This token is not accepted by the service: it is not in its token file (or was removed). Check the token and try again.")
		return
	case !caller.Admin:
		c.refusedLogin(r, "not_admin", caller.Name)
		c.showLogin(w, r, http.StatusForbidden, fmt.Sprintf("%q has no admin right: the console needs a token whose role is admin in the token file (or an admin client certificate).", caller.Name))
		return
	}
	s := c.sessions.start(caller.Name, token)
	c.setCookie(w, r, "idemgate_console", s.id, int(c.cfg.SessionMaxAge/time.Second))
	c.setCookie(w, r, "idemgate_console_login", "", -1)
	c.cfg.Logger.InfoContext(r.Context(), "console: operator signed in", slog.String("by", caller.Name), slog.String("remote", r.RemoteAddr))
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// refusedLogin logs a refused sign-in (never the token), at most a line a
// second in bursts of 10.
func (c *Console) refusedLogin(r *http.Request, reason, name string) {
	if !c.loginLog.Allow() {
		return
	}
	c.cfg.Logger.WarnContext(r.Context(), "console: sign-in refused", slog.String("reason", reason), slog.String("caller", name), slog.String("remote", r.RemoteAddr))
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, op operator) {
	c.sessions.end(op.session.id)
	c.setCookie(w, r, "idemgate_console", "", -1)
	c.cfg.Logger.InfoContext(r.Context(), "console: operator signed out", slog.String("by", op.caller.Name))
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

func (c *Console) page(op operator, title string, data any) page {
	return page{Title: title, Operator: op.caller.Name, CSRF: op.session.csrf, Data: data}
}

// adminContext is the request's context carrying the operator as the
// caller, as the gRPC server's authentication puts it there: the admin
// API's own log lines (a forget's warning) name the operator.
func adminContext(r *http.Request, op operator) context.Context {
	return dedupesvc.ContextWithCaller(r.Context(), op.caller)
}

// --- overview ---

// methodRow counts one method's records by state.
type methodRow struct {
	Method                                 string
	InFlight, Completed, Released, Unknown int64
}

type overviewPage struct {
	// Counted says when the counts were made and how long that took;
	// CountError why the last recount failed, when it did.
	Counted, CountError string
	// MaxAge is Config.CountsMaxAge.
	MaxAge time.Duration
	// Health is the store's health as the page is, nil when unknown.
	Health      *healthRow
	Totals      methodRow
	Methods     []methodRow
	Unknown     []recordRow
	UnknownMore bool
	Replayed    []recordRow
	ReplayedOld []recordRow
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, op operator) {
	ctx := adminContext(r, op)
	now := time.Now()
	snap, err := c.counts.get(ctx)
	if err != nil {
		c.apiFail(w, r, op, err)
		return
	}
	data := overviewPage{Counted: fmt.Sprintf("%s (%s ago, in %s)", stamp(snap.At), age(time.Since(snap.At)), age(snap.Took)), MaxAge: max(c.cfg.CountsMaxAge, 0)}
	if snap.Err != nil {
		data.CountError = "The last recount failed (" + status.Convert(snap.Err).Message() + "): these counts are older. Check the store's health; the next page opened tries again."
	}
	data.Health = c.storeHealth(r.Context())
	byMethod := map[string]*methodRow{}
	for _, n := range snap.Counts.GetCounts() {
		m := byMethod[n.GetMethod()]
		if m == nil {
			data.Methods = append(data.Methods, methodRow{Method: n.GetMethod()})
			m = &data.Methods[len(data.Methods)-1]
			byMethod[n.GetMethod()] = m
		}
		add(m, n.GetState(), n.GetCount())
		add(&data.Totals, n.GetState(), n.GetCount())
	}
	// Counts come sorted by state then method; the table is by method.
	data.Methods = sortedMethods(byMethod)
	unknown, err := c.cfg.Admin.ListRecords(ctx, &idemgatev1.ListRecordsRequest{State: dedupesvc.StateUnknown, Limit: 20})
	if err != nil {
		c.apiFail(w, r, op, err)
		return
	}
	for _, rec := range unknown.GetRecords() {
		data.Unknown = append(data.Unknown, rowOf(rec, now))
	}
	data.UnknownMore = unknown.GetNextPageToken() != ""
	for order, rows := range map[idemgatev1.RecordOrder]*[]recordRow{idemgatev1.RecordOrder_RECORD_ORDER_REPLAYS: &data.Replayed, idemgatev1.RecordOrder_RECORD_ORDER_REPLAY_AGE: &data.ReplayedOld} {
		resp, err := c.cfg.Admin.ListRecords(ctx, &idemgatev1.ListRecordsRequest{Order: order, Limit: 5})
		if err != nil {
			c.apiFail(w, r, op, err)
			return
		}
		for _, rec := range resp.GetRecords() {
			*rows = append(*rows, rowOf(rec, now))
		}
	}
	c.render(w, http.StatusOK, "overview", c.page(op, "Overview", data))
}

func add(m *methodRow, state string, n int64) {
	switch state {
	case dedupesvc.StateInFlight:
		m.InFlight += n
	case dedupesvc.StateCompleted:
		m.Completed += n
	case dedupesvc.StateReleased:
		m.Released += n
	case dedupesvc.StateUnknown:
		m.Unknown += n
	}
}

// sortedMethods lists the rows with outcome-unknown records first (most
// first), then by method name.
func sortedMethods(byMethod map[string]*methodRow) []methodRow {
	rows := make([]methodRow, 0, len(byMethod))
	for _, m := range byMethod {
		rows = append(rows, *m)
	}
	slicesSortFunc(rows)
	return rows
}

// --- lists ---

// orders maps the list's order parameter to the admin API's, as idemctl
// list -sort does.
var orders = map[string]idemgatev1.RecordOrder{
	"":           idemgatev1.RecordOrder_RECORD_ORDER_UNSPECIFIED,
	"expiry":     idemgatev1.RecordOrder_RECORD_ORDER_UNSPECIFIED,
	"replays":    idemgatev1.RecordOrder_RECORD_ORDER_REPLAYS,
	"replay-age": idemgatev1.RecordOrder_RECORD_ORDER_REPLAY_AGE,
}

type recordsPage struct {
	State, Order string
	Records      []recordRow
	// Next continues the listing after this page, First starts it again;
	// both are query strings.
	Next, First template.URL
	Paged       bool
}

func (c *Console) records(w http.ResponseWriter, r *http.Request, op operator) {
	q := r.URL.Query()
	state, orderName := q.Get("state"), q.Get("order")
	order, ok := orders[orderName]
	if !ok {
		c.fail(w, r, &op, http.StatusBadRequest, "Unknown order", fmt.Sprintf("order %q is not expiry, replays or replay-age. Choose one from the list page.", orderName))
		return
	}
	resp, err := c.cfg.Admin.ListRecords(adminContext(r, op), &idemgatev1.ListRecordsRequest{State: state, Order: order, Limit: PageSize, PageToken: q.Get("page")})
	if err != nil {
		c.apiFail(w, r, op, err)
		return
	}
	now := time.Now()
	data := recordsPage{State: state, Order: orderName, Paged: q.Get("page") != ""}
	for _, rec := range resp.GetRecords() {
		data.Records = append(data.Records, rowOf(rec, now))
	}
	base := url.Values{}
	if state != "" {
		base.Set("state", state)
	}
	if orderName != "" {
		base.Set("order", orderName)
	}
	data.First = template.URL(base.Encode())
	if resp.GetNextPageToken() != "" {
		next := url.Values{"page": {resp.GetNextPageToken()}}
		for k, v := range base {
			next[k] = v
		}
		data.Next = template.URL(next.Encode())
	}
	c.render(w, http.StatusOK, "records", c.page(op, "Records", data))
}

// --- one record ---

type recordPage struct {
	Row         recordRow
	Record      *idemgatev1.Record
	OutcomeType string
	Lease       string
	Completed   string
	Outcome     string
	// OutcomeNote says how Outcome is shown (JSON, or base64 when its type
	// is unknown to the service) or why it cannot be.
	OutcomeNote string
	LastReplay  string
	Unsettled   bool
	// Complete is how the resolve page offers to complete the record.
	Complete completeOffer
}

// completeOffer is what the resolve page says about completing a record
// with an outcome typed as JSON.
type completeOffer struct {
	// Descriptors reports whether the console has Config.Descriptors.
	Descriptors bool
	// Type is the full name of the message the JSON is of; empty when the
	// console cannot encode this record's outcome, and Why says why.
	Type, Why string
}

func (c *Console) getRecord(w http.ResponseWriter, r *http.Request, op operator, withOutcome bool) (*idemgatev1.Record, bool) {
	resp, err := c.cfg.Admin.GetRecord(adminContext(r, op), &idemgatev1.GetRecordRequest{Ref: refOf(r), IncludeOutcome: withOutcome})
	if err != nil {
		c.apiFail(w, r, op, err)
		return nil, false
	}
	return resp.GetRecord(), true
}

func (c *Console) recordData(rec *idemgatev1.Record, now time.Time) recordPage {
	d := recordPage{Row: rowOf(rec, now), Record: rec, Lease: stamp(rec.GetLeaseExpiresAt().AsTime()), Completed: "-", LastReplay: "-",
		Unsettled: unsettled(rec.GetState())}
	if rec.GetOutcomeTypeUrl() == "" && rec.GetOutcomeSize() == 0 {
		d.OutcomeType = "- (no outcome stored)"
	} else {
		d.OutcomeType = fmt.Sprintf("%s (%d bytes)", rec.GetOutcomeTypeUrl(), rec.GetOutcomeSize())
	}
	if rec.GetCompletedAt() != nil {
		d.Completed = fmt.Sprintf("%s (%s ago)", stamp(rec.GetCompletedAt().AsTime()), age(now.Sub(rec.GetCompletedAt().AsTime())))
	}
	if rec.GetLastReplayedAt() != nil {
		last := rec.GetLastReplayedAt().AsTime()
		d.LastReplay = fmt.Sprintf("%s (%s ago, %s after completion)", stamp(last), age(now.Sub(last)), d.Row.ReplayAge)
	}
	switch {
	case rec.GetOutcome() != nil:
		d.Outcome, d.OutcomeNote = c.outcomeText(rec.GetOutcome())
	case rec.GetOutcomeError() != "":
		// Sealed under a key the service has not loaded: it stays so.
		d.OutcomeNote = "The stored outcome cannot be read: " + rec.GetOutcomeError()
	}
	return d
}

// maxOutcomeShown bounds the base64 shown of an outcome whose type the
// service does not know.
const maxOutcomeShown = 4096

// outcomeText is the stored outcome as JSON when its types are known to the
// console (the service's own, the well-known ones, Config.Descriptors'),
// else as base64.
func (c *Console) outcomeText(a *anypb.Any) (text, note string) {
	if b, _, err := outcomejson.ToJSON(a, c.types); err == nil {
		return string(b), "as every duplicate receives it, decoded to JSON:"
	}
	b64 := base64.StdEncoding.EncodeToString(a.GetValue())
	hint := "the service was started without -console-descriptors; idemctl show -descriptors decodes it"
	if c.cfg.Descriptors != nil {
		hint = "they are not in -console-descriptors, or it does not decode as them; idemctl show -descriptors with a newer set may decode it"
	}
	note = fmt.Sprintf("as every duplicate receives it: %s, %d bytes, base64 (its types are not known to the console: %s):", a.GetTypeUrl(), len(a.GetValue()), hint)
	if len(b64) > maxOutcomeShown {
		b64, note = b64[:maxOutcomeShown]+"…", note+" (cut at 4096 characters)"
	}
	return b64, note
}

func (c *Console) record(w http.ResponseWriter, r *http.Request, op operator) {
	rec, ok := c.getRecord(w, r, op, true)
	if !ok {
		return
	}
	c.render(w, http.StatusOK, "record", c.page(op, "Record "+rec.GetRef().GetKey(), c.recordData(rec, time.Now())))
}

// --- actions ---

func (c *Console) resolvePage(w http.ResponseWriter, r *http.Request, op operator) {
	rec, ok := c.getRecord(w, r, op, false)
	if !ok {
		return
	}
	d := c.recordData(rec, time.Now())
	d.Complete.Descriptors = c.cfg.Descriptors != nil
	if md, err := c.outcomeType(rec); err != nil {
		d.Complete.Why = err.Error()
	} else {
		d.Complete.Type = string(md.FullName())
	}
	c.render(w, http.StatusOK, "resolve", c.page(op, "Resolve "+rec.GetRef().GetKey(), d))
}

// errNoDescriptors is why a console without Config.Descriptors does not
// complete records.
var errNoDescriptors = errors.New("the service was started without -console-descriptors, so the console does not know the types of its tool servers' responses")

// outcomeType is the message an outcome completing rec must be: the type of
// the record's stored outcome when it has one, else the response of the
// record's method (its scope up to "|") as Config.Descriptors describe it.
func (c *Console) outcomeType(rec *idemgatev1.Record) (protoreflect.MessageDescriptor, error) {
	if c.cfg.Descriptors == nil {
		return nil, errNoDescriptors
	}
	if u := rec.GetOutcomeTypeUrl(); u != "" {
		mt, err := c.types.FindMessageByURL(u)
		if err != nil {
			return nil, fmt.Errorf("the record's stored outcome type %s is neither the service's nor in -console-descriptors", u)
		}
		return mt.Descriptor(), nil
	}
	method := dedupesvc.MethodOf(rec.GetRef().GetScope())
	md, err := outcomejson.ResponseType(c.cfg.Descriptors, method)
	if err != nil {
		return nil, fmt.Errorf("the record's method %s is not in -console-descriptors (%v): give the service a set with its service (buf build -o set.binpb), or, for a scope named by a policy's action rather than a method, use idemctl resolve -complete-json", method, err)
	}
	return md, nil
}

// donePage reports an action's result.
type donePage struct {
	Message string
	Query   template.URL
}

func (c *Console) resolve(w http.ResponseWriter, r *http.Request, op operator) {
	ref := refOf(r)
	switch r.PostForm.Get("resolution") {
	case "release":
	case "complete":
		c.complete(w, r, op)
		return
	default:
		c.fail(w, r, &op, http.StatusBadRequest, "Not resolved", "The form asked for no resolution the console knows (release or complete): nothing was changed. Open the record's resolve page again.")
		return
	}
	_, err := c.cfg.Admin.ResolveRecord(adminContext(r, op), &idemgatev1.ResolveRecordRequest{Ref: ref,
		Resolution: &idemgatev1.ResolveRecordRequest_Release_{Release: &idemgatev1.ResolveRecordRequest_Release{}}})
	c.audit(r, op, "resolve_release", ref, err)
	if err != nil {
		c.apiFail(w, r, op, err)
		return
	}
	c.render(w, http.StatusOK, "done", c.page(op, "Released", donePage{
		Message: fmt.Sprintf("Released %s %s: the side effect counts as not having happened, and the next call with this key runs it.", ref.GetScope(), ref.GetKey()),
		Query:   refQuery(ref)}))
}

// completePage is the confirmation of a complete: the outcome as it will be
// stored, and what storing it does.
type completePage struct {
	recordPage
	// Type is the outcome's message, TypeURL the type URL it is stored
	// under, Size its bytes.
	Type, TypeURL string
	Size          int
	// JSON is the outcome as parsed, laid out again; Compact the same on
	// one line, posted back by the confirmation.
	JSON, Compact string
}

// complete completes an outcome-unknown record with the outcome its form
// gives as JSON of the record's outcome type (outcomeType). Without
// confirm=yes it only shows the outcome as parsed with the consequence,
// and a form to confirm it; with it, it resolves the record. JSON that is
// not of the type, or a type the console cannot find, is refused (400)
// with nothing changed.
func (c *Console) complete(w http.ResponseWriter, r *http.Request, op operator) {
	if c.cfg.Descriptors == nil {
		c.fail(w, r, &op, http.StatusBadRequest, "Not resolved", errNoDescriptors.Error()+": nothing was changed. Complete the record with idemctl resolve -complete-json (with -descriptors), or restart the service with -console-descriptors.")
		return
	}
	ref := refOf(r)
	rec, ok := c.getRecord(w, r, op, false)
	if !ok {
		return
	}
	confirmed := r.PostForm.Get("confirm") == "yes"
	// The admin API refuses a settled record too; before the confirmation
	// the operator is told so rather than asked to confirm the impossible.
	if !confirmed && rec.GetState() != dedupesvc.StateUnknown {
		c.fail(w, r, &op, http.StatusConflict, "Not resolved", fmt.Sprintf("The record is %s, not outcome-unknown: only an outcome-unknown record can be completed. Nothing was changed.", rec.GetState()))
		return
	}
	md, err := c.outcomeType(rec)
	if err != nil {
		c.fail(w, r, &op, http.StatusBadRequest, "Not resolved", "The console cannot encode this record's outcome: "+err.Error()+". Nothing was changed.")
		return
	}
	outcome, err := outcomejson.FromJSON(md, []byte(r.PostForm.Get("outcome_json")), c.types)
	if err != nil {
		c.fail(w, r, &op, http.StatusBadRequest, "Outcome refused", "The outcome is "+err.Error()+". Nothing was changed: go back, correct the JSON and review it again.")
		return
	}
	if !confirmed {
		text, _, err := outcomejson.ToJSON(outcome, c.types)
		var compact bytes.Buffer
		if err == nil {
			err = json.Compact(&compact, text)
		}
		if err != nil {
			c.fail(w, r, &op, http.StatusBadRequest, "Outcome refused", "The outcome does not read back as JSON ("+err.Error()+"). Nothing was changed.")
			return
		}
		c.render(w, http.StatusOK, "complete", c.page(op, "Complete "+rec.GetRef().GetKey(), completePage{recordPage: c.recordData(rec, time.Now()),
			Type: string(md.FullName()), TypeURL: outcome.GetTypeUrl(), Size: len(outcome.GetValue()), JSON: string(text), Compact: compact.String()}))
		return
	}
	// What was confirmed is what is stored: a type that changed since (a
	// record stored with another type meanwhile) is reviewed again.
	if shown := r.PostForm.Get("type_url"); shown != outcome.GetTypeUrl() {
		c.fail(w, r, &op, http.StatusConflict, "Not resolved", fmt.Sprintf("The outcome would now be stored as %s, not %s as confirmed: nothing was changed. Open the record's resolve page again.", outcome.GetTypeUrl(), shown))
		return
	}
	_, err = c.cfg.Admin.ResolveRecord(adminContext(r, op), &idemgatev1.ResolveRecordRequest{Ref: ref,
		Resolution: &idemgatev1.ResolveRecordRequest_Complete{Complete: outcome}})
	c.audit(r, op, "resolve_complete", ref, err, slog.String("type_url", outcome.GetTypeUrl()), slog.Int("outcome_bytes", len(outcome.GetValue())))
	if err != nil {
		c.apiFail(w, r, op, err)
		return
	}
	c.render(w, http.StatusOK, "done", c.page(op, "Completed", donePage{
		Message: fmt.Sprintf("Completed %s %s with a %s (%d bytes): the side effect counts as having happened; every retry with this key gets this outcome, and the side effect does not run again for it.",
			ref.GetScope(), ref.GetKey(), md.FullName(), len(outcome.GetValue())),
		Query: refQuery(ref)}))
}

func (c *Console) forgetPage(w http.ResponseWriter, r *http.Request, op operator) {
	rec, ok := c.getRecord(w, r, op, false)
	if !ok {
		return
	}
	c.render(w, http.StatusOK, "forget", c.page(op, "Forget "+rec.GetRef().GetKey(), c.recordData(rec, time.Now())))
}

func (c *Console) forget(w http.ResponseWriter, r *http.Request, op operator) {
	ref := refOf(r)
	shown := r.PostForm.Get("shown_state")
	// Force only when asked for and the record shown needed it, as idemctl:
	// a record settled when shown that changed since is refused by the
	// service, not forced away unseen.
	force := r.PostForm.Get("force") == "yes" && unsettled(shown)
	resp, err := c.cfg.Admin.ForgetRecord(adminContext(r, op), &idemgatev1.ForgetRecordRequest{Ref: ref, Force: force})
	c.audit(r, op, "forget", ref, err, slog.Bool("forced", force))
	if grpcerr.Reason(err) == dedupesvc.ReasonRecordNotSettled {
		c.fail(w, r, &op, http.StatusConflict, "Not forgotten", "Nothing was changed: "+status.Convert(err).Message()+
			". The record was "+shown+" when its forget page showed it; open that page again to decide on it as it is now (Force forgets an unsettled record).")
		return
	}
	if err != nil {
		c.apiFail(w, r, op, err)
		return
	}
	c.render(w, http.StatusOK, "done", c.page(op, "Forgotten", donePage{
		Message: fmt.Sprintf("Forgot %s %s (was %s, epoch %d): the next call with this key runs the side effect.", ref.GetScope(), ref.GetKey(),
			resp.GetRecord().GetState(), resp.GetRecord().GetEpoch()),
		Query: refQuery(ref)}))
}

// audit writes the one line an action leaves: who did what to which
// record, and how it ended.
func (c *Console) audit(r *http.Request, op operator, action string, ref *idemgatev1.RecordRef, err error, extra ...any) {
	level, result := slog.LevelInfo, "ok"
	if err != nil {
		level, result = slog.LevelWarn, "refused: "+status.Convert(err).Message()
	}
	args := append([]any{slog.String("by", op.caller.Name), slog.String("action", action), slog.String("namespace", ref.GetNamespace()),
		slog.String("scope", ref.GetScope()), slog.String("key", ref.GetKey()), slog.String("result", result), slog.String("remote", r.RemoteAddr)}, extra...)
	c.cfg.Logger.Log(context.WithoutCancel(r.Context()), level, "console: operator action", args...)
}

func slicesSortFunc(rows []methodRow) {
	slices.SortFunc(rows, func(a, b methodRow) int {
		if a.Unknown != b.Unknown {
			return cmp.Compare(b.Unknown, a.Unknown)
		}
		return strings.Compare(a.Method, b.Method)
	})
}
