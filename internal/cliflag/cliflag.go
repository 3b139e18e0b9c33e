package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"
)

// Env binds the flags of one flag set to their environment variables; Bind
// makes one, and Apply sets the flags from the variables.
type Env struct {
	fs        *flag.FlagSet
	lookupEnv func(string) (string, bool)
	// vars maps each bound flag's name to its variable.
	vars map[string]string
	// fromEnv holds the flags Apply set from their variable.
	fromEnv map[string]bool
}

// VarName returns the variable the rule gives the flag flagName: prefix
// followed by the name upper-cased, each '-' as '_' (VarName("IDEMGATE_",
// "caller-begin-rate") is IDEMGATE_CALLER_BEGIN_RATE).
func VarName(prefix, flagName string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Bind binds every flag defined on fs so far to its variable, VarName(prefix,
// name) unless a WithName option names another, and appends "(env NAME)" to
// each flag's usage so that fs.PrintDefaults lists it. Flags defined after
// Bind read no variable. lookupEnv reads the environment and tells a set
// variable, empty or not, from an unset one: os.LookupEnv in a command, Map
// in a test. It panics when a WithName option names a flag fs does not
// define, as flag panics on a flag defined twice.
func Bind(fs *flag.FlagSet, prefix string, lookupEnv func(string) (string, bool), opts ...Option) *Env {
	o := options{names: map[string]string{}}
	for _, opt := range opts {
		opt(&o)
	}
	e := &Env{fs: fs, lookupEnv: lookupEnv, vars: map[string]string{}, fromEnv: map[string]bool{}}
	for name := range o.names {
		if fs.Lookup(name) == nil {
			panic(fmt.Sprintf("cliflag: WithName(%q, %q): %s defines no flag -%s", name, o.names[name], fs.Name(), name))
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		v, ok := o.names[f.Name]
		if !ok {
			v = VarName(prefix, f.Name)
		}
		e.vars[f.Name] = v
		f.Usage += " (env " + v + ")"
	})
	return e
}

// Var returns the variable the flag flagName reads, or "" for a flag Bind
// did not bind.
func (e *Env) Var(flagName string) string { return e.vars[flagName] }

// Parse parses args with the flag set, then applies the variables (Apply).
// It returns the parse's error (flag.ErrHelp for -h) without reading the
// environment.
func (e *Env) Parse(args []string) error {
	if err := e.fs.Parse(args); err != nil {
		return err
	}
	return e.Apply()
}

// Apply sets each bound flag that the command line did not give from its
// variable, when the variable is set, through the flag's own Value.Set: a
// variable set to the empty string is the flag given as -flag= (a string
// flag becomes empty; a flag that refuses "", a number, a duration or a
// boolean, is an error), and only an unset variable leaves the flag at its
// default. Call it after parsing. A flag set this way is not marked as
// given: fs.Visit still lists the command line's flags only (Configured
// tells both). It returns a *VarError for every variable its flag refused,
// joined (errors.Join), or nil; the flags that did parse are set either way.
func (e *Env) Apply() error {
	given := map[string]bool{}
	e.fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	e.fs.VisitAll(func(f *flag.Flag) {
		name, ok := e.vars[f.Name]
		if !ok || given[f.Name] {
			return
		}
		value, set := e.lookupEnv(name)
		if !set {
			return
		}
		if err := f.Value.Set(value); err != nil {
			errs = append(errs, &VarError{Var: name, Value: value, Flag: f.Name, Want: want(f.Value), Err: err})
			return
		}
		e.fromEnv[f.Name] = true
	})
	return errors.Join(errs...)
}

// Configured reports whether the flag flagName took a value from the command
// line or, in Apply, from its variable; false leaves it at its default.
func (e *Env) Configured(flagName string) bool {
	given := false
	e.fs.Visit(func(f *flag.Flag) { given = given || f.Name == flagName })
	return given || e.fromEnv[flagName]
}

// VarError is an environment variable that its flag did not accept.
type VarError struct {
	// Var and Value are the variable and its value.
	Var, Value string
	// Flag is the name of the flag the variable sets, without its dash.
	Flag string
	// Want describes what the flag takes ("a whole number"), or is empty
	// when the flag's type is not one of the flag package's.
	Want string
	// Err is the flag's Value.Set error.
	Err error
}

// Error reads IDEMGATE_SWEEP_INTERVAL="soon" (-sweep-interval): parse error,
// want a duration such as 30s or 1m30s; fix the variable, unset it, or give
// -sweep-interval.
func (e *VarError) Error() string {
	msg := fmt.Sprintf("%s=%q (-%s): %v", e.Var, e.Value, e.Flag, e.Err)
	if e.Want != "" {
		msg += ", want " + e.Want
	}
	return msg + "; fix the variable, unset it, or give -" + e.Flag
}

// Map returns a lookup of the variables in env for Bind: a name env holds is
// set, to its value, even an empty one; any other is unset.
func Map(env map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
}

// Unwrap returns the flag's Value.Set error.
func (e *VarError) Unwrap() error { return e.Err }

// want describes the values a flag of the flag package's own types takes;
// the package's errors for them say only "parse error".
func want(v flag.Value) string {
	g, ok := v.(flag.Getter)
	if !ok {
		return ""
	}
	switch g.Get().(type) {
	case bool:
		return "true or false"
	case time.Duration:
		return "a duration such as 30s or 1m30s"
	case int, int64:
		return "a whole number"
	case uint, uint64:
		return "a whole number, 0 or more"
	case float64:
		return "a number"
	}
	return ""
}
