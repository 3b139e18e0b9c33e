// Command idemgate-mcp serves the methods of a gated gRPC tool server as MCP
// tools: it reads the server's services (from a descriptor set, or by server
// reflection), lists each unary method as a tool with a JSON Schema of its
// request and annotations from its idemgate policy, and forwards each
// tools/call as a gRPC call carrying the caller's idempotency key.
//
//	idemgate-mcp -target 127.0.0.1:50052 -plaintext [-descriptor-set payments.binpb] [-listen 127.0.0.1:8080]
//
// Without -listen it speaks MCP over stdio (newline-delimited JSON-RPC on
// stdin and stdout; logs on stderr); with it, streamable HTTP at /mcp,
// stateless (no Mcp-Session-Id; each POST stands alone). Both serve
// protocol versions 2026-07-28 (server/discover) down to 2024-11-05
// (initialize). -key-argument idempotency_key adds a required key argument
// to every gated tool, for hosts that send only the model's arguments and
// never _meta.
//
// Over HTTP every caller's call reaches the tool server under the bridge's
// own -token, so it forwards the key of a caller authenticated by
// -caller-token-file as "<name>/<key>" (one caller's key never answers
// another's call) and refuses such a caller's keyless calls to gated tools;
// -listen on an address that is not loopback needs
// -caller-token-file (each caller sends one of its bearer tokens) and
// -listen-tls-cert and -listen-tls-key (or -listen-insecure-plaintext, for a
// network that is trusted): the bridge refuses to start otherwise. The HTTP
// server bounds what a caller can cost it: -max-body-bytes (4 MiB, the MCP
// SDK's limit; a longer body gets 413 before it is read),
// -read-header-timeout (10s), -read-timeout (30s: a body trickled slower is
// cut), -write-timeout (30s: a caller that reads nothing of its answer this
// long is dropped), -idle-timeout (2m), -max-connections (512),
// -max-connections-per-ip (64; past it the caller's idle connections are
// closed first, then its new ones), -max-buffered-bytes (256 MiB of
// bodies held at once; past it a body gets 503) and
// -max-buffered-bytes-per-ip (32 MiB of them for one client address), and
// -max-answer-bytes (256 MiB of answers held at once, from the tool
// server's response until the answer is written; past it a call is
// answered MCP_ANSWER_BUDGET_EXHAUSTED, and a retry with the same key
// replays it) and -max-answer-bytes-per-ip (32 MiB of them for one client
// address): callers that never read their answers hold at most those, and
// leave the others room. It is stateless, so it keeps no sessions to
// expire.
//
// To a tool server that requires mutual TLS the bridge presents -tls-cert
// and -tls-key (reread when they change), and that tool server's gate
// names the bridge's tenant by the certificate.
//
// Every flag also reads an environment variable, IDEMGATE_MCP_ and its name
// (IDEMGATE_MCP_TARGET, IDEMGATE_MCP_LISTEN, ...; -token reads
// IDEMGATE_MCP_TARGET_TOKEN); the flag wins. idemgate-mcp -h lists them.
// idemgate-mcp -version prints the version and the commit it was built
// from.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/reflect/protoregistry"

	dedupeauth "github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/httplimits"
	"github.com/idemgate/idemgate/internal/loopback"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/mcpwire"
	"github.com/idemgate/idemgate/internal/tlsfiles"
	"github.com/idemgate/idemgate/internal/tokenfile"
	"github.com/idemgate/idemgate/internal/version"
)

type flags struct {
	target, descriptorSet, services, listen string
	plaintext                               bool
	caFile, serverName                      string
	certFile, keyFile                       string // the bridge's client certificate
	token                                   string
	callTimeout                             time.Duration
	keyArgument, keyArgumentTools           string
	// The HTTP listener's (-listen) limits and its callers' authentication.
	maxBodyBytes, maxBufferedBytes               int64
	maxBufferedBytesPerIP                        int64
	maxAnswerBytes, maxAnswerBytesPerIP          int64
	http                                         httplimits.Limits
	callerTokenFile, listenTLSCert, listenTLSKey string
	listenInsecurePlaintext                      bool
}

