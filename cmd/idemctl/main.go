// Command idemctl is the operator's CLI for the Dedupe service's admin RPCs:
// show a record with its stored outcome and replays, list records
// (outcome-unknown first, or the most replayed first), count them by state
// and method, settle an unknown outcome, forget a key, and report migration
// status.
//
//	idemctl [connection flags] show -scope S -key K [-namespace N] [-descriptors set.binpb]
//	idemctl [connection flags] list [-state unknown] [-sort expiry|replays|replay-age] [-limit 100] [-page-token T | -all]
//	idemctl [connection flags] count
//	idemctl [connection flags] resolve -scope S -key K [-namespace N] -release
//	idemctl [connection flags] resolve -scope S -key K [-namespace N] -complete-json '{"chargeId": "ch_1"}' [-descriptors set.binpb]
//	idemctl [connection flags] forget -scope S -key K [-namespace N] [-force] [-yes]
//	idemctl [connection flags] migrations
//
// It authenticates like any caller: a bearer token (IDEMCTL_TOKEN, or
// -token-file, or -token) or a client certificate; the identity needs the
// admin right. Without
// -tls-ca it speaks plaintext, to a loopback address only unless
// -insecure-plaintext is given. Each connection flag also reads
// IDEMCTL_ and its name (IDEMCTL_ADDR, IDEMCTL_TOKEN_FILE, ...); the flag
// wins. Every string from the service is printed
// escaped (Go quoted) when it holds anything but printable ASCII, since
// callers choose scopes and an escape sequence could rewrite the screen.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	_ "github.com/idemgate/idemgate/gen/examples/payments/v1" // the example's types, for -complete-json
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/cliflag"
	"github.com/idemgate/idemgate/internal/grpcerr"
	"github.com/idemgate/idemgate/internal/loopback"
	"github.com/idemgate/idemgate/internal/outcomejson"
	"github.com/idemgate/idemgate/internal/version"
)

// rpcTimeout bounds each admin RPC.
const rpcTimeout = 30 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stdin, os.Stdout, os.Stderr))
}

const usage = `usage: idemctl [connection flags] <command> [flags]
       idemctl -version

commands:
  show        -scope S -key K [-namespace N] [-descriptors FILE]
                                                 one record: its outcome, replays and ages
  list        [-state S] [-sort expiry|replays|replay-age] [-limit N] [-page-token T | -all]
                                                 records, outcome-unknown first (or most replayed,
                                                 or replayed longest after completion), a page at a time
  count                                          records by state and method
  resolve     -scope S -key K [-namespace N] (-release | -complete-json JSON [-descriptors FILE])
                                                 settle an outcome-unknown record
  forget      -scope S -key K [-namespace N] [-force] [-yes]
                                                 forget a key: its next call runs the side effect again
  migrations                                     the store's migrations

The token: IDEMCTL_TOKEN, or -token-file FILE (mode 0600). Avoid -token $VAR:
with VAR empty the command name becomes the token.

connection flags:
`

// commands are idemctl's commands; a -token whose value is one of them is
// an empty variable that swallowed the command.
var commands = []string{"show", "list", "count", "resolve", "forget", "migrations"}

