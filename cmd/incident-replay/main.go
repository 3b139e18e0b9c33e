// Command incident-replay runs the double-charge incident idemgate grew from
// (a slow charge timed out, the framework retried, the card was charged twice)
// as a reproducible simulation: an agent runtime takes orders (ChargeCard,
// then SendReceipt) through client timeouts, framework auto-retries and model
// re-emissions, without idemgate and with it, and prints what ran.
//
//	incident-replay [-orders 300] [-seed 1] [-database-url postgres://...]
//
// Its result does not depend on the machine's speed: slow responses time out
// in simulated time. An action is either done (with idemgate and
// orchestration keys: its side effect ran exactly once) or counted "not done"
// (every attempt failed). It exits 1 if any action is neither, if the run
// with idemgate and orchestration keys shows a duplicate side effect, if a
// call failed for a reason the simulation did not cause (a quota, a broken
// connection), or if a run with the default configuration does not print
// the table README.md shows (incident.DefaultTable).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/idemgate/idemgate/internal/incident"
	"github.com/idemgate/idemgate/internal/version"
)

func main() {
	os.Exit(run())
}

func run() int {
	var cfg incident.Config
	orders := flag.Int("orders", 300, "orders the simulated agent runtime takes")
	seed := flag.Uint64("seed", 1, "seed of every random draw: the same seed gives the same run")
	flag.IntVar(&cfg.Concurrency, "concurrency", 16, "orders in flight at once")
	flag.StringVar(&cfg.DatabaseURL, "database-url", "", "run the dedupe service on this PostgreSQL; empty uses the embedded store in a temporary directory")
	showVersion := version.Flag(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		version.Print(os.Stdout, "incident-replay")
		return 0
	}
	cfg.Orders, cfg.Seed = *orders, *seed

	if cfg.DatabaseURL == "" {
		dir, err := os.MkdirTemp("", "idemgate-incident-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "incident-replay:", err)
			return 2
		}
		defer os.RemoveAll(dir)
		cfg.DataDir = dir
	}
	report, err := incident.Run(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "incident-replay:", err)
		return 2
	}
	fmt.Print(report.Table())
	fmt.Printf("\n(%s)\n", report.Elapsed.Round(100_000_000))
	if p := report.Problems(); len(p) > 0 {
		fmt.Fprintf(os.Stderr, "incident-replay: this run cannot be trusted (%d problems):\n", len(p))
		for _, line := range p {
			fmt.Fprintln(os.Stderr, "  "+line)
		}
		return 1
	}
	return 0
}
