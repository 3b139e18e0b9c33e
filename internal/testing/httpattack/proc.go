package httpattack

import "strconv"

// WithFileLimit returns the program and arguments that run bin with args
// under a descriptor limit of n (sh's ulimit -n), so a test sees what a
// server does when an attack would take every descriptor it has.
func WithFileLimit(n int, bin string, args ...string) (string, []string) {
	return "/bin/sh", append([]string{"-c", `ulimit -n ` + strconv.Itoa(n) + ` && exec "$0" "$@"`, bin}, args...)
}
