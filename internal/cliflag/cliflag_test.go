package cliflag_test

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/cliflag"
)

// setup returns a flag set with one flag of each of the flag package's
// kinds, bound with prefix T_ to the variables in env.
func setup(t *testing.T, env map[string]string, opts ...cliflag.Option) (*flag.FlagSet, *cliflag.Env, *settings) {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var s settings
	fs.StringVar(&s.listen, "listen", "127.0.0.1:1", "listen `address`")
	fs.DurationVar(&s.interval, "sweep-interval", time.Minute, "pause between sweeps")
	fs.IntVar(&s.batch, "sweep-batch", 1000, "records per sweep")
	fs.Float64Var(&s.rate, "caller-begin-rate", 500, "Begins a second")
	fs.BoolVar(&s.notify, "notify", true, "wake waiters")
	fs.StringVar(&s.url, "database-url", "", "database `URL`")
	return fs, cliflag.Bind(fs, "T_", cliflag.Map(env), opts...), &s
}

type settings struct {
	listen, url string
	interval    time.Duration
	batch       int
	rate        float64
	notify      bool
}

func TestVarName(t *testing.T) {
	for flagName, want := range map[string]string{
		"caller-begin-rate": "IDEMGATE_CALLER_BEGIN_RATE",
		"listen":            "IDEMGATE_LISTEN",
		"db-max-conns":      "IDEMGATE_DB_MAX_CONNS",
	} {
		if got := cliflag.VarName("IDEMGATE_", flagName); got != want {
			t.Errorf("VarName(IDEMGATE_, %s) = %s, want %s", flagName, got, want)
		}
	}
}

func TestApply(t *testing.T) {
	t.Run("the variables set the flags not given, each parsed by its flag", func(t *testing.T) {
		_, env, s := setup(t, map[string]string{
			"T_LISTEN": "0.0.0.0:2", "T_SWEEP_INTERVAL": "30s", "T_SWEEP_BATCH": "10",
			"T_CALLER_BEGIN_RATE": "2.5", "T_NOTIFY": "false",
		})
		if err := env.Parse(nil); err != nil {
			t.Fatal(err)
		}
		if s.listen != "0.0.0.0:2" || s.interval != 30*time.Second || s.batch != 10 || s.rate != 2.5 || s.notify {
			t.Errorf("settings %+v, want every variable applied", *s)
		}
		if !env.Configured("listen") || env.Configured("database-url") {
			t.Errorf("Configured: listen %v, database-url %v; want true (from its variable), false (default)", env.Configured("listen"), env.Configured("database-url"))
		}
	})
	t.Run("a flag given wins over its variable", func(t *testing.T) {
		fs, env, s := setup(t, map[string]string{"T_LISTEN": "0.0.0.0:2", "T_SWEEP_BATCH": "10"})
		if err := env.Parse([]string{"-listen", "127.0.0.1:3"}); err != nil {
			t.Fatal(err)
		}
		if s.listen != "127.0.0.1:3" || s.batch != 10 {
			t.Errorf("listen %q, batch %d; want the flag's 127.0.0.1:3 and the variable's 10", s.listen, s.batch)
		}
		var visited []string
		fs.Visit(func(f *flag.Flag) { visited = append(visited, f.Name) })
		if len(visited) != 1 || visited[0] != "listen" {
			t.Errorf("Visit lists %q, want the command line's flag only", visited)
		}
	})
	// As the flag package reads -listen= (issue 32: an empty variable was
	// read as unset, so IDEMGATE_METRICS_LISTEN= could not turn off what
	// -metrics-listen= does).
	t.Run("an empty variable is the flag given empty", func(t *testing.T) {
		_, env, s := setup(t, map[string]string{"T_LISTEN": ""})
		if err := env.Parse(nil); err != nil || s.listen != "" || !env.Configured("listen") {
			t.Errorf("listen %q, configured %v, %v; want it emptied, as -listen= does", s.listen, env.Configured("listen"), err)
		}
	})
	t.Run("an empty variable is refused where its flag refuses empty", func(t *testing.T) {
		_, env, _ := setup(t, map[string]string{"T_SWEEP_BATCH": "", "T_SWEEP_INTERVAL": "", "T_NOTIFY": ""})
		err := env.Parse(nil)
		for _, want := range []string{
			`T_SWEEP_BATCH="" (-sweep-batch): parse error, want a whole number; fix the variable, unset it, or give -sweep-batch`,
			`T_SWEEP_INTERVAL="" (-sweep-interval): parse error, want a duration such as 30s or 1m30s`,
			`T_NOTIFY="" (-notify): parse error, want true or false`,
		} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("error %v, want it to hold %s", err, want)
			}
		}
	})
	t.Run("an unset variable leaves its flag at the default", func(t *testing.T) {
		_, env, s := setup(t, map[string]string{})
		if err := env.Parse(nil); err != nil || s.listen != "127.0.0.1:1" || env.Configured("listen") {
			t.Errorf("listen %q, configured %v, %v; want the default", s.listen, env.Configured("listen"), err)
		}
	})
	t.Run("a variable that does not parse names itself, its value and its flag", func(t *testing.T) {
		_, env, _ := setup(t, map[string]string{"T_SWEEP_INTERVAL": "x"})
		err := env.Parse(nil)
		want := `T_SWEEP_INTERVAL="x" (-sweep-interval): parse error, want a duration such as 30s or 1m30s; fix the variable, unset it, or give -sweep-interval`
		if err == nil || err.Error() != want {
			t.Fatalf("error %v, want %s", err, want)
		}
		var verr *cliflag.VarError
		if !errors.As(err, &verr) || verr.Var != "T_SWEEP_INTERVAL" || verr.Value != "x" || verr.Flag != "sweep-interval" {
			t.Errorf("error %#v, want a *VarError with the variable, value and flag", verr)
		}
	})
	t.Run("a variable that does not parse is not read when its flag is given", func(t *testing.T) {
		_, env, s := setup(t, map[string]string{"T_SWEEP_INTERVAL": "x", "T_NOTIFY": "maybe"})
		if err := env.Parse([]string{"-sweep-interval", "5s", "-notify"}); err != nil || s.interval != 5*time.Second {
			t.Errorf("interval %s, %v; want the flag's 5s and no error", s.interval, err)
		}
	})
	t.Run("every variable that does not parse is reported at once", func(t *testing.T) {
		_, env, s := setup(t, map[string]string{
			"T_SWEEP_BATCH": "many", "T_NOTIFY": "maybe", "T_CALLER_BEGIN_RATE": "fast", "T_LISTEN": "0.0.0.0:2",
		})
		err := env.Parse(nil)
		for _, want := range []string{
			`T_SWEEP_BATCH="many" (-sweep-batch): parse error, want a whole number`,
			`T_NOTIFY="maybe" (-notify): parse error, want true or false`,
			`T_CALLER_BEGIN_RATE="fast" (-caller-begin-rate): parse error, want a number`,
		} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("error %v, want it to hold %s", err, want)
			}
		}
		if err != nil && strings.Count(err.Error(), "\n") != 2 {
			t.Errorf("error %q, want three lines", err)
		}
		if s.listen != "0.0.0.0:2" {
			t.Errorf("listen %q, want the variable that parsed applied too", s.listen)
		}
	})
	t.Run("a parse error is returned before the environment is read", func(t *testing.T) {
		_, env, _ := setup(t, map[string]string{"T_NOTIFY": "maybe"})
		if err := env.Parse([]string{"-no-such-flag"}); err == nil || strings.Contains(err.Error(), "T_NOTIFY") {
			t.Errorf("error %v, want the unknown flag only", err)
		}
	})
}