// run runs the command line args (without the program name), reading the
// environment through lookupEnv, and returns the exit code.
func run(args []string, lookupEnv func(string) (string, bool), stdin io.Reader, stdout, stderr io.Writer) int {
	top := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	// The parse's own complaints wait in parseOut until the token is
	// checked: a swallowed command is the error to report, not the parse
	// error (an unknown -scope, say) it leads to.
	var parseOut bytes.Buffer
	top.SetOutput(&parseOut)
	top.Usage = func() { fmt.Fprint(top.Output(), usage); top.PrintDefaults() }
	addr := top.String("addr", "127.0.0.1:50051", "dedupe service `address`")
	token := top.String("token", "", "bearer `token` with the admin right; prefer the environment or -token-file, which keep it out of the process list")
	tokenFile := top.String("token-file", "", "`file` holding the bearer token, readable by its owner only")
	caFile := top.String("tls-ca", "", "CA `file` (PEM) that signed the service's certificate; empty uses plaintext")
	certFile := top.String("tls-cert", "", "client certificate `file` (PEM), for mutual TLS")
	keyFile := top.String("tls-key", "", "client key `file` (PEM)")
	insecurePlaintext := top.Bool("insecure-plaintext", false,
		"allow plaintext (no -tls-ca) to an address that is not loopback: the token crosses the network readable")
	// The connection flags read IDEMCTL_<FLAG>; the command's flags read
	// no variable: a key or -force from the shell could forget a record.
	env := cliflag.Bind(top, "IDEMCTL_", lookupEnv)
	showVersion := version.Flag(top) // after Bind: no variable
	parseErr := top.Parse(args)
	// Go's flag package takes the next argument as -token's value, so
	// "-token $ADMIN list" with ADMIN empty runs nothing useful: say why.
	if swallowed, ok := tokenIsACommand(top); ok {
		fmt.Fprintf(stderr, "idemctl: -token took %q, a command, as the token: the variable after -token is probably empty or unset (-token $ADMIN with ADMIN empty). Put the token in IDEMCTL_TOKEN or in a file passed with -token-file, or quote it: -token \"$ADMIN\"\n", swallowed)
		return 2
	}
	_, _ = parseOut.WriteTo(stderr)
	top.SetOutput(stderr)
	if parseErr != nil {
		return 2
	}
	if *showVersion {
		version.Print(stdout, "idemctl")
		return 0
	}
	if err := env.Apply(); err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		return 2
	}
	if top.NArg() == 0 {
		top.Usage()
		return 2
	}
	if *tokenFile != "" {
		tokenSet := false
		top.Visit(func(f *flag.Flag) { tokenSet = tokenSet || f.Name == "token" })
		if tokenSet {
			fmt.Fprintln(stderr, "idemctl: pass the token once: -token or -token-file, not both")
			return 2
		}
		t, err := readTokenFile(*tokenFile)
		if err != nil {
			fmt.Fprintln(stderr, "idemctl:", err)
			return 2
		}
		*token = t
	}
	conn, err := dial(*addr, *token, *caFile, *certFile, *keyFile, *insecurePlaintext)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		return 2
	}
	defer conn.Close()
	admin := idemgatev1.NewAdminServiceClient(conn)

	cmd := flag.NewFlagSet(top.Arg(0), flag.ContinueOnError)
	cmd.SetOutput(stderr)
	namespace := cmd.String("namespace", "", "the calling service that owns the record (empty without authentication)")
	scope := cmd.String("scope", "", "the record's scope: the full method, then |tenant if any")
	key := cmd.String("key", "", "the idempotency key")
	state := cmd.String("state", "", "list only this state: in_flight, completed, released or unknown")
	sortBy := cmd.String("sort", "expiry", "list: expiry (outcome-unknown first, then by expiry), replays (the most replayed first) or replay-age (replayed longest after completion first); the replay orders list replayed records only")
	force := cmd.Bool("force", false, "forget: an in-flight or outcome-unknown record too (a duplicate may then run the side effect a second time)")
	yes := cmd.Bool("yes", false, "forget: do not ask for the key to confirm")
	limit := cmd.Int("limit", 100, "list: records per page, 1 to 1000")
	pageToken := cmd.String("page-token", "", "list: resume after the page that printed this token")
	all := cmd.Bool("all", false, "list: walk every page")
	release := cmd.Bool("release", false, "resolve: the side effect did not happen; the next call runs")
	completeJSON := cmd.String("complete-json", "", "resolve: the outcome, as JSON of the method's response type")
	descriptors := cmd.String("descriptors", "", "resolve, show: a FileDescriptorSet (buf build -o set.binpb) holding the method's types, if idemctl does not know them")
	if err := cmd.Parse(top.Args()[1:]); err != nil {
		return 2
	}
	if cmd.NArg() > 0 {
		fmt.Fprintf(stderr, "idemctl %s: unexpected argument %q (flags go before it)\n", top.Arg(0), cmd.Arg(0))
		return 2
	}
	ref := &idemgatev1.RecordRef{Namespace: *namespace, Scope: *scope, Key: *key}
	fail := func(err error) int { return failRPC(stderr, *addr, err) }

	switch top.Arg(0) {
	case "show":
		// The descriptors first: a bad file is the operator's to fix,
		// reported before any call.
		resolver, err := typesResolver(*descriptors)
		if err != nil {
			fmt.Fprintln(stderr, "idemctl:", err)
			return 2
		}
		ctx, cancel := rpcContext()
		defer cancel()
		resp, err := admin.GetRecord(ctx, &idemgatev1.GetRecordRequest{Ref: ref, IncludeOutcome: true})
		if grpcerr.Reason(err) == dedupesvc.ReasonRecordNotFound {
			fmt.Fprintf(stderr, "idemctl: the record namespace %s scope %s key %s does not exist: never begun, expired and swept, or forgotten. "+
				"Check -namespace (the caller's identity; empty without authentication), -scope and -key; idemctl list shows the records\n",
				quoted(*namespace), quoted(*scope), quoted(*key))
			return 1
		}
		if err != nil {
			return fail(err)
		}
		showRecord(stdout, resp.GetRecord(), time.Now(), resolver)
	case "list":
		order, ok := sortOrders[*sortBy]
		if !ok {
			fmt.Fprintf(stderr, "idemctl: -sort %q: want expiry, replays or replay-age\n", *sortBy)
			return 2
		}
		req := &idemgatev1.ListRecordsRequest{State: *state, Limit: int32(*limit), PageToken: *pageToken, Order: order}
		// The tabwriter holds every row until Flush, so an error leaves
		// stdout empty: no header a script could take for an empty list.
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		printed := 0
		replayOrder := order != idemgatev1.RecordOrder_RECORD_ORDER_UNSPECIFIED
		if replayOrder {
			fmt.Fprintln(w, "REPLAYS\tREPLAY_AGE\tLAST_REPLAYED\tSTATE\tNAMESPACE\tSCOPE\tKEY")
		} else {
			fmt.Fprintln(w, "STATE\tNAMESPACE\tSCOPE\tKEY\tEPOCH\tEXPIRES")
		}
		for {
			pageCtx, cancelPage := rpcContext() // per page: -all may walk many
			resp, err := admin.ListRecords(pageCtx, req)
			cancelPage()
			if err != nil {
				code := fail(err)
				if printed > 0 {
					fmt.Fprintf(stderr, "idemctl: the %d records of the pages before this error are not printed; resume with -page-token %s\n",
						printed, safe(req.PageToken))
				}
				return code
			}
			printed += len(resp.GetRecords())
			for _, r := range resp.GetRecords() {
				if replayOrder {
					fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.GetReplayCount(), age(replayAge(r)), stamp(r.GetLastReplayedAt().AsTime()),
						safe(r.GetState()), safe(r.GetRef().GetNamespace()), safe(r.GetRef().GetScope()), safe(r.GetRef().GetKey()))
					continue
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", safe(r.GetState()), safe(r.GetRef().GetNamespace()), safe(r.GetRef().GetScope()), safe(r.GetRef().GetKey()), r.GetEpoch(), stamp(r.GetExpiresAt().AsTime()))
			}
			req.PageToken = resp.GetNextPageToken()
			if req.PageToken == "" {
				break
			}
			if !*all {
				w.Flush()
				fmt.Fprintf(stderr, "more records: add -page-token %s (or -all)\n", safe(req.PageToken))
				break
			}
		}
		w.Flush()
	case "count":
		ctx, cancel := rpcContext()
		defer cancel()
		resp, err := admin.CountRecords(ctx, &idemgatev1.CountRecordsRequest{})
		if err != nil {
			return fail(err)
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "STATE\tMETHOD\tCOUNT")
		for _, c := range resp.GetCounts() {
			fmt.Fprintf(w, "%s\t%s\t%d\n", safe(c.GetState()), safe(c.GetMethod()), c.GetCount())
		}
		w.Flush()
	case "resolve":
		req := &idemgatev1.ResolveRecordRequest{Ref: ref}
		switch {
		case *release == (*completeJSON != ""):
			fmt.Fprintln(stderr, "idemctl: resolve takes exactly one of -release and -complete-json")
			return 2
		case *release:
			req.Resolution = &idemgatev1.ResolveRecordRequest_Release_{Release: &idemgatev1.ResolveRecordRequest_Release{}}
		default:
			outcome, err := outcomeFromJSON(*scope, *completeJSON, *descriptors)
			if err != nil {
				fmt.Fprintln(stderr, "idemctl:", err)
				return 2
			}
			req.Resolution = &idemgatev1.ResolveRecordRequest_Complete{Complete: outcome}
		}
		ctx, cancel := rpcContext()
		defer cancel()
		if _, err := admin.ResolveRecord(ctx, req); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "resolved %s %s\n", safe(*scope), safe(*key))
	case "forget":
		return forget(rpcContext, admin, ref, *force, *yes, stdin, stdout, stderr, fail)
	case "migrations":
		ctx, cancel := rpcContext()
		defer cancel()
		resp, err := admin.GetMigrationStatus(ctx, &idemgatev1.GetMigrationStatusRequest{})
		if err != nil {
			return fail(err)
		}
		for _, m := range resp.GetMigrations() {
			state := "pending"
			if m.GetApplied() {
				state = "applied"
			}
			fmt.Fprintf(stdout, "%s\t%s\t%s\n", safe(resp.GetStore()), state, safe(m.GetName()))
		}
	default:
		fmt.Fprintf(stderr, "idemctl: unknown command %q\n", top.Arg(0))
		top.Usage()
		return 2
	}
	return 0
}

