package console_test

import (
	"context"
	"flag"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/internal/console"
)

// million turns on TestConsolePagesWithAMillionRecords: loading a million
// records takes about half a minute, too long for make test's every run.
var million = flag.Bool("console-million", os.Getenv("IDEMGATE_CONSOLE_MILLION") != "", "time the console's pages over a million records (about 30 s)")

// loadMillionSQL fills idemgate_records with a million records of 20 tool
// servers, 8 methods and 500 tenants, as a busy store holds them: 94%
// completed (5% of those replayed, up to 300 times, up to a day after
// completion), 4.9% released, 1% in flight, 0.1% outcome-unknown; created
// over the last day, kept a day. The usage triggers are off during the load
// and the totals written once, as migration 005 counts existing rows: a
// million row triggers would only slow the load.
const loadMillionSQL = `
ALTER TABLE idemgate_records DISABLE TRIGGER USER;
INSERT INTO idemgate_records (namespace, scope, idempotency_key, fingerprint, state, attempt_token, epoch,
    outcome_type_url, outcome_value, retention_ms, lease_ms, lease_expires_at, expires_at, created_at, completed_at,
    replay_count, last_replayed_at, unknown_retention_ms)
SELECT 'tools-' || lpad((i % 20)::text, 2, '0'),
       m.name || '|tenant-' || lpad(((i / 20) % 500)::text, 3, '0'),
       'key-' || lpad(i::text, 7, '0'),
       decode(md5(i::text), 'hex'),
       s.state,
       'attempt-' || i,
       i,
       CASE WHEN s.state = 'completed' THEN 'type.googleapis.com/google.protobuf.StringValue' END,
       CASE WHEN s.state = 'completed' THEN convert_to(repeat('x', (40 + i % 160)::int), 'UTF8') END,
       86400000, 10000,
       t.created + interval '10 seconds',
       t.created + interval '24 hours',
       t.created,
       CASE WHEN s.state = 'completed' THEN t.created + interval '200 milliseconds' END,
       CASE WHEN s.state = 'completed' AND i % 20 = 7 THEN 1 + (i * 7919) % 300 ELSE 0 END,
       CASE WHEN s.state = 'completed' AND i % 20 = 7
            THEN least(now(), t.created + interval '200 milliseconds' + ((i * 104729) % 80000) * interval '1 second') END,
       CASE WHEN s.state IN ('in_flight', 'unknown') THEN 86400000 ELSE 0 END
FROM generate_series(1::bigint, 1000000::bigint) AS i,
     LATERAL (SELECT (ARRAY['/payments.v1.Payments/Charge', '/payments.v1.Payments/Refund', '/mail.v1.Mail/Send',
                            '/orders.v1.Orders/Place', '/orders.v1.Orders/Cancel', '/tickets.v1.Tickets/Open',
                            '/crm.v1.Contacts/Update', '/sms.v1.SMS/Send'])[1 + (i * 31) % 8] AS name) AS m,
     LATERAL (SELECT CASE WHEN i % 1000 = 3 THEN 'unknown'
                          WHEN i % 100 = 5 THEN 'in_flight'
                          WHEN i % 100 < 5 THEN 'released'
                          ELSE 'completed' END AS state) AS s,
     LATERAL (SELECT now() - ((i * 86399.0) / 1000000) * interval '1 second' AS created) AS t;
INSERT INTO idemgate_namespace_usage (namespace, shard, records, outcome_bytes)
SELECT namespace, 0, count(*), coalesce(sum(octet_length(outcome_value)), 0) FROM idemgate_records GROUP BY namespace
ON CONFLICT (namespace, shard) DO UPDATE SET records = excluded.records, outcome_bytes = excluded.outcome_bytes;
ALTER TABLE idemgate_records ENABLE TRIGGER USER`

var (
	nextPage    = regexp.MustCompile(`id="next" href="/records\?([^"]+)"`)
	countedText = regexp.MustCompile(`id="counted">(Counted at .+?)\. Counting`)
)

