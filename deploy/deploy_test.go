package deploy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/examples/payments"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/internal/testing/stacktest"
)

const (
	rulesFile     = "prometheus/idemgate-alerts.yml"
	rulesTestFile = "prometheus/idemgate-alerts_test.yml"
	dashboardFile = "grafana/idemgate-dashboard.json"
)

// The rules pass promtool's syntax check and their unit tests.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("promtool is missing (CI=true, so this fails; .ci/run installs Debian's prometheus): %v", err)
		}
		t.Skipf("promtool is missing (apt-get install prometheus): %v", err)
	}
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// Every metric the rules and the dashboard name is exported by a running
// Dedupe service (on PostgreSQL, with TLS and tokens, so the pool, the
// certificate's expiry and the authentication metrics are there) or by a gate registered with
// WithRegisterer, after a few calls: an execution, a replay and a refusal.
func TestNamedMetricsAreExported(t *testing.T) {
	t.Parallel()
	named := namedMetrics(t)
	exported := exportedMetrics(t)

	for _, name := range named.names() {
		family, suffix := name, ""
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, s); ok && exported[base] == "histogram" {
				family, suffix = base, s
			}
		}
		if typ, ok := exported[family]; ok {
			if suffix == "" && typ == "histogram" {
				t.Errorf("%s (in %s) is a histogram: name its _bucket, _sum or _count series", name, named.where(name))
			}
			continue
		}
		t.Errorf("%s (in %s) is not a metric the service or the interceptor exports", name, named.where(name))
	}
	// The extraction itself: a change that made it find nothing would pass
	// the loop above.
	for _, must := range []string{"idemgate_interceptor_calls_total", "idemgate_dedupe_outcomes_total", "idemgate_db_pool_max_connections",
		"grpc_server_handled_total", "idemgate_dedupe_rpc_duration_seconds_bucket", "idemgate_interceptor_replay_age_seconds_bucket"} {
		if named.in[must] == nil {
			t.Errorf("found no %s in the rules or the dashboard: the extraction is broken", must)
		}
	}
}

func TestMetricsIn(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (method, le) (rate(a_bucket{method=~"x|y", le!="1"}[5m] offset 30m)) > 10 * b`: {"a_bucket", "b"},
		`max by (instance) (c / d) >= 0.9 and on (instance) e unless f{g="h"}`:                 {"c", "d", "e", "f"},
		`histogram_quantile(0.99, sum without (pod) (rate(h[$__rate_interval]))) > 1e3`:        {"h"},
		`absent(i) or sum(increase(j{k="(l)"}[15m])) > 0`:                                      {"i", "j"},
	} {
		if got := metricsIn(expr); !slices.Equal(got, want) {
			t.Errorf("metricsIn(%s) = %v, want %v", expr, got, want)
		}
	}
}

// named maps each metric name to the files that name it.
type named struct{ in map[string]map[string]bool }

func (n named) add(name, file string) {
	if n.in[name] == nil {
		n.in[name] = map[string]bool{}
	}
	n.in[name][file] = true
}

func (n named) names() []string {
	var out []string
	for name := range n.in {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func (n named) where(name string) string {
	var files []string
	for f := range n.in[name] {
		files = append(files, f)
	}
	sort.Strings(files)
	return strings.Join(files, ", ")
}

// namedMetrics reads the metric names out of the rules' expressions and the
// dashboard's queries.
func namedMetrics(t *testing.T) named {
	t.Helper()
	n := named{in: map[string]map[string]bool{}}

	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				t.Errorf("%s: recording rule %s: the check below does not know recorded names; extend it", rulesFile, r.Record)
			}
			for _, m := range metricsIn(r.Expr) {
				n.add(m, rulesFile)
			}
		}
	}

	b, err = os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dashboard any
	if err := json.Unmarshal(b, &dashboard); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	labelValues := regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,`)
	walk(dashboard, func(key, value string) {
		switch key {
		case "expr":
			for _, m := range metricsIn(value) {
				n.add(m, dashboardFile)
			}
		case "definition", "query":
			for _, m := range labelValues.FindAllStringSubmatch(value, -1) {
				n.add(m[1], dashboardFile)
			}
		}
	})
	return n
}

// walk calls f with every string value in v and the key it is under.
func walk(v any, f func(key, value string)) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok {
				f(k, s)
			} else {
				walk(e, f)
			}
		}
	case []any:
		for _, e := range v {
			walk(e, f)
		}
	}
}

