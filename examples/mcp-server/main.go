// Command mcp-server is an MCP server written natively with the official Go
// SDK whose tools are gated by mcpgate: charge_card runs once per
// idempotency key and replays its result to every retry; get_balance is
// read-only and never gated.
//
//	go run ./examples/mcp-server -dedupe 127.0.0.1:50051 -listen 127.0.0.1:8081   # make run first
//	go run ./examples/mcp-server -data-dir /tmp/mcp-dedupe                         # stdio, embedded store in process
//
// Without -listen it speaks MCP over stdio; with it, stateless streamable
// HTTP at /mcp, on a loopback address only: the example authenticates no
// caller, so its HTTP callers are one tenant (mcpgate.WithSingleTenant).
// Both serve protocol versions 2026-07-28 down to 2024-11-05.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/dedupesvc/embedded"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/httpgate"
	"github.com/idemgate/idemgate/internal/loopback"
	"github.com/idemgate/idemgate/mcpgate"
)

func main() {
	dedupeAddr := flag.String("dedupe", "127.0.0.1:50051", "gRPC `address` of the Dedupe service (plaintext, loopback)")
	dedupeToken := flag.String("dedupe-token", os.Getenv("IDEMGATE_DEDUPE_TOKEN"), "bearer `token` for the Dedupe service (env IDEMGATE_DEDUPE_TOKEN)")
	dataDir := flag.String("data-dir", "", "run a Dedupe service in this process on the embedded store in this `directory`, instead of -dedupe")
	listen := flag.String("listen", "", "serve streamable HTTP on this `address` at /mcp; default: stdio")
	var limits httpgate.ServerLimits // -read-timeout, -max-connections-per-ip and the rest
	limits.RegisterFlags(flag.CommandLine)
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*dedupeAddr, *dedupeToken, *dataDir, *listen, limits, logger); err != nil {
		logger.Error("mcp-server failed", slog.Any("error", err))
		os.Exit(1)
	}
	logger.Info("stopped")
}

