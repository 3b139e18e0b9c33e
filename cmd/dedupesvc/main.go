// Command dedupesvc runs the idemgate Dedupe gRPC service: on PostgreSQL when
// DATABASE_URL (or -database-url) is set, else on the embedded SQLite store in
// the data directory, which needs no set-up.
//
//	dedupesvc [flags]                 serve (migrating first unless -migrate-on-start=false)
//	dedupesvc [flags] migrate         apply pending migrations and exit (-grant-runtime-role NAME: and grant NAME what serving needs)
//	dedupesvc [flags] migrate status  list migrations and whether each is applied, changing nothing
//	dedupesvc [flags] create-database create the PostgreSQL database -database-url names, if missing
//
// Flags may also follow the command. Every flag also reads an environment
// variable; run dedupesvc -h for both. dedupesvc -version prints the version
// and the commit it was built from.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/internal/dedupeapp"
	"github.com/idemgate/idemgate/internal/version"
	"github.com/idemgate/idemgate/migrations"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// synopsis is what -h prints above the flags.
const synopsis = `  dedupesvc [flags]                 serve the Dedupe service (migrating first unless -migrate-on-start=false)
  dedupesvc [flags] migrate         apply pending migrations and exit (-grant-runtime-role NAME: then grant
                                    that role what the service needs at run time, printing each GRANT)
  dedupesvc [flags] migrate status  list the migrations and whether each is applied; changes nothing
                                    (on the embedded store it opens the file read-only and never creates it)
  dedupesvc [flags] create-database create the PostgreSQL database -database-url names unless it exists
                                    (connecting to the server's postgres database; needs the CREATEDB right)

The store is PostgreSQL when -database-url (DATABASE_URL) is set, else the embedded SQLite store
in -data-dir. Flags may come before or after the command.
`

func run(args []string, stdout, stderr io.Writer) int {
	cfg, words, err := dedupeapp.ParseArgs("dedupesvc", synopsis, args, os.LookupEnv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if errors.Is(err, version.ErrRequested) {
		version.Print(stdout, "dedupesvc")
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "dedupesvc:", err)
		return 2
	}
	command := strings.Join(words, " ")
	switch command {
	case "", "migrate", "migrate status", "create-database":
	default:
		fmt.Fprintf(stderr, "dedupesvc: unknown command %q; the commands are migrate, migrate status and create-database, or none to serve (dedupesvc -h)\n", command)
		return 2
	}
	if cfg.GrantRuntimeRole != "" && (command != "migrate" || cfg.DatabaseURL == "") {
		fmt.Fprintln(stderr, "dedupesvc: -grant-runtime-role (IDEMGATE_GRANT_RUNTIME_ROLE) is for the migrate command on PostgreSQL (-database-url)")
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch command {
	case "create-database":
		err = createDatabase(ctx, cfg.DatabaseURL, stdout)
	case "migrate", "migrate status":
		err = migrate(ctx, cfg, logger, command == "migrate status", stdout)
	default:
		logger.Info("dedupesvc starting", version.Attr())
		// Listens only once it can serve: a TCP readiness check on -listen
		// passes after the migrations, not during them.
		err = dedupeapp.ListenAndServe(ctx, cfg, logger)
	}
	if err != nil {
		logger.Error("dedupesvc failed", slog.Any("error", err))
		return 1
	}
	return 0
}

func migrate(ctx context.Context, cfg dedupeapp.Config, logger *slog.Logger, showStatus bool, stdout io.Writer) error {
	if cfg.DatabaseURL == "" {
		if showStatus {
			return embeddedStatus(ctx, cfg.DataDir, stdout)
		}
		// The embedded store migrates whenever it opens.
		s, err := dedupeapp.OpenEmbedded(ctx, cfg.DataDir)
		if err != nil {
			return err
		}
		defer s.Close()
		all, err := migrations.List(migrations.SQLite, "sqlite")
		if err != nil {
			return err
		}
		for _, m := range all {
			fmt.Fprintf(stdout, "%-8s %s (sqlite: %s)\n", "applied", m.Name, s.Path())
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
			fmt.Fprintf(stdout, "%-8s %s\n", state, m.Name)
		}
		return nil
	}
	applied, err := pgstore.Migrate(ctx, pool)
	if err != nil {
		return err
	}
	logger.Info("migrations applied", slog.Any("applied", applied))
	if cfg.GrantRuntimeRole != "" {
		granted, err := pgstore.GrantRuntimeRole(ctx, pool, cfg.GrantRuntimeRole)
		if err != nil {
			return fmt.Errorf("-grant-runtime-role %s: %w", cfg.GrantRuntimeRole, err)
		}
		for _, stmt := range granted {
			fmt.Fprintln(stdout, stmt)
		}
	}
	return nil
}

// createDatabase creates the database databaseURL names unless it exists,
// and says which on stdout.
func createDatabase(ctx context.Context, databaseURL string, stdout io.Writer) error {
	if databaseURL == "" {
		return errors.New("create-database is for PostgreSQL: set -database-url (DATABASE_URL); the embedded store is created when it opens")
	}
	created, err := dedupeapp.CreateDatabase(ctx, databaseURL)
	if err != nil {
		return err
	}
	cfg, _ := pgx.ParseConfig(databaseURL) // parsed by CreateDatabase already
	if created {
		fmt.Fprintf(stdout, "created database %q\n", cfg.Database)
	} else {
		fmt.Fprintf(stdout, "database %q exists\n", cfg.Database)
	}
	return nil
}

// embeddedStatus prints the embedded store's migrations, read-only: a
// missing database is reported, not created.
func embeddedStatus(ctx context.Context, dir string, stdout io.Writer) error {
	report, err := sqlitestore.Status(ctx, dir)
	if err != nil {
		return fmt.Errorf("-data-dir %s: %w", dir, err)
	}
	if !report.Exists {
		fmt.Fprintf(stdout, "database does not exist: %s (dedupesvc migrate, or starting the service, creates it and applies every migration below)\n", report.Path)
	}
	for _, m := range report.Migrations {
		state := "pending"
		if m.Applied {
			state = "applied"
		}
		fmt.Fprintf(stdout, "%-8s %s (sqlite: %s)\n", state, m.Name, report.Path)
	}
	return nil
}
