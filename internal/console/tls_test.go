package console_test

import (
	"crypto/tls"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/internal/console"
	"github.com/idemgate/idemgate/internal/testing/certtest"
)

// Over TLS with client CAs, an operator whose verified certificate names an
// admin identity signs in without a token; another certificate is refused;
// cookies are Secure and __Host- prefixed.
func TestClientCertificateSignInOverTLS(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.unknown(t, "blocked-1")
	const admin = "spiffe://example.org/oncall"
	authn, err := auth.New(auth.Config{AdminIdentities: []string{admin}, Logger: slog.New(slog.NewJSONHandler(f.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{Admin: f.admin, Authenticator: authn, Logger: slog.New(slog.NewJSONHandler(f.logs, nil)), SecureCookies: true})
	if err != nil {
		t.Fatal(err)
	}
	ca := certtest.NewCA(t, "test CA")
	server := httptest.NewUnstartedServer(c)
	server.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{ca.Server(t, "console", time.Hour).TLS(t)},
		ClientCAs: ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven}
	server.StartTLS()
	t.Cleanup(server.Close)

	client := func(id string) *browser {
		jar, _ := cookiejar.New(nil)
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool()}
		if id != "" {
			cfg.Certificates = []tls.Certificate{ca.Client(t, id).TLS(t)}
		}
		return &browser{t: t, base: server.URL, client: &http.Client{Jar: jar, Transport: &http.Transport{TLSClientConfig: cfg},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	}

	b := client(admin)
	_, page := b.get("/login")
	if !strings.Contains(page, "Sign in as "+admin) {
		t.Fatalf("the sign-in page does not offer the certificate's identity:\n%s", page)
	}
	resp, page := b.post("/login", url.Values{"login_csrf": {field(t, loginCSRF, page)}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("certificate sign-in: %s\n%s", resp.Status, page)
	}
	var session *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == "__Host-idemgate_console" {
			session = ck
		}
	}
	if session == nil || !session.Secure || !session.HttpOnly || session.SameSite != http.SameSiteStrictMode {
		t.Fatalf("session cookie over TLS %+v: want __Host-, Secure, HttpOnly, SameSite=Strict", resp.Cookies())
	}
	resp, page = b.get("/")
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "blocked-1") || resp.Header.Get("Strict-Transport-Security") == "" {
		t.Fatalf("overview over TLS: %s\n%s", resp.Status, page)
	}
	csrf := field(t, formCSRF, page)
	form := refForm("blocked-1")
	form.Set("csrf", csrf)
	form.Set("resolution", "release")
	if resp, page := b.post("/resolve", form); resp.StatusCode != http.StatusOK {
		t.Fatalf("release as %s: %s\n%s", admin, resp.Status, page)
	}
	if !strings.Contains(f.logs.String(), `"by":"`+admin+`","action":"resolve_release"`) {
		t.Errorf("the audit line does not name the certificate's identity:\n%s", f.logs)
	}

	other := client("spiffe://example.org/payments-tool")
	_, page = other.get("/login")
	if strings.Contains(page, "Sign in as") {
		t.Fatalf("a certificate that is not an admin identity is offered sign-in:\n%s", page)
	}
	resp, page = other.post("/login", url.Values{"login_csrf": {field(t, loginCSRF, page)}, "token": {"anything-at-all-0123"}})
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(page, "no admin right") {
		t.Fatalf("non-admin certificate: %s, want 403:\n%s", resp.Status, page)
	}
	// Without a certificate and with no token configured, nobody gets in.
	anon := client("")
	_, page = anon.get("/login")
	resp, _ = anon.post("/login", url.Values{"login_csrf": {field(t, loginCSRF, page)}, "token": {adminToken}})
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a token the service does not have, over TLS: %s, want 403", resp.Status)
	}
}
