// Command dedupesvc runs the idemgate Dedupe gRPC service: on PostgreSQL when
// DATABASE_URL (or -database-url) is set, else on the embedded SQLite store in
// the data directory, which needs no set-up.
//
//	dedupesvc [flags]            serve (migrating first unless -migrate-on-start=false)
//	dedupesvc migrate [flags]    apply pending migrations and exit
//	dedupesvc migrate status     list migrations and whether each is applied
//
// Every flag also reads an environment variable; run dedupesvc -h for both.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/migrations"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	command := "serve"
	if len(args) > 0 && args[0] == "migrate" {
		command, args = "migrate", args[1:]
	}
	showStatus := false
	if command == "migrate" && len(args) > 0 && args[0] == "status" {
		showStatus, args = true, args[1:]
	}
	cfg, err := dedupeapp.ParseConfig("dedupesvc", args, os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dedupesvc:", err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch {
	case command == "migrate":
		err = migrate(ctx, cfg, logger, showStatus)
	default:
		var lis net.Listener
		lis, err = net.Listen("tcp", cfg.Listen)
		if err == nil {
			err = dedupeapp.Serve(ctx, cfg, lis, logger)
		}
	}
	if err != nil {
		logger.Error("dedupesvc failed", slog.Any("error", err))
		return 1
	}
	return 0
}

func migrate(ctx context.Context, cfg dedupeapp.Config, logger *slog.Logger, showStatus bool) error {
	if cfg.DatabaseURL == "" {
		// The embedded store migrates whenever it opens.
		s, err := sqlitestore.Open(ctx, cfg.DataDir)
		if err != nil {
			return err
		}
		defer s.Close()
		all, err := migrations.List(migrations.SQLite, "sqlite")
		if err != nil {
			return err
		}
		for _, m := range all {
			fmt.Printf("%-8s %s (sqlite: %s)\n", "applied", m.Name, s.Path())
		}
		return nil
	}
	pool, err := dedupeapp.OpenPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if showStatus {
		status, err := pgstore.Status(ctx, pool)
		if err != nil {
			return err
		}
		for _, m := range status {
			state := "pending"
			if m.Applied {
				state = "applied"
			}
			fmt.Printf("%-8s %s\n", state, m.Name)
		}
		return nil
	}
	applied, err := pgstore.Migrate(ctx, pool)
	if err != nil {
		return err
	}
	logger.Info("migrations applied", slog.Any("applied", applied))
	return nil
}
