package console_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/internal/console"
)

func TestSignInNeedsTheAdminRole(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := f.browser(t)

	if resp, _ := b.get("/"); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
		t.Fatalf("overview without a session: %s to %q, want 303 to /login", resp.Status, resp.Header.Get("Location"))
	}
	resp, page := b.login(clientToken)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(page, "no admin right") {
		t.Fatalf("client-role token: %s, want 403 saying it has no admin right:\n%s", resp.Status, page)
	}
	if resp, _ := b.get("/"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("overview after a refused sign-in: %s, want a redirect to sign in", resp.Status)
	}
	resp, page = b.login("not-a-token-of-this-service")
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(page, "not accepted") {
		t.Fatalf("unknown token: %s, want 403:\n%s", resp.Status, page)
	}
	// A sign-in form not from the console's own page is refused.
	resp, _ = f.browser(t).post("/login", url.Values{"token": {adminToken}})
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("sign-in without the login form's token: %s, want 403", resp.Status)
	}
	if !strings.Contains(f.logs.String(), `"msg":"console: sign-in refused","reason":"not_admin","caller":"tools"`) {
		t.Errorf("the refused sign-in is not logged:\n%s", f.logs)
	}
	if strings.Contains(f.logs.String(), clientToken) {
		t.Errorf("a token is in the log:\n%s", f.logs)
	}

	resp, page = b.login(adminToken)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("admin token: %s, want 303 to /:\n%s", resp.Status, page)
	}
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "idemgate_console" {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Path != "/" || len(cookie.Value) < 40 {
		t.Fatalf("session cookie %+v: want a random HttpOnly, SameSite=Strict cookie", cookie)
	}
	resp, page = b.get("/")
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "Outcome unknown") || !strings.Contains(page, "oncall") {
		t.Fatalf("overview: %s\n%s", resp.Status, page)
	}

	// The token's admin right removed from the token file: the session ends
	// at its next request.
	if err := f.authn.SetTokens([]auth.Token{{Name: "oncall", Secret: adminToken}}); err != nil {
		t.Fatal(err)
	}
	resp, page = b.get("/")
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(page, "no longer accepted") {
		t.Fatalf("overview after the admin right was removed: %s, want 403:\n%s", resp.Status, page)
	}
}

func TestPostWithoutTheSessionsCSRFTokenIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.completed(t, "paid-1")
	f.unknown(t, "blocked-1")
	b := f.browser(t)
	csrf := b.signedIn()

	other := f.browser(t)
	otherCSRF := other.signedIn() // a valid token, of another session
	for name, token := range map[string]string{"none": "", "wrong": "x" + csrf, "another session's": otherCSRF} {
		form := refForm("paid-1")
		if token != "" {
			form.Set("csrf", token)
		}
		resp, page := b.post("/forget", form)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(page, "CSRF") {
			t.Errorf("forget with %s CSRF token: %s, want 403 naming the CSRF token:\n%s", name, resp.Status, page)
		}
		form = refForm("blocked-1")
		form.Set("resolution", "release")
		if token != "" {
			form.Set("csrf", token)
		}
		if resp, _ := b.post("/resolve", form); resp.StatusCode != http.StatusForbidden {
			t.Errorf("resolve with %s CSRF token: %s, want 403", name, resp.Status)
		}
	}
	if got := f.state(t, "paid-1"); got != "completed" {
		t.Errorf("paid-1 is %s after refused forgets, want completed", got)
	}
	if got := f.state(t, "blocked-1"); got != "unknown" {
		t.Errorf("blocked-1 is %s after refused resolves, want unknown", got)
	}
	// Without a session at all a POST is refused, not redirected.
	form := refForm("paid-1")
	form.Set("csrf", csrf)
	if resp, _ := f.browser(t).post("/forget", form); resp.StatusCode != http.StatusForbidden {
		t.Errorf("forget without a session: %s, want 403", resp.Status)
	}
	if strings.Contains(f.logs.String(), "console: operator action") {
		t.Errorf("a refused form left an audit line:\n%s", f.logs)
	}
}

