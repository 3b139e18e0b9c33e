// Package proctest builds and runs real binaries for fault tests: a test
// builds a main package once per test process, starts it with its output in
// a log file, and kills, pauses or signals it as an operator or the kernel
// would; whatever it started is killed when the test ends.
//
// It works on Linux and other Unix systems; on Linux a started process is
// also killed if the test process dies first.
package proctest