// tokenIsACommand reports the command name -token was set to, on the
// command line, if it was: the sign of an empty variable after -token.
// It holds after a failed parse too, for what the parse had set.
func tokenIsACommand(top *flag.FlagSet) (string, bool) {
	value, set := "", false
	top.Visit(func(f *flag.Flag) {
		if f.Name == "token" {
			value, set = f.Value.String(), true
		}
	})
	return value, set && slices.Contains(commands, value)
}

// rpcContext bounds one admin RPC by rpcTimeout; each RPC takes its own,
// made right before it, so time spent waiting for the operator does not
// count against it.
func rpcContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), rpcTimeout)
}

// outcomeFromJSON parses the JSON of the scope's method's response type and
// packs it as the Any the interceptor would have stored. The method is
// looked up in the descriptors when given, else in the types idemctl links.
func outcomeFromJSON(scope, text, descriptorFile string) (*anypb.Any, error) {
	method := dedupesvc.MethodOf(scope)
	if !strings.HasPrefix(method, "/") || !strings.Contains(method[1:], "/") {
		return nil, fmt.Errorf("-scope %q does not start with a full method name (/pkg.Service/Method)", scope)
	}
	files := protoregistry.GlobalFiles
	if descriptorFile != "" {
		var err error
		if files, err = outcomejson.ReadFile("-descriptors", descriptorFile); err != nil {
			return nil, err
		}
	}
	md, err := outcomejson.ResponseType(files, method)
	if err != nil {
		if descriptorFile == "" {
			return nil, fmt.Errorf("%w: idemctl does not link it; pass -descriptors (buf build -o set.binpb)", err)
		}
		return nil, fmt.Errorf("-descriptors %s: %w", descriptorFile, err)
	}
	types := outcomejson.Types(nil)
	if descriptorFile != "" {
		types = outcomejson.Types(files)
	}
	outcome, err := outcomejson.FromJSON(md, []byte(text), types)
	if err != nil {
		return nil, fmt.Errorf("-complete-json is %w", err)
	}
	return outcome, nil
}

