package console_test

import (
	"crypto/sha256"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgate/idemgate/dedupesvc"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/console"
)

var (
	tenantRow   = regexp.MustCompile(`<tr(?: class="alert")?><td>(caller-[0-9]+)</td><td>([0-9]+)</td><td>([^<]*)</td>`)
	tenantsNext = regexp.MustCompile(`id="next" href="/tenants\?([^"]+)"`)
)

// TestTenantsPagesTheNamespacesUsage: 51 callers, one a record more than
// the one before, are listed 50 and 1 a page, each once and in order, with
// their records against the quota, those from 90% of it marked.
func TestTenantsPagesTheNamespacesUsage(t *testing.T) {
	t.Parallel()
	const callers = console.PageSize + 1
	f := newFixture(t, func(c *console.Config) { c.MaxRecords = 20 })
	fp := sha256.Sum256([]byte("r"))
	for i := range callers {
		ctx := dedupesvc.ContextWithCaller(t.Context(), dedupesvc.Caller{Name: fmt.Sprintf("caller-%02d", i)})
		for k := range i%20 + 1 {
			if _, err := f.srv.Begin(ctx, &idemgatev1.BeginRequest{Scope: scope, Key: fmt.Sprint("k", k), Fingerprint: fp[:], AttemptToken: "a",
				Lease: durationpb.New(time.Minute), Retention: durationpb.New(time.Hour)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	b := f.browser(t)
	b.signedIn()
	var listed []string
	path := "/tenants"
	for pages := 0; path != ""; pages++ {
		if pages > 2 {
			t.Fatalf("more than 2 pages for %d callers", callers)
		}
		resp, page := b.get(path)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s\n%s", path, resp.Status, page)
		}
		for _, m := range tenantRow.FindAllStringSubmatch(page, -1) {
			listed = append(listed, m[1]+" "+m[2]+" "+m[3])
			if near := strings.Contains(m[0], "alert"); near != (m[2] >= "18" && len(m[2]) == 2) {
				t.Errorf("%s with %s records of 20: marked near its quota %v", m[1], m[2], near)
			}
		}
		path = ""
		if m := tenantsNext.FindStringSubmatch(page); m != nil {
			path = "/tenants?" + html.UnescapeString(m[1])
		}
	}
	if len(listed) != callers || listed[0] != "caller-00 1 5.0%" || listed[19] != "caller-19 20 100.0%" || listed[callers-1] != "caller-50 11 55.0%" {
		t.Fatalf("listed %d callers: %v", len(listed), listed)
	}
}

// Without a usage lister the Tenants page says so, and still answers.
func TestTenantsWithoutAUsageLister(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *console.Config) { c.Usage = nil })
	b := f.browser(t)
	b.signedIn()
	resp, page := b.get("/tenants")
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "does not list its namespaces&#39; usage") || !strings.Contains(page, "given no metrics registry") {
		t.Fatalf("tenants without a lister: %s\n%s", resp.Status, page)
	}
}