func run(dedupeAddr, dedupeToken, dataDir, listen string, limits httpgate.ServerLimits, logger *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var dedupe idemgatev1.DedupeServiceClient
	// Strict: every tool must be annotated or named, so none is gated or
	// left ungated by accident.
	opts := []mcpgate.Option{mcpgate.WithStrict(), mcpgate.WithLogger(logger)}
	if listen != "" {
		if !loopback.Address(listen) {
			return fmt.Errorf("-listen %s is not a loopback address: this example authenticates no caller; serve it on 127.0.0.1, or put auth.RequireBearerToken (go-sdk) in front of its handler and drop WithSingleTenant", listen)
		}
		// Nobody authenticates over HTTP here: every caller on this machine
		// is the one user, so one tenant. With several users, authenticate
		// them (a bearer token naming each) and each is its own tenant.
		opts = append(opts, mcpgate.WithSingleTenant())
	}
	if dataDir != "" {
		// The Dedupe service inside this process, as dedupesvc runs it.
		svc, err := embedded.Start(ctx, embedded.Config{DataDir: dataDir, Logger: logger})
		if err != nil {
			return err
		}
		defer svc.Close() // after gate.Close, deferred below
		dedupe = svc.Client()
	} else {
		dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig)}
		if dedupeToken != "" {
			dial = append(dial, grpc.WithPerRPCCredentials(auth.BearerToken(dedupeToken, true)))
		}
		conn, err := grpc.NewClient(dedupeAddr, dial...)
		if err != nil {
			return err
		}
		defer conn.Close()
		dedupe = idemgatev1.NewDedupeServiceClient(conn)
		// A failing Dedupe RPC makes conn reconnect at once, so a charge in
		// flight renews its lease as soon as a restarted service is back.
		opts = append(opts, mcpgate.WithDedupeConn(conn))
	}

	server := newServer(&ledger{})
	gate, err := mcpgate.New(ctx, dedupe, server, opts...)
	if err != nil {
		return err
	}
	defer func() {
		closing, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Close(closing) // outcomes still being stored
	}()

	if listen == "" {
		logger.Info("serving MCP on stdio")
		err := server.Run(ctx, &mcp.IOTransport{Reader: mcpgate.KeyReader(os.Stdin), Writer: os.Stdout})
		if errors.Is(err, context.Canceled) {
			logger.Info("stopping on a signal")
			return nil
		}
		return err
	}
	mux := http.NewServeMux()
	// Stateless streamable HTTP, with SEP-3182's parameter lifted: serves
	// 2026-07-28 (server/discover) and earlier versions (initialize).
	mux.Handle("/mcp", mcpgate.HTTPHandler(server))
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	// Bound what a caller costs: a slow, idle or never-reading connection
	// is closed, and at most 512 are held at once, 64 per client address
	// (HTTPHandler bounds each body at 4 MiB).
	srv := limits.Server(mux)
	go func() {
		<-ctx.Done()
		logger.Info("stopping on a signal: no new requests, waiting up to 10s for the requests in flight")
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	logger.Info("serving MCP over streamable HTTP", slog.String("address", "http://"+lis.Addr().String()+"/mcp"))
	if err := srv.Serve(limits.Listener(lis)); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ledger counts every side effect, so a retried charge that ran twice shows.
type ledger struct {
	mu      sync.Mutex
	charges map[string]int64 // customer -> charges
	n       int
	// prefix, drawn once, makes this process's charge ids its own: the
	// Dedupe service replays a charge id across restarts of this server.
	prefix string
}

// charge is the side effect. Like a real provider client it sends nothing
// on a context that has already ended (the gate ended it: the execution
// timeout, or the attempt lost its reservation), and reports the context's
// error, which the gate treats as an unknown outcome.
func (l *ledger) charge(ctx context.Context, in chargeIn) (chargeOut, error) {
	if err := ctx.Err(); err != nil {
		return chargeOut{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.charges == nil {
		l.charges = map[string]int64{}
		var b [5]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		l.prefix = strings.ToLower(base32.StdEncoding.EncodeToString(b[:]))
	}
	l.n++
	l.charges[in.CustomerID]++
	return chargeOut{ChargeID: fmt.Sprintf("ch_%s_%06d", l.prefix, l.n), CustomerID: in.CustomerID, AmountCents: in.AmountCents}, nil
}

type chargeIn struct {
	CustomerID  string `json:"customerId" jsonschema:"the customer to charge"`
	AmountCents int64  `json:"amountCents" jsonschema:"the amount, in cents"`
	OrderID     string `json:"orderId,omitempty" jsonschema:"the idempotency key of this charge: a fresh unique id (a new UUID) for each charge you intend to make, reused only to retry that same charge; never a customer id or another charge's id"`
	Note        string `json:"note,omitempty" jsonschema:"free text, not part of the action (left out of the fingerprint)"`
}

type chargeOut struct {
	ChargeID    string `json:"chargeId"`
	CustomerID  string `json:"customerId"`
	AmountCents int64  `json:"amountCents"`
}

type balanceIn struct {
	CustomerID string `json:"customerId"`
}

type balanceOut struct {
	CustomerID string `json:"customerId"`
	Charges    int64  `json:"charges"`
}

func newServer(l *ledger) *mcp.Server {
	server := mcp.NewServer(&mcp.Implementation{Name: "payments-mcp", Version: "1"}, nil)
	schema, err := jsonschema.For[chargeIn](nil)
	if err != nil {
		panic(err)
	}
	// The order id carries the key, mirrored at 2026-07-28 into the
	// Mcp-Param-Idempotency-Key header (SEP-2243's x-mcp-header, which the
	// SDK checks against the argument), and the note is not part of the
	// action.
	schema.Properties["orderId"].Extra = map[string]any{mcpgate.SchemaKey: true, "x-mcp-header": "Idempotency-Key"}
	schema.Properties["note"].Extra = map[string]any{mcpgate.SchemaExclude: true}
	destructive := true
	mcp.AddTool(server, &mcp.Tool{
		Name: "charge_card",
		Description: "Charges a card. Runs once per idempotency key: send it as orderId (or in _meta[\"" + mcpgate.MetaKey + "\"]), " +
			"a fresh unique id for each charge you intend to make, the same id again only to retry that same charge. " +
			"A second charge sent with a used id is not made: it gets the first charge's result.",
		InputSchema: schema,
		// Not read-only, not idempotent by itself: gated.
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &destructive},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in chargeIn) (*mcp.CallToolResult, chargeOut, error) {
		out, err := l.charge(ctx, in)
		return nil, out, err
	})
	mcp.AddTool(server, &mcp.Tool{
		Name:        "get_balance",
		Description: "Reads how often a customer was charged. Read-only: needs no key.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, func(_ context.Context, _ *mcp.CallToolRequest, in balanceIn) (*mcp.CallToolResult, balanceOut, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return nil, balanceOut{CustomerID: in.CustomerID, Charges: l.charges[in.CustomerID]}, nil
	})
	return server
}
