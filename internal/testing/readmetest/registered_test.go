package readmetest

import (
	"context"
	"io"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgate/idemgate/connectgate"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/httpgate"
	"github.com/idemgate/idemgate/interceptor"
	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
	"github.com/idemgate/idemgate/mcpgate"
)

// recorder is a prometheus.Registerer that keeps every collector registered
// through it, on a registry of its own, so that the gates' sharing of
// collectors (internal/gatemetrics) works as on a real one.
type recorder struct {
	reg *prometheus.Registry
	mu  sync.Mutex
	all []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.mu.Lock()
	r.all = append(r.all, c)
	r.mu.Unlock()
	return r.reg.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

// fqName is a metric's name in a Desc's String().
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// described returns the names of the metrics the collectors describe: every
// family they may export, whether or not it has a series yet.
func described(cs ...prometheus.Collector) map[string]bool {
	names := map[string]bool{}
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, c := range cs {
			c.Describe(ch)
		}
		close(ch)
	}()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
		}
	}
	return names
}

// wildcard is a documented family of names, `prefix_*`, whose members the
// docs then name by their rest (docs/service.md: `idemgate_db_pool_*`:
// `acquires_total`, ...).
var wildcard = regexp.MustCompile("`(idemgate_[a-z0-9_]*_)\\*`")

// documented reports whether docs names metric in full, or names a wildcard
// family it belongs to and its rest in backquotes.
func documented(docs, metric string) bool {
	if regexp.MustCompile(`\b` + metric + `\b`).MatchString(docs) {
		return true
	}
	for _, m := range wildcard.FindAllStringSubmatch(docs, -1) {
		if rest, ok := strings.CutPrefix(metric, m[1]); ok && strings.Contains(docs, "`"+rest+"`") {
			return true
		}
	}
	return false
}

// Every metric the Dedupe service (on PostgreSQL: its own, the pool's, the
// outcome-unknown records', authentication's) and the four gates register,
// as their collectors describe them, is named in README.md or docs/*.md. It
// reads the names from the collectors themselves, so a name built at run
// time (the pool's) or a family with no series yet is checked as well;
// TestEveryMetricIsDocumented reads the source for those only Serve
// registers (before authentication, the TLS certificate).
func TestEveryMetricTheServiceAndGatesRegisterIsDocumented(t *testing.T) {
	ctx := context.Background()
	cfg, err := dedupeapp.ParseConfig("dedupesvc", []string{"-database-url", pgtest.SchemaURL(t), "-metrics-listen="}, cliflag.Map(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	e, err := dedupeapp.Embed(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	authn, err := auth.New(auth.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	service := described(append(e.Collectors(), authn)...)

	rec := &recorder{reg: prometheus.NewRegistry()}
	if _, err := interceptor.New(e.Client(), interceptor.WithRegisterer(rec)); err != nil {
		t.Fatal(err)
	}
	if _, err := httpgate.New(e.Client(), "docs", httpgate.WithRegisterer(rec)); err != nil {
		t.Fatal(err)
	}
	if _, err := connectgate.New(e.Client(), connectgate.WithRegisterer(rec)); err != nil {
		t.Fatal(err)
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "docs", Version: "1"}, nil)
	if _, err := mcpgate.New(ctx, e.Client(), server, mcpgate.WithRegisterer(rec)); err != nil {
		t.Fatal(err)
	}
	gates := described(rec.all...)

	var docs strings.Builder
	for _, text := range docFiles(t) {
		docs.WriteString(text)
	}
	for what, names := range map[string]map[string]bool{"the Dedupe service": service, "the gates": gates} {
		// Each part's families, so that a collector that stopped
		// describing itself does not pass unnoticed.
		for _, prefix := range map[string][]string{
			"the Dedupe service": {"idemgate_dedupe_", "idemgate_db_pool_", "idemgate_records_outcome_unknown", "idemgate_usage_compaction_lag_seconds", "idemgate_dedupe_auth_"},
			"the gates":          {"idemgate_interceptor_", "idemgate_httpgate_", "idemgate_connectgate_", "idemgate_mcpgate_"},
		}[what] {
			if !hasPrefix(names, prefix) {
				t.Errorf("%s registers no metric named %s...: the collection is broken", what, prefix)
			}
		}
		var missing []string
		for name := range names {
			if !documented(docs.String(), name) {
				missing = append(missing, name)
			}
		}
		sort.Strings(missing)
		for _, m := range missing {
			t.Errorf("%s registers %s, which README.md and docs/*.md do not name", what, m)
		}
	}
}

func hasPrefix(names map[string]bool, prefix string) bool {
	for n := range names {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}

// documented finds a name in full or through its documented family, and
// nothing else.
func TestDocumentedMatchesNamesAndFamilies(t *testing.T) {
	docs := "`idemgate_a_total` and the pool's `idemgate_db_pool_*`: `acquires_total`, `idle_connections`."
	for name, want := range map[string]bool{
		"idemgate_a_total":                  true,
		"idemgate_a":                        false,
		"idemgate_db_pool_acquires_total":   true,
		"idemgate_db_pool_idle_connections": true,
		"idemgate_db_pool_new_total":        false,
		"idemgate_b_total":                  false,
	} {
		if got := documented(docs, name); got != want {
			t.Errorf("documented(%q) = %v, want %v", name, got, want)
		}
	}
}
