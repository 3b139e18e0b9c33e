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
// Every flag also reads an environment variable, IDEMGATE_MCP_ and its name
// (IDEMGATE_MCP_TARGET, IDEMGATE_MCP_LISTEN, ...; -token reads
// IDEMGATE_MCP_TARGET_TOKEN); the flag wins. idemgate-mcp -h lists them.
// idemgate-mcp -version prints the version and the commit it was built
// from.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemgate/idemgate/dedupesvc/auth"
	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/mcpbridge"
	"github.com/idemgate/idemgate/internal/version"
)

type flags struct {
	target, descriptorSet, services, listen string
	plaintext                               bool
	caFile, serverName                      string
	token                                   string
	callTimeout                             time.Duration
	keyArgument, keyArgumentTools           string
}

func main() {
	f, err := parseFlags(os.Args[1:], os.Getenv, os.Stderr)
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
// given, its variable IDEMGATE_MCP_<FLAG> through getenv (-token's is
// IDEMGATE_MCP_TARGET_TOKEN). It returns flag.ErrHelp after printing usage
// to usage for -h, and version.ErrRequested for -version, checking nothing
// else.
func parseFlags(args []string, getenv func(string) string, usage io.Writer) (flags, error) {
	fs := flag.NewFlagSet("idemgate-mcp", flag.ContinueOnError)
	fs.SetOutput(usage)
	var f flags
	fs.StringVar(&f.target, "target", "", "gRPC `address` of the tool server; required")
	fs.StringVar(&f.descriptorSet, "descriptor-set", "", "FileDescriptorSet `file` with the tool server's services (buf build -o); default: ask the server by reflection")
	fs.StringVar(&f.services, "services", "", "comma-separated full `names` of the services to serve; default: all but grpc.*")
	fs.StringVar(&f.listen, "listen", "", "serve streamable HTTP on this `address` at /mcp; default: stdio")
	fs.BoolVar(&f.plaintext, "plaintext", false, "connect to the tool server without TLS (loopback only)")
	fs.StringVar(&f.caFile, "tls-ca", "", "PEM `file` of the CAs that sign the tool server's certificate; default: the system's")
	fs.StringVar(&f.serverName, "tls-server-name", "", "`name` to verify the tool server's certificate against; default: the target's host")
	fs.StringVar(&f.token, "token", "", "bearer `token` sent to the tool server")
	fs.DurationVar(&f.callTimeout, "call-timeout", 60*time.Second, "deadline of each forwarded call")
	fs.StringVar(&f.keyArgument, "key-argument", "", "add a required key argument of this `name` (such as "+mcpbridge.DefaultKeyArgument+") to every gated tool, for hosts that never set _meta; default: none")
	fs.StringVar(&f.keyArgumentTools, "key-argument-tools", "", "comma-separated full `names` of the gated tools that get -key-argument; default: every gated tool")
	env := cliflag.Bind(fs, "IDEMGATE_MCP_", getenv, cliflag.WithName("token", "IDEMGATE_MCP_TARGET_TOKEN"))
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
	return f, nil
}

func run(f flags, logger *slog.Logger) error {
	if f.target == "" {
		return errors.New("-target is required")
	}
	logger.Info("idemgate-mcp starting", version.Attr())
	var dial []grpc.DialOption
	if f.plaintext {
		dial = append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		cfg := &tls.Config{ServerName: f.serverName, MinVersion: tls.VersionTLS12}
		if f.caFile != "" {
			pem, err := os.ReadFile(f.caFile)
			if err != nil {
				return fmt.Errorf("-tls-ca: %w", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return fmt.Errorf("-tls-ca: no certificate in %s", f.caFile)
			}
		}
		dial = append(dial, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	}
	if f.token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(auth.BearerToken(f.token, f.plaintext)))
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
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpbridge.HTTPHandler(server)) // stateless: serves 2026-07-28 and earlier
	lis, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		logger.Info("stopping on a signal: no new requests, waiting up to 10s for the requests in flight")
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	logger.Info("serving MCP over streamable HTTP", slog.String("address", "http://"+lis.Addr().String()+"/mcp"), slog.String("target", f.target))
	if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
