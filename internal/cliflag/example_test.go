package cliflag_test

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/idemgate/idemgate/internal/cliflag"
)

func Example() {
	fs := flag.NewFlagSet("dedupesvc", flag.ContinueOnError)
	interval := fs.Duration("sweep-interval", time.Minute, "pause between sweeps")
	url := fs.String("database-url", "", "PostgreSQL connection `URL`")
	env := map[string]string{"IDEMGATE_SWEEP_INTERVAL": "30s", "DATABASE_URL": "postgres://db/idemgate"}
	e := cliflag.Bind(fs, "IDEMGATE_", cliflag.Map(env), cliflag.WithName("database-url", "DATABASE_URL"))
	if err := e.Parse([]string{"-sweep-interval", "5s"}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(*interval, *url)
	fs.SetOutput(os.Stdout)
	fs.PrintDefaults()
	// Output:
	// 5s postgres://db/idemgate
	//   -database-url URL
	//     	PostgreSQL connection URL (env DATABASE_URL)
	//   -sweep-interval duration
	//     	pause between sweeps (env IDEMGATE_SWEEP_INTERVAL) (default 1m0s)
}

func ExampleEnv_Apply() {
	fs := flag.NewFlagSet("payments-server", flag.ContinueOnError)
	fs.Bool("reflection", false, "serve gRPC server reflection")
	fs.Int("replay-cache-entries", 0, "outcomes kept in memory")
	env := map[string]string{"PAYMENTS_REFLECTION": "maybe", "PAYMENTS_REPLAY_CACHE_ENTRIES": "lots"}
	e := cliflag.Bind(fs, "PAYMENTS_", cliflag.Map(env))
	fmt.Println(e.Parse(nil))
	// Output:
	// PAYMENTS_REFLECTION="maybe" (-reflection): parse error, want true or false; fix the variable, unset it, or give -reflection
	// PAYMENTS_REPLAY_CACHE_ENTRIES="lots" (-replay-cache-entries): parse error, want a whole number; fix the variable, unset it, or give -replay-cache-entries
}