func TestWithName(t *testing.T) {
	_, env, s := setup(t, map[string]string{"DATABASE_URL": "postgres://db/x", "T_DATABASE_URL": "postgres://other/y"},
		cliflag.WithName("database-url", "DATABASE_URL"))
	if err := env.Parse(nil); err != nil || s.url != "postgres://db/x" {
		t.Errorf("url %q, %v; want DATABASE_URL's, not T_DATABASE_URL's", s.url, err)
	}
	if env.Var("database-url") != "DATABASE_URL" || env.Var("listen") != "T_LISTEN" || env.Var("no-such-flag") != "" {
		t.Errorf("Var: %q, %q, %q; want DATABASE_URL, T_LISTEN and none", env.Var("database-url"), env.Var("listen"), env.Var("no-such-flag"))
	}
	defer func() {
		if recover() == nil {
			t.Error("WithName for a flag the set does not define: no panic")
		}
	}()
	setup(t, nil, cliflag.WithName("no-such-flag", "X"))
}

func TestUsageNamesTheVariables(t *testing.T) {
	fs, _, _ := setup(t, nil, cliflag.WithName("database-url", "DATABASE_URL"))
	var usage strings.Builder
	fs.SetOutput(&usage)
	fs.PrintDefaults()
	for _, want := range []string{
		"-listen address\n    \tlisten address (env T_LISTEN) (default \"127.0.0.1:1\")",
		"pause between sweeps (env T_SWEEP_INTERVAL) (default 1m0s)",
		"database URL (env DATABASE_URL)",
	} {
		if !strings.Contains(usage.String(), want) {
			t.Errorf("usage:\n%s\nwant it to hold %q", usage.String(), want)
		}
	}
}

// A flag defined after Bind reads no variable.
func TestFlagsDefinedAfterBindAreNotBound(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	env := cliflag.Bind(fs, "T_", func(string) (string, bool) { return "x", true })
	later := fs.String("later", "default", "")
	if err := env.Parse(nil); err != nil || *later != "default" || env.Var("later") != "" {
		t.Errorf("later %q, %v, variable %q; want the default, no variable", *later, err, env.Var("later"))
	}
}
