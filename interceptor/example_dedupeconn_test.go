package interceptor_test

import (
	"context"
	"fmt"
	"os"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/interceptor"
)

// CheckDedupe at start-up: log what it finds and serve anyway, since the
// Dedupe service may come up later (gated calls fail closed until then).
func ExampleGate_CheckDedupe() {
	dir, _ := os.MkdirTemp("", "example-*")
	defer os.RemoveAll(dir)
	store, err := sqlitestore.Open(context.Background(), dir)
	if err != nil {
		panic(err)
	}
	defer store.Close()
	gate, err := interceptor.New(dedupesvc.NewInProcessClient(dedupesvc.NewServer(store)))
	if err != nil {
		panic(err)
	}
	defer gate.Close(context.Background())

	if err := gate.CheckDedupe(context.Background()); err != nil {
		fmt.Println("the Dedupe service does not serve this tool server yet:", err)
	} else {
		fmt.Println("the Dedupe service serves this tool server")
	}
	// Output: the Dedupe service serves this tool server
}
