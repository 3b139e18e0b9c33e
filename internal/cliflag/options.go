package cliflag

// options are Bind's settings, filled by its Options.
type options struct {
	// names maps a flag's name to the variable it reads in place of the
	// one the rule gives it. Defaults to none.
	names map[string]string
}

// Option changes how Bind names the flags' variables.
type Option func(*options)

// WithName binds the flag named flagName to the variable name instead of
// the one the rule gives it (prefix plus the upper-cased flag name), for a
// variable whose documented name differs: DATABASE_URL for -database-url,
// IDEMGATE_MCP_TARGET_TOKEN for idemgate-mcp's -token. Bind panics when the
// flag set has no such flag. Defaults to the rule's name for every flag.
func WithName(flagName, name string) Option {
	return func(o *options) { o.names[flagName] = name }
}