// dial connects to the service: TLS with -tls-ca, else plaintext, which
// only a loopback address or insecurePlaintext allows.
func dial(addr, token, caFile, certFile, keyFile string, insecurePlaintext bool) (*grpc.ClientConn, error) {
	var opts []grpc.DialOption
	if caFile == "" && !insecurePlaintext && !isLoopback(addr) {
		return nil, fmt.Errorf("refusing plaintext to %s, which is not a loopback address: the admin token would cross the network readable; pass -tls-ca (TLS), or -insecure-plaintext if the network is trusted", safe(addr))
	}
	if caFile == "" {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("-tls-ca holds no PEM certificate")
		}
		cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if certFile != "" {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, err
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(auth.BearerToken(token, caFile == "")))
	}
	return grpc.NewClient(addr, opts...)
}

// failRPC prints an RPC's error and returns the exit code 1. The service's
// own errors carry a reason; an error without one comes from the
// connection, and is told as what could not be reached and what to check.
func failRPC(stderr io.Writer, addr string, err error) int {
	st := status.Convert(err)
	reason := grpcerr.Reason(err)
	switch {
	case reason != "":
		fmt.Fprintf(stderr, "idemctl: %s %s: %s\n", st.Code(), safe(reason), safe(st.Message()))
	case st.Code() == codes.Unavailable:
		fmt.Fprintf(stderr, "idemctl: cannot reach the Dedupe service at %s: %s. Is it running (dedupesvc, make run), and is -addr (IDEMCTL_ADDR) its address? For TLS, check -tls-ca and that the address matches its certificate\n",
			safe(addr), safe(connectionCause(st.Message())))
	case st.Code() == codes.DeadlineExceeded:
		fmt.Fprintf(stderr, "idemctl: the Dedupe service at %s did not answer within %s; it may be overloaded or its store unreachable: check its logs and health\n", safe(addr), rpcTimeout)
	default:
		fmt.Fprintf(stderr, "idemctl: %s from %s: %s\n", st.Code(), safe(addr), safe(st.Message()))
	}
	return 1
}