func TestResolveAndForgetChangeTheRecord(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.completed(t, "paid-1")
	f.unknown(t, "blocked-1")
	f.unknown(t, "blocked-2")
	b := f.browser(t)
	csrf := b.signedIn()

	_, overview := b.get("/")
	if !strings.Contains(overview, "blocked-1") || !strings.Contains(overview, `id="total-unknown"><a href="/records?state=unknown">2</a>`) {
		t.Fatalf("the overview does not list the outcome-unknown records:\n%s", overview)
	}
	resp, page := b.get("/resolve?" + refForm("blocked-1").Encode())
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "Release says the side effect did NOT happen") {
		t.Fatalf("resolve confirmation: %s\n%s", resp.Status, page+"\n"+f.logs.String())
	}
	form := refForm("blocked-1")
	form.Set("csrf", csrf)
	form.Set("resolution", "release")
	resp, page = b.post("/resolve", form)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "Released") {
		t.Fatalf("resolve: %s\n%s", resp.Status, page)
	}
	if got := f.state(t, "blocked-1"); got != "released" {
		t.Errorf("blocked-1 is %s after release, want released", got)
	}
	if !strings.Contains(f.logs.String(), `"msg":"console: operator action","by":"oncall","action":"resolve_release","namespace":"tools","scope":"`+strings.ReplaceAll(scope, "/", "/")+`","key":"blocked-1","result":"ok"`) {
		t.Errorf("no audit line for the release:\n%s", f.logs)
	}
	// Resolving a record that is not outcome-unknown: the admin API's
	// refusal, shown.
	form.Set("key", "paid-1")
	resp, page = b.post("/resolve", form)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(page, "RECORD_NOT_UNKNOWN") {
		t.Errorf("resolving a completed record: %s, want 409 with the service's reason:\n%s", resp.Status, page)
	}

	resp, page = b.get("/forget?" + refForm("paid-1").Encode())
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "the next call with it runs the side effect again") || strings.Contains(page, `name="force"`) {
		t.Fatalf("forget confirmation of a completed record: %s\n%s", resp.Status, page)
	}
	form = refForm("paid-1")
	form.Set("csrf", csrf)
	form.Set("shown_state", "completed")
	form.Set("force", "yes") // ignored: the record shown was settled
	resp, page = b.post("/forget", form)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "Forgot") || !strings.Contains(page, "was completed") {
		t.Fatalf("forget: %s\n%s", resp.Status, page)
	}
	if !f.runsAgain(t, "paid-1") {
		t.Errorf("paid-1 forgotten, but the next call does not run again")
	}
	if !strings.Contains(f.logs.String(), `"action":"forget","namespace":"tools"`) || !strings.Contains(f.logs.String(), `"key":"paid-1","result":"ok","remote":`) {
		t.Errorf("no audit line for the forget:\n%s", f.logs)
	}
	// The admin API's own forget warning names the operator too.
	if !strings.Contains(f.logs.String(), `"by":"oncall","namespace":"tools","scope":"`+scope+`","key":"paid-1","state":"completed"`) {
		t.Errorf("the service's forget warning does not name the operator:\n%s", f.logs)
	}

	// An outcome-unknown record is forgotten only with force, as idemctl.
	_, page = b.get("/forget?" + refForm("blocked-2").Encode())
	if !strings.Contains(page, `name="force"`) {
		t.Fatalf("the forget page of an outcome-unknown record offers no force:\n%s", page)
	}
	form = refForm("blocked-2")
	form.Set("csrf", csrf)
	form.Set("shown_state", "unknown")
	resp, page = b.post("/forget", form)
	if resp.StatusCode != http.StatusConflict || f.state(t, "blocked-2") != "unknown" {
		t.Fatalf("forget of an outcome-unknown record without force: %s (record %s), want 409 and no change:\n%s", resp.Status, f.state(t, "blocked-2"), page)
	}
	if !strings.Contains(f.logs.String(), `"key":"blocked-2","result":"refused:`) {
		t.Errorf("no audit line for the refused forget:\n%s", f.logs)
	}
	form.Set("force", "yes")
	if resp, page = b.post("/forget", form); resp.StatusCode != http.StatusOK || !f.runsAgain(t, "blocked-2") {
		t.Fatalf("forced forget: %s\n%s", resp.Status, page)
	}
}