// TestConsolePagesWithAMillionRecords times each console page, over HTTP,
// on a PostgreSQL schema of its own holding a million records, and prints
// the figures: the issue asks for a page in under 200 ms with a million
// records. It asserts no time (the machines are shared and noisy), only
// that every page answers 200. Run it with:
//
//	go test ./internal/console -run TestConsolePagesWithAMillionRecords -console-million -v
func TestConsolePagesWithAMillionRecords(t *testing.T) {
	if !*million {
		t.Skip("times the console over a million records (about 30 s): run with -console-million or IDEMGATE_CONSOLE_MILLION=1")
	}
	f := newFixture(t, func(c *console.Config) {
		c.MaxRecords, c.MaxBytes = dedupesvc.DefaultCallerRecords, dedupesvc.DefaultCallerBytes
	})
	ctx := context.Background()
	start := time.Now()
	if _, err := f.pool.Exec(ctx, loadMillionSQL); err != nil {
		t.Fatalf("loading a million records: %v", err)
	}
	loaded := time.Since(start)
	// As autovacuum would have by the time a store holds this many: fresh
	// statistics and a visibility map.
	if _, err := f.pool.Exec(ctx, "VACUUM ANALYZE idemgate_records"); err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded 1,000,000 records in %s, vacuumed and analyzed in %s", loaded.Round(time.Millisecond), (time.Since(start) - loaded).Round(time.Millisecond))
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		t.Logf("load average (1, 5, 15 min): %s", strings.Join(strings.Fields(string(load))[:3], " "))
	}

	b := f.browser(t)
	if resp, page := b.login(adminToken); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("admin sign-in: %s\n%s", resp.Status, page)
	}
	timed := func(path string) (time.Duration, string) {
		t.Helper()
		start := time.Now()
		resp, page := b.get(path)
		took := time.Since(start)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s\n%s", path, resp.Status, page)
		}
		return took, page
	}
	// report times path runs times and prints the fastest, the median and
	// the slowest.
	report := func(name, path string, runs int) string {
		t.Helper()
		var times []time.Duration
		var page string
		for range runs {
			var took time.Duration
			took, page = timed(path)
			times = append(times, took)
		}
		slices.Sort(times)
		ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
		t.Logf("%-46s min %9s  median %9s  max %9s  (%d runs)", name, ms(times[0]), ms(times[len(times)/2]), ms(times[len(times)-1]), runs)
		return page
	}
	// The first overview waits for the first count of every record; later
	// ones show the last count (recounted in the background).
	took, page := timed("/")
	t.Logf("%-46s %9.1f ms, %s", "overview, the first (waits for the count)", float64(took.Microseconds())/1000, countedText.FindStringSubmatch(page)[1])
	const runs = 9
	report("overview", "/", runs)
	first := report("records, first page", "/records", runs)
	// Twenty pages in, through the pages' own next links.
	page = first
	var later string
	for range 20 {
		m := nextPage.FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no next page link:\n%s", page)
		}
		later = "/records?" + html.UnescapeString(m[1])
		_, page = timed(later)
	}
	report("records, 21st page", later, runs)
	report("outcome unknown, first page", "/records?state=unknown", runs)
	report("completed, first page", "/records?state=completed", runs)
	report("released, first page", "/records?state=released", runs)
	report("in flight, first page", "/records?state=in_flight", runs)
	report("tenants", "/tenants", runs)
	report("most replayed, first page", "/records?order=replays", runs)
	report("replayed longest after completion, first page", "/records?order=replay-age", runs)
	// An outcome-unknown record, as an operator opens one during an
	// incident.
	var ns, sc string
	if err := f.pool.QueryRow(ctx, "SELECT namespace, scope FROM idemgate_records WHERE idempotency_key = 'key-0001003'").Scan(&ns, &sc); err != nil {
		t.Fatal(err)
	}
	key := url.Values{"ns": {ns}, "scope": {sc}, "key": {"key-0001003"}}.Encode()
	report("a key's page", "/record?"+key, runs)
	report("a key's resolve confirmation", "/resolve?"+key, runs)
}
