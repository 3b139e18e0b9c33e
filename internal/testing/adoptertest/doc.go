// Package adoptertest runs docs/adopting.md, the adopter's guide, exactly as
// written (make adopter, which passes -adopter; make test runs only its
// checks of the guide's text): in a new directory outside the repository it writes the guide's
// file blocks, runs its sh blocks in order in one bash, and compares each
// output block with what the sh block before it printed. Only the guide's
// env block is replaced, by the clone it runs from, a PostgreSQL database of
// its own (dropped afterwards) and free ports.
//
// The guide marks its blocks with an HTML comment on the line before the
// fence:
//
//	<!-- file: PATH -->       write the block to PATH (relative) before the next sh block
//	<!-- output -->           the stdout of the sh block before it, line for line
//	<!-- env -->              the variables the test sets itself (export NAME=value lines)
//	<!-- needs: python3-grpcio -->  an sh block run only when /usr/bin/python3 has grpcio
//	<!-- not run: REASON -->  shown only
//
// An unmarked sh block runs; any other unmarked block fails the test, so
// every block of the guide is either run, written, compared or said not to be.
//
// One substitution: a `GOBIN=$PWD/bin go install PKG@VERSION` line whose
// binary make tools has already built in TOOLS_DIR (the Makefile's rule is
// the same line with another GOBIN) with this toolchain and
// internal/gobuild's flags is served by copying that binary (prebuilt): the
// line would build the same bytes. Without such a binary the line runs as
// written; the test logs which it did. buf itself comes from npm's prebuilt
// package, as the guide installs it (building it from source, the guide's
// alternative, compiles 559 packages nothing else in make test needs).
//
// The run needs the Go module proxy (go mod tidy, go install of the protoc
// plugins at the Makefile's pins, into the run's own bin/), npm and the npm
// registry (buf), node, PostgreSQL at pgtest.URL(), curl, and
// /usr/bin/python3 with grpcio and protobuf for the Python step. Without one
// of them it skips, except under CI=true, where it fails. With a warm Go
// build cache it takes 22 to 37 seconds on a shared 2-core machine; with
// an empty HOME (no module, build or tools cache) 1 minute 15 seconds idle
// (docs/adopting.md gives the command).
package adoptertest