func main() {
	f, err := parseFlags(os.Args[1:], os.LookupEnv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if errors.Is(err, version.ErrRequested) {
		version.Print(os.Stdout, "idemgate-mcp")
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemgate-mcp:", err)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(f, logger); err != nil {
		logger.Error("idemgate-mcp failed", slog.Any("error", err))
		os.Exit(1)
	}
	logger.Info("stopped")
}

// parseFlags reads args (without the program name) and, for each flag not
// given, its variable IDEMGATE_MCP_<FLAG> through lookupEnv (-token's is
// IDEMGATE_MCP_TARGET_TOKEN). It returns flag.ErrHelp after printing usage
// to usage for -h, and version.ErrRequested for -version, checking nothing
// else.
func parseFlags(args []string, lookupEnv func(string) (string, bool), usage io.Writer) (flags, error) {
	fs := flag.NewFlagSet("idemgate-mcp", flag.ContinueOnError)
	fs.SetOutput(usage)
	var f flags
	fs.StringVar(&f.target, "target", "", "gRPC `address` of the tool server; required")
	fs.StringVar(&f.descriptorSet, "descriptor-set", "", "FileDescriptorSet `file` with the tool server's services (buf build -o); default: ask the server by reflection")
	fs.StringVar(&f.services, "services", "", "comma-separated full `names` of the services to serve; default: all but grpc.*")
	fs.StringVar(&f.listen, "listen", "", "serve streamable HTTP on this `address` at /mcp; default: stdio")
	fs.BoolVar(&f.plaintext, "plaintext", false, "connect to the tool server without TLS (loopback only)")
	fs.StringVar(&f.caFile, "tls-ca", "", "PEM `file` of the CAs that sign the tool server's certificate, reread when it changes; default: the system's")
	fs.StringVar(&f.serverName, "tls-server-name", "", "`name` to verify the tool server's certificate against; default: the target's host")
	fs.StringVar(&f.certFile, "tls-cert", "", "client certificate `file` (PEM) presented to the tool server, reread when it changes; with -tls-key; default: none")
	fs.StringVar(&f.keyFile, "tls-key", "", "key `file` (PEM) of -tls-cert, reread when it changes")
	fs.StringVar(&f.token, "token", "", "bearer `token` sent to the tool server")
	fs.DurationVar(&f.callTimeout, "call-timeout", 60*time.Second, "deadline of each forwarded call")
	fs.StringVar(&f.keyArgument, "key-argument", "", "add a required key argument of this `name` (such as "+mcpbridge.DefaultKeyArgument+") to every gated tool, for hosts that never set _meta; default: none")
	fs.StringVar(&f.keyArgumentTools, "key-argument-tools", "", "comma-separated full `names` of the gated tools that get -key-argument; default: every gated tool")
	fs.Int64Var(&f.maxBodyBytes, "max-body-bytes", mcpwire.DefaultMaxBodyBytes, "largest HTTP request body; a longer one gets 413, before it is read when its Content-Length says so")
	f.http.RegisterFlags(fs)
	fs.Int64Var(&f.maxBufferedBytes, "max-buffered-bytes", mcpwire.DefaultMaxBufferedBytes, "bytes of HTTP request bodies held at once, across requests, taken as they arrive; a body that would pass it gets 503")
	fs.Int64Var(&f.maxBufferedBytesPerIP, "max-buffered-bytes-per-ip", mcpwire.DefaultMaxBufferedBytesPerIP, "bytes of HTTP request bodies one client address (an IPv6 one's /64) holds at once, within -max-buffered-bytes; a body that would pass it gets 503")
	fs.Int64Var(&f.maxAnswerBytes, "max-answer-bytes", mcpwire.DefaultMaxAnswerBytes, "bytes of tools/call answers held at once over HTTP, across requests, from the tool server's response until the answer is written (or its writing fails); a call whose answer would pass it is answered "+mcpwire.ReasonAnswerBudgetExhausted+" (it ran: a retry with the same key replays it)")
	fs.Int64Var(&f.maxAnswerBytesPerIP, "max-answer-bytes-per-ip", mcpwire.DefaultMaxAnswerBytesPerIP, "bytes of tools/call answers one client address (an IPv6 one's /64) holds at once, within -max-answer-bytes; a call whose answer would pass it is answered "+mcpwire.ReasonAnswerBudgetExhausted+", one larger than it "+mcpwire.ReasonAnswerTooLarge)
	fs.StringVar(&f.callerTokenFile, "caller-token-file", "", "`file` of the bearer tokens HTTP callers must send, \"name secret\" per line; required for a -listen address that is not loopback")
	fs.StringVar(&f.listenTLSCert, "listen-tls-cert", "", "certificate `file` (PEM) of the HTTP listener, reread when it changes; with -listen-tls-key, serves HTTPS")
	fs.StringVar(&f.listenTLSKey, "listen-tls-key", "", "key `file` (PEM) of the HTTP listener, reread when it changes")
	fs.BoolVar(&f.listenInsecurePlaintext, "listen-insecure-plaintext", false, "allow plain HTTP on a -listen address that is not loopback: the callers' tokens cross the network readable")
	env := cliflag.Bind(fs, "IDEMGATE_MCP_", lookupEnv, cliflag.WithName("token", "IDEMGATE_MCP_TARGET_TOKEN"))
	showVersion := version.Flag(fs) // after Bind: no variable
	if err := fs.Parse(args); err != nil {
		return flags{}, err
	}
	if *showVersion {
		return flags{}, version.ErrRequested
	}
	if err := env.Apply(); err != nil {
		return flags{}, err
	}
	return f, check(f)
}

// limits is the HTTP listener's limits.
func (f flags) limits() mcpwire.HTTPLimits {
	return mcpwire.HTTPLimits{Limits: f.http, MaxBodyBytes: f.maxBodyBytes, MaxBufferedBytes: f.maxBufferedBytes, MaxBufferedBytesPerIP: f.maxBufferedBytesPerIP,
		MaxAnswerBytes: f.maxAnswerBytes, MaxAnswerBytesPerIP: f.maxAnswerBytesPerIP}
}

// check refuses flags that do not go together, and a -listen address
// anyone on the network reaches without authentication or TLS: every
// call there reaches the tool server under the bridge's own -token.
func check(f flags) error {
	var errs []error
	if err := f.limits().Check("-"); err != nil {
		errs = append(errs, err)
	}
	if (f.certFile == "") != (f.keyFile == "") {
		errs = append(errs, errors.New("-tls-cert and -tls-key go together"))
	}
	if f.plaintext && (f.certFile != "" || f.keyFile != "") {
		errs = append(errs, errors.New("-tls-cert and -tls-key are a client certificate for TLS to the tool server: not with -plaintext"))
	}
	if (f.listenTLSCert == "") != (f.listenTLSKey == "") {
		errs = append(errs, errors.New("-listen-tls-cert and -listen-tls-key go together"))
	}
	if f.listen == "" && (f.callerTokenFile != "" || f.listenTLSCert != "") {
		errs = append(errs, errors.New("-caller-token-file, -listen-tls-cert and -listen-tls-key need -listen: over stdio the bridge has one caller, the process that started it"))
	}
	if f.listen != "" && !loopback.Address(f.listen) {
		if f.callerTokenFile == "" {
			errs = append(errs, fmt.Errorf("-listen %s is not a loopback address: configure -caller-token-file so HTTP callers authenticate (every call reaches the tool server under the bridge's own -token)", f.listen))
		}
		if f.listenTLSCert == "" && !f.listenInsecurePlaintext {
			errs = append(errs, fmt.Errorf("-listen %s is not a loopback address: serve TLS (-listen-tls-cert, -listen-tls-key) or set -listen-insecure-plaintext", f.listen))
		}
	}
	return errors.Join(errs...)
}

// readCallerTokens reads -caller-token-file: one "name secret" a line
// (tokenfile.Read); a name must pass mcpbridge.CheckCallerName (the bridge
// stores a caller's keys as "<name>/<key>").
func readCallerTokens(file string) (map[string]string, error) {
	return tokenfile.Read("-caller-token-file", file, mcpbridge.CheckCallerName)
}

func run(f flags, logger *slog.Logger) error {
	if f.target == "" {
		return errors.New("-target is required")
	}
	var tokens map[string]string // secret -> caller name; read first, so a bad file fails before any connection
	if f.callerTokenFile != "" {
		var err error
		if tokens, err = readCallerTokens(f.callerTokenFile); err != nil {
			return err
		}
	}
	logger.Info("idemgate-mcp starting", version.Attr())
	var pair *tlsfiles.KeyPair // the client certificate, read before any connection
	if f.certFile != "" {
		// Reread when they change: a renewed certificate is presented on
		// the next connection to the tool server, with no restart.
		var err error
		if pair, err = tlsfiles.NewKeyPair("-tls-cert/-tls-key", f.certFile, f.keyFile, tlsfiles.WithLogger(logger)); err != nil {
			return err
		}
	}
	var dial []grpc.DialOption
	if f.plaintext {
		dial = append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		var roots *tlsfiles.CAPool // nil: the system's
		if f.caFile != "" {
			// Reread when it changes, for the connections made after.
			var err error
			if roots, err = tlsfiles.NewCAPool("-tls-ca", f.caFile, tlsfiles.WithLogger(logger)); err != nil {
				return err
			}
		}
		// With a client certificate, mutual TLS: the tool server's gate
		// names the bridge's tenant by it (interceptor.PeerTenant).
		cfg := &tls.Config{ServerName: f.serverName, MinVersion: tls.VersionTLS12}
		dial = append(dial, grpc.WithTransportCredentials(newToolCreds(cfg, roots, pair)))
	}
	if f.token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(dedupeauth.BearerToken(f.token, f.plaintext)))
	}
	conn, err := grpc.NewClient(f.target, dial...)
	if err != nil {
		return fmt.Errorf("tool server client: %w", err)
	}
	defer conn.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var files *protoregistry.Files
	if f.descriptorSet != "" {
		files, err = mcpbridge.LoadDescriptorSet(f.descriptorSet)
	} else {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		files, err = mcpbridge.LoadReflection(rctx, conn)
		cancel()
	}
	if err != nil {
		return err
	}
	cfg := mcpbridge.Config{Conn: conn, Files: files, CallTimeout: f.callTimeout, Logger: logger}
	if f.services != "" {
		cfg.Services = strings.Split(f.services, ",")
	}
	cfg.KeyArgument = f.keyArgument
	if f.keyArgumentTools != "" {
		cfg.KeyArgumentTools = strings.Split(f.keyArgumentTools, ",")
	}
	server, err := mcpbridge.New(cfg)
	if err != nil {
		return err
	}
	methods, _ := mcpbridge.Methods(cfg)
	for _, m := range methods {
		attrs := []any{slog.String("name", m.Tool.Name), slog.String("policy", m.Class.String())}
		if m.KeyArgument != "" {
			attrs = append(attrs, slog.String("key_argument", m.KeyArgument))
		}
		logger.Info("tool", attrs...)
	}

	if f.listen == "" {
		logger.Info("serving MCP on stdio", slog.String("target", f.target))
		err := server.Run(ctx, &mcp.IOTransport{Reader: mcpbridge.KeyReader(os.Stdin), Writer: os.Stdout})
		if errors.Is(err, context.Canceled) {
			logger.Info("stopping on a signal")
			return nil
		}
		return err
	}
	limits := f.limits().WithDefaults()
	var handler http.Handler = mcpbridge.HTTPHandler(server, limits) // stateless: serves 2026-07-28 and earlier
	if tokens != nil {
		handler = mcpbridge.CallerAuth(tokens, handler)
		logger.Info("HTTP callers authenticate with a bearer token; each caller's keys are forwarded as <name>/<key>", slog.Int("tokens", len(tokens)))
	}
	var listenPair *tlsfiles.KeyPair
	if f.listenTLSCert != "" {
		// Reread when they change: a renewed certificate reaches the
		// connections made after it, with no restart.
		if listenPair, err = tlsfiles.NewKeyPair("-listen-tls-cert/-listen-tls-key", f.listenTLSCert, f.listenTLSKey, tlsfiles.WithLogger(logger)); err != nil {
			return err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", handler)
	lis, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	srv := limits.Server(mux)
	go func() {
		<-ctx.Done()
		logger.Info("stopping on a signal: no new requests, waiting up to 10s for the requests in flight")
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	scheme := "http://"
	serve := func() error { return srv.Serve(limits.Listener(lis)) }
	if listenPair != nil {
		scheme = "https://"
		srv.TLSConfig = &tls.Config{GetCertificate: listenPair.GetCertificate, MinVersion: tls.VersionTLS12}
		serve = func() error { return srv.ServeTLS(limits.Listener(lis), "", "") }
	}
	logger.Info("serving MCP over streamable HTTP", slog.String("address", scheme+lis.Addr().String()+"/mcp"), slog.String("target", f.target),
		slog.Int64("max_body_bytes", limits.MaxBodyBytes), slog.Duration("read_timeout", limits.ReadTimeout), slog.Int("max_connections", limits.MaxConnections), slog.Int("max_connections_per_ip", limits.MaxConnectionsPerIP), slog.Duration("write_timeout", limits.WriteTimeout), slog.Int64("max_buffered_bytes", limits.MaxBufferedBytes), slog.Int64("max_buffered_bytes_per_ip", limits.MaxBufferedBytesPerIP),
		slog.Int64("max_answer_bytes", limits.MaxAnswerBytes), slog.Int64("max_answer_bytes_per_ip", limits.MaxAnswerBytesPerIP))
	if err := serve(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
