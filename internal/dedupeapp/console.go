package dedupeapp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/internal/console"
	"github.com/idemgate/idemgate/internal/httplimits"
	"github.com/idemgate/idemgate/internal/loopback"
	"github.com/idemgate/idemgate/internal/outcomejson"
	"github.com/idemgate/idemgate/internal/tlsfiles"
)

// serveConsole serves the operator console on cfg.ConsoleListen until the
// returned function is called: over TLS with the service's certificate
// (and its client CAs, for admin certificates) when -tls-cert is set,
// behind the HTTP listeners' limits (timeouts, connection caps). It refuses
// to start without a way to sign in: an admin token in the token file, or
// admin identities with client CAs. descriptors, from consoleDescriptors,
// may be nil.
func serveConsole(cfg Config, svc *service, admin *dedupesvc.AdminServer, authenticator *auth.Authenticator, descriptors *protoregistry.Files, logger *slog.Logger) (func(), error) {
	name := cfg.name("console-listen")
	if authenticator == nil {
		return nil, fmt.Errorf("%s needs authentication: %s with an admin token, or %s with %s", name, cfg.name("token-file"), cfg.name("admin-identities"), cfg.name("tls-client-ca"))
	}
	// ParseConfig refuses this too; a Config built in Go may not have been
	// validated.
	if !loopback.Address(cfg.ConsoleListen) && cfg.TLSCert == "" {
		return nil, fmt.Errorf("%s %s is not a loopback address: serve the console over TLS (%s, %s)", name, cfg.ConsoleListen, cfg.name("tls-cert"), cfg.name("tls-key"))
	}
	if err := checkConsoleCredentials(cfg); err != nil {
		return nil, err
	}
	var tlsConfig *tls.Config
	if cfg.TLSCert != "" {
		pair, err := tlsfiles.NewKeyPair("-tls-cert/-tls-key", cfg.TLSCert, cfg.TLSKey, tlsfiles.WithLogger(logger))
		if err != nil {
			return nil, err
		}
		base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
		var clientCAs *tlsfiles.CAPool
		if cfg.TLSClientCA != "" {
			if clientCAs, err = tlsfiles.NewCAPool("-tls-client-ca", cfg.TLSClientCA, tlsfiles.WithLogger(logger)); err != nil {
				return nil, err
			}
			// A browser without a certificate signs in with a token.
			base.ClientAuth = tls.VerifyClientCertIfGiven
		}
		tlsConfig = tlsfiles.ServerConfig(base, pair, clientCAs)
	}
	usage, _ := svc.store.(dedupesvc.UsageLister)
	c, err := console.New(console.Config{Admin: admin, Authenticator: authenticator, Logger: logger, SecureCookies: tlsConfig != nil,
		Usage: usage, MaxRecords: cfg.CallerMaxRecords, MaxBytes: cfg.CallerMaxBytes, Metrics: svc.registry, Health: storeHealth(cfg, svc.backend),
		Descriptors: descriptors})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.ConsoleListen)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, cfg.ConsoleListen, err)
	}
	// The HTTP listeners' defaults (timeouts, 512 connections, 64 per
	// client address); request bodies are bounded by the console itself.
	limits := httplimits.Limits{ReadHeaderTimeout: 5 * time.Second}
	srv := limits.Server(c)
	served := limits.Listener(lis)
	scheme := "http"
	if tlsConfig != nil {
		served, scheme = tls.NewListener(served, tlsConfig), "https"
	}
	go func() {
		if err := srv.Serve(served); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("operator console failed", slog.Any("error", err))
		}
	}()
	logger.Info("operator console serving", slog.String("address", scheme+"://"+lis.Addr().String()+"/"))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		c.Close()
	}, nil
}

// consoleDescriptors reads cfg.ConsoleDescriptors, nil when it is not set
// or the console is off. A file that cannot be read or is not a
// FileDescriptorSet is an error naming the setting.
func consoleDescriptors(cfg Config) (*protoregistry.Files, error) {
	if cfg.ConsoleDescriptors == "" || cfg.ConsoleListen == "" {
		return nil, nil
	}
	return outcomejson.ReadFile(cfg.name("console-descriptors"), cfg.ConsoleDescriptors)
}

// checkConsoleCredentials refuses a console nobody could sign in to: no
// admin token in the token file, and no admin identities with client CAs
// to verify their certificates.
func checkConsoleCredentials(cfg Config) error {
	if len(cfg.AdminIdentities) > 0 && cfg.TLSClientCA != "" {
		return nil
	}
	if cfg.TokenFile != "" {
		tokens, err := readTokenFile(cfg.TokenFile)
		if err != nil {
			return err
		}
		for _, t := range tokens {
			if t.Admin {
				return nil
			}
		}
		return fmt.Errorf("%s: nobody could sign in: %s %s has no token with the admin role (\"name admin secret\"), and no %s with %s is set",
			cfg.name("console-listen"), cfg.name("token-file"), cfg.TokenFile, cfg.name("admin-identities"), cfg.name("tls-client-ca"))
	}
	return fmt.Errorf("%s: nobody could sign in: set %s with an admin token, or %s with %s", cfg.name("console-listen"), cfg.name("token-file"), cfg.name("admin-identities"), cfg.name("tls-client-ca"))
}

// storeHealth is the overview's check of the store b: what the service can
// see through its own connections, nothing it would have to be told.
func storeHealth(cfg Config, b backend) func(context.Context) console.StoreHealth {
	if b.pool == nil {
		return func(ctx context.Context) console.StoreHealth {
			h := console.StoreHealth{Store: "embedded store (SQLite) in " + cfg.DataDir}
			inspector, ok := b.store.(dedupesvc.Inspector)
			if !ok {
				h.Detail = "it cannot be checked"
				return h
			}
			if _, _, err := inspector.MigrationStatus(ctx); err != nil {
				h.Detail = "reading it failed: " + err.Error() + "; check the disk under " + cfg.name("data-dir")
				return h
			}
			h.OK, h.Detail = true, "read and migrated"
			return h
		}
	}
	citus, _ := b.store.(interface{ IsCitus() bool })
	return func(ctx context.Context) console.StoreHealth {
		return console.PostgresHealth(ctx, b.pool, citus != nil && citus.IsCitus())
	}
}