// connectionCause keeps the part of a gRPC transport error an operator acts
// on: "connection error: desc = \"transport: Error while dialing: dial tcp
// 127.0.0.1:1: connect: connection refused\"" becomes "dial tcp
// 127.0.0.1:1: connect: connection refused".
func connectionCause(msg string) string {
	if _, desc, ok := strings.Cut(msg, "desc = "); ok {
		msg = strings.Trim(desc, `"`)
	}
	for _, prefix := range []string{"transport: ", "Error while dialing: ", "error while dialing: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	return msg
}

// isLoopback reports whether a target (host:port, or dns:///host:port)
// names this machine; a unix socket is local too.
func isLoopback(target string) bool {
	if strings.HasPrefix(target, "unix:") {
		return true
	}
	target = strings.TrimPrefix(strings.TrimPrefix(target, "dns:///"), "passthrough:///")
	return loopback.Address(target)
}

// quoted returns s in double quotes, escaped as safe escapes it, so that an
// empty namespace reads "" rather than nothing.
func quoted(s string) string {
	if q := safe(s); q != s {
		return q
	}
	return `"` + s + `"`
}

// safe returns s as it is when it is printable ASCII, else Go-quoted with
// every other byte or rune escaped: strings come from callers, and a raw
// escape sequence or newline could clear the operator's screen or forge a
// table row.
func safe(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return strconv.QuoteToASCII(s)
		}
	}
	return s
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
