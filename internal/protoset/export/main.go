// Command export writes the descriptor set of protoset.Callers to a file:
// what a caller in another language needs to call the example payments tool
// and decode idemgate's error details. `make protos-export` runs it.
//
//	go run ./internal/protoset/export -o protos/idemgate-callers.binpb
package main

import (
	"flag"
	"fmt"
	"os"

	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate/internal/protoset"
)

func main() {
	out := flag.String("o", "idemgate-callers.binpb", "`file` to write the FileDescriptorSet to")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "export:", err)
		os.Exit(1)
	}
}

func run(out string) error {
	set, err := protoset.Callers()
	if err != nil {
		return err
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(set)
	if err != nil {
		return err
	}
	return os.WriteFile(out, b, 0o644)
}