func TestRecordPageShowsWhatIdemctlShows(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.completed(t, "paid-1")
	b := f.browser(t)
	b.signedIn()
	resp, page := b.get("/record?" + refForm("paid-1").Encode())
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("record page: %s\n%s", resp.Status, page)
	}
	for _, want := range []string{"completed", "acme", "/payments.v1.Payments/Charge", "type.googleapis.com/google.protobuf.StringValue", "expires_at", "replays", "charged paid-1"} {
		if !strings.Contains(page, want) {
			t.Errorf("the record page lacks %q:\n%s", want, page)
		}
	}
	// The admin API validates what the address names.
	resp, page = b.get("/record?scope=&key=x")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(page, "scope is required") {
		t.Errorf("record without a scope: %s, want 400 with the admin API's message:\n%s", resp.Status, page)
	}
	resp, page = b.get("/record?" + refForm("never-begun").Encode())
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(page, "never begun") {
		t.Errorf("missing record: %s, want 404 saying why:\n%s", resp.Status, page)
	}
	resp, page = b.get("/records?state=bogus")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(page, "is not in_flight, completed, released or unknown") {
		t.Errorf("bad state: %s, want 400 with the admin API's message:\n%s", resp.Status, page)
	}
}

func TestListsArePagedByKeyset(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const n = console.PageSize + 5
	for i := range n {
		f.completed(t, "paid-"+string(rune('a'+i/26))+string(rune('a'+i%26)))
	}
	b := f.browser(t)
	b.signedIn()
	keys := regexp.MustCompile(`>(paid-[a-z]+)</a>`)
	seen := map[string]bool{}
	path := "/records?state=completed"
	for pages := 0; path != ""; pages++ {
		if pages > 2 {
			t.Fatal("more pages than records allow")
		}
		resp, page := b.get(path)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s\n%s", path, resp.Status, page)
		}
		for _, m := range keys.FindAllStringSubmatch(page, -1) {
			if seen[m[1]] {
				t.Errorf("%s listed twice", m[1])
			}
			seen[m[1]] = true
		}
		path = ""
		if m := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(page); m != nil {
			path = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if len(seen) != n {
		t.Errorf("listed %d records over the pages, want %d", len(seen), n)
	}
	if resp, page := b.get("/records?state=unknown&page=" + url.QueryEscape("garbage")); resp.StatusCode != http.StatusBadRequest || !strings.Contains(page, "page_token") {
		t.Errorf("a bad page token: %s, want 400:\n%s", resp.Status, page)
	}
}

func TestEveryAnswerHasTheSecurityHeaders(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := f.browser(t)
	csrf := b.signedIn()
	want := map[string]string{
		"Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
		"X-Frame-Options":         "DENY",
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
		"Cache-Control":           "no-store",
	}
	check := func(what string, resp *http.Response) {
		for k, v := range want {
			if got := resp.Header.Get(k); got != v {
				t.Errorf("%s: %s = %q, want %q", what, k, got, v)
			}
		}
	}
	for _, path := range []string{"/", "/login", "/records", "/static/console.css", "/no-such-page"} {
		resp, _ := b.get(path)
		check(path, resp)
	}
	resp, _ := f.browser(t).get("/")
	check("redirect to sign in", resp)
	resp, _ = b.post("/forget", refForm("x"))
	check("CSRF refusal", resp)
	// A body over the bound is refused, not read.
	resp, page := b.post("/forget", url.Values{"csrf": {csrf}, "pad": {strings.Repeat("x", console.MaxFormBytes)}})
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(page, "could not be read") {
		t.Errorf("an oversized form: %s, want 400:\n%s", resp.Status, page)
	}
	check("oversized form", resp)
	// No inline script or style anywhere.
	for _, path := range []string{"/", "/records", "/login"} {
		_, page := b.get(path)
		if strings.Contains(page, "<script") || strings.Contains(page, "style=") || strings.Contains(page, "<style") {
			t.Errorf("%s has inline script or style", path)
		}
	}
}

func TestSignOutEndsTheSession(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := f.browser(t)
	csrf := b.signedIn()
	if resp, _ := b.post("/logout", url.Values{"csrf": {csrf}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign out: %s", resp.Status)
	}
	if resp, _ := b.get("/"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("overview after signing out: %s, want a redirect to sign in", resp.Status)
	}
}
