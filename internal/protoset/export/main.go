// Command export writes what a caller in another language needs to call the
// example payments tool and decode idemgate's error details: the descriptor
// set of protoset.Callers and, with -sources, idemgate's .proto sources
// (proto/ without the test services). `make protos-export` runs it; it
// needs neither buf nor protoc, so the Python and TypeScript routes build
// only this small program.
//
//	go run ./internal/protoset/export -o protos/idemgate-callers.binpb -sources protos
package main

import (
	"flag"
	"fmt"
	"os"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "github.com/idemgate/idemgate/gen/idemgate/v1" // registers idemgate/v1's files, for -sources
	"github.com/idemgate/idemgate/internal/protoset"
)

func main() {
	out := flag.String("o", "idemgate-callers.binpb", "`file` to write the FileDescriptorSet to")
	sources := flag.String("sources", "", "`directory` to copy idemgate's .proto sources into (empty: none)")
	protoDir := flag.String("proto", "proto", "`directory` of the .proto sources, the repository's proto/")
	flag.Parse()
	if err := run(*out, *protoDir, *sources); err != nil {
		fmt.Fprintln(os.Stderr, "export:", err)
		os.Exit(1)
	}
}

func run(out, protoDir, sources string) error {
	if sources != "" {
		if _, err := protoset.ExportSources(protoregistry.GlobalFiles, protoDir, sources); err != nil {
			return err
		}
	}
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