var (
	promString = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	// Label matchers, ranges and subqueries, and the label lists of by,
	// without, on, ignoring, group_left and group_right name no metric.
	promBraces    = regexp.MustCompile(`\{[^{}]*\}|\[[^\[\]]*\]`)
	promLabelList = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	promIdent     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords  = map[string]bool{"and": true, "or": true, "unless": true, "offset": true, "bool": true, "by": true, "without": true,
		"on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// metricsIn returns the metric names a PromQL expression selects: what is
// left, not followed by "(", once strings, label matchers, ranges, label
// lists and keywords are taken out. It is no PromQL parser, but it is exact
// for the expressions the rules and the dashboard write.
func metricsIn(expr string) []string {
	expr = promString.ReplaceAllString(expr, `""`)
	for prev := ""; prev != expr; {
		prev = expr
		expr = promBraces.ReplaceAllString(expr, " ")
	}
	expr = promLabelList.ReplaceAllString(expr, " ")
	var out []string
	for _, m := range promIdent.FindAllStringSubmatchIndex(expr, -1) {
		if m[2] >= 0 { // a function or an aggregation
			continue
		}
		ident := expr[m[0]:m[1]]
		if m[0] > 0 && (expr[m[0]-1] >= '0' && expr[m[0]-1] <= '9' || expr[m[0]-1] == '.') { // 1e3, 0.5
			continue
		}
		if promKeywords[strings.ToLower(ident)] || strings.HasPrefix(ident, "$") {
			continue
		}
		if !slices.Contains(out, ident) {
			out = append(out, ident)
		}
	}
	return out
}

// exportedMetrics runs a Dedupe service and a gated payments server,
// exercises them and returns every exported family's name and type.
func exportedMetrics(t *testing.T) map[string]string {
	t.Helper()
	const secret = "metrics-test-secret-0123456789"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("payments client "+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca, caKey := newCA(t)
	serverCert, serverKey := leaf(t, ca, caKey, "dedupe.internal", x509.ExtKeyUsageServerAuth)
	certFile, keyFile := filepath.Join(t.TempDir(), "tls-cert"), filepath.Join(t.TempDir(), "tls-key")
	writePEM(t, certFile, "CERTIFICATE", serverCert)
	writePEM(t, keyFile, "PRIVATE KEY", serverKey)
	cfg := dedupeapp.Config{DatabaseURL: pgtest.SchemaURL(t), MigrateOnStart: true, MetricsListen: stacktest.FreeAddr(t), TokenFile: tokens,
		TLSCert: certFile, TLSKey: keyFile}
	dedupeAddr := stacktest.ServeApp(t, cfg)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	serverTLS := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "dedupe.internal", MinVersion: tls.VersionTLS12}))

	dedupeConn, err := grpc.NewClient(dedupeAddr, serverTLS,
		grpc.WithPerRPCCredentials(auth.BearerToken(secret, false)), grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dedupeConn.Close() })
	registry := prometheus.NewRegistry()
	quiet := slog.New(slog.DiscardHandler)
	gate, err := interceptor.New(idemgatev1.NewDedupeServiceClient(dedupeConn), interceptor.WithRegisterer(registry),
		interceptor.WithReplayCache(100, 1<<20), interceptor.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
	paymentsv1.RegisterPaymentsServiceServer(srv, &payments.Server{Ledger: &payments.Ledger{}})
	client := paymentsv1.NewPaymentsServiceClient(stacktest.Serve(t, srv))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keyed := metadata.AppendToOutgoingContext(ctx, idemgate.KeyHeader, "metrics-test-order-1")
	req := &paymentsv1.ChargeCardRequest{CustomerId: "cust_1", AmountCents: 100}
	for range 2 { // executed, then replayed (from the replay cache)
		if _, err := client.ChargeCard(keyed, req, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
	// A second gate without the cache replays through the Dedupe service.
	other, err := interceptor.New(idemgatev1.NewDedupeServiceClient(dedupeConn), interceptor.WithRegisterer(registry), interceptor.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	otherSrv := grpc.NewServer(grpc.ChainUnaryInterceptor(other.UnaryServerInterceptor()))
	paymentsv1.RegisterPaymentsServiceServer(otherSrv, &payments.Server{Ledger: &payments.Ledger{}})
	if _, err := paymentsv1.NewPaymentsServiceClient(stacktest.Serve(t, otherSrv)).ChargeCard(keyed, req, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ChargeCard(ctx, req); status.Code(err) != codes.InvalidArgument { // no key: refused
		t.Fatalf("keyless call: %v, want InvalidArgument", err)
	}
	// A stranger's call to the Dedupe service: an authentication refusal.
	stranger, err := grpc.NewClient(dedupeAddr, serverTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	if _, err := idemgatev1.NewDedupeServiceClient(stranger).Begin(ctx, &idemgatev1.BeginRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("call without a token: %v, want Unauthenticated", err)
	}

	// idemgate_records_outcome_unknown is absent until the service's first
	// count, which runs beside start-up: on a loaded machine the first scrape
	// can come before it.
	exported := map[string]string{}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		clear(exported)
		scrapeTypes(t, "http://"+cfg.MetricsListen+"/metrics", exported)
		if _, counted := exported["idemgate_records_outcome_unknown"]; counted || time.Now().After(deadline) {
			break
		}
	}
	gateMetrics := httptest.NewServer(promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	defer gateMetrics.Close()
	scrapeTypes(t, gateMetrics.URL, exported)
	return exported
}

// scrapeTypes reads the families of a text exposition at url, by their
// # TYPE lines, into types.
func scrapeTypes(t *testing.T, url string, types map[string]string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			types[f[2]] = f[3]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}
