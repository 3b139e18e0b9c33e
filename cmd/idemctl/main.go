// Command idemctl is the operator's CLI for the Dedupe service's admin RPCs:
// show a record, list records (outcome-unknown first), count them by state
// and method, settle an unknown outcome, and report migration status.
//
//	idemctl [connection flags] show -scope S -key K [-namespace N]
//	idemctl [connection flags] list [-state unknown] [-limit 100] [-page-token T | -all]
//	idemctl [connection flags] count
//	idemctl [connection flags] resolve -scope S -key K [-namespace N] -release
//	idemctl [connection flags] resolve -scope S -key K [-namespace N] -complete-json '{"chargeId": "ch_1"}' [-descriptors set.binpb]
//	idemctl [connection flags] migrations
//
// It authenticates like any caller: a bearer token (-token, IDEMCTL_TOKEN)
// or a client certificate; the identity needs the admin right. Without
// -tls-ca it speaks plaintext, to a loopback address only unless
// -insecure-plaintext is given. Every string from the service is printed
// escaped (Go quoted) when it holds anything but printable ASCII, since
// callers choose scopes and an escape sequence could rewrite the screen.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/auth"
	_ "github.com/idemgate/idemgate/gen/examples/payments/v1" // the example's types, for -complete-json
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/grpcerr"
)

// rpcTimeout bounds each admin RPC.
const rpcTimeout = 30 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: idemctl [connection flags] <command> [flags]

commands:
  show        -scope S -key K [-namespace N]     one record
  list        [-state S] [-limit N] [-page-token T | -all]
                                                 records, outcome-unknown first, a page at a time
  count                                          records by state and method
  resolve     -scope S -key K [-namespace N] (-release | -complete-json JSON [-descriptors FILE])
                                                 settle an outcome-unknown record
  migrations                                     the store's migrations

connection flags:
`

func run(args []string, stdout, stderr io.Writer) int {
	top := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	top.SetOutput(stderr)
	top.Usage = func() { fmt.Fprint(stderr, usage); top.PrintDefaults() }
	addr := top.String("addr", envOr("IDEMCTL_ADDR", "127.0.0.1:50051"), "dedupe service `address` (env IDEMCTL_ADDR)")
	token := top.String("token", os.Getenv("IDEMCTL_TOKEN"), "bearer `token` with the admin right (env IDEMCTL_TOKEN)")
	caFile := top.String("tls-ca", "", "CA `file` (PEM) that signed the service's certificate; empty uses plaintext")
	certFile := top.String("tls-cert", "", "client certificate `file` (PEM), for mutual TLS")
	keyFile := top.String("tls-key", "", "client key `file` (PEM)")
	plaintextDefault, _ := strconv.ParseBool(os.Getenv("IDEMCTL_INSECURE_PLAINTEXT"))
	insecurePlaintext := top.Bool("insecure-plaintext", plaintextDefault,
		"allow plaintext (no -tls-ca) to an address that is not loopback: the token crosses the network readable (env IDEMCTL_INSECURE_PLAINTEXT)")
	if err := top.Parse(args); err != nil {
		return 2
	}
	if top.NArg() == 0 {
		top.Usage()
		return 2
	}
	conn, err := dial(*addr, *token, *caFile, *certFile, *keyFile, *insecurePlaintext)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		return 2
	}
	defer conn.Close()
	admin := idemgatev1.NewAdminServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()

	cmd := flag.NewFlagSet(top.Arg(0), flag.ContinueOnError)
	cmd.SetOutput(stderr)
	namespace := cmd.String("namespace", "", "the calling service that owns the record (empty without authentication)")
	scope := cmd.String("scope", "", "the record's scope: the full method, then |tenant if any")
	key := cmd.String("key", "", "the idempotency key")
	state := cmd.String("state", "", "list only this state: in_flight, completed, released or unknown")
	limit := cmd.Int("limit", 100, "list: records per page, 1 to 1000")
	pageToken := cmd.String("page-token", "", "list: resume after the page that printed this token")
	all := cmd.Bool("all", false, "list: walk every page")
	release := cmd.Bool("release", false, "resolve: the side effect did not happen; the next call runs")
	completeJSON := cmd.String("complete-json", "", "resolve: the outcome, as JSON of the method's response type")
	descriptors := cmd.String("descriptors", "", "resolve: a FileDescriptorSet (buf build -o set.binpb) holding the method, if idemctl does not know it")
	if err := cmd.Parse(top.Args()[1:]); err != nil {
		return 2
	}
	ref := &idemgatev1.RecordRef{Namespace: *namespace, Scope: *scope, Key: *key}

	switch top.Arg(0) {
	case "show":
		resp, err := admin.GetRecord(ctx, &idemgatev1.GetRecordRequest{Ref: ref})
		if err != nil {
			return fail(stderr, err)
		}
		r := resp.GetRecord()
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, kv := range [][2]string{
			{"namespace", safe(r.GetRef().GetNamespace())}, {"scope", safe(r.GetRef().GetScope())}, {"key", safe(r.GetRef().GetKey())},
			{"state", safe(r.GetState())}, {"epoch", fmt.Sprint(r.GetEpoch())}, {"outcome", fmt.Sprintf("%s (%d bytes)", safe(r.GetOutcomeTypeUrl()), r.GetOutcomeSize())},
			{"lease_expires_at", stamp(r.GetLeaseExpiresAt().AsTime())}, {"completed_at", completed(r)}, {"expires_at", stamp(r.GetExpiresAt().AsTime())},
		} {
			fmt.Fprintf(w, "%s\t%s\n", kv[0], kv[1])
		}
		w.Flush()
	case "list":
		req := &idemgatev1.ListRecordsRequest{State: *state, Limit: int32(*limit), PageToken: *pageToken}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "STATE\tNAMESPACE\tSCOPE\tKEY\tEPOCH\tEXPIRES")
		for {
			pageCtx, cancelPage := context.WithTimeout(context.Background(), rpcTimeout) // per page: -all may walk many
			resp, err := admin.ListRecords(pageCtx, req)
			cancelPage()
			if err != nil {
				w.Flush()
				return fail(stderr, err)
			}
			for _, r := range resp.GetRecords() {
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
		resp, err := admin.CountRecords(ctx, &idemgatev1.CountRecordsRequest{})
		if err != nil {
			return fail(stderr, err)
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
		if _, err := admin.ResolveRecord(ctx, req); err != nil {
			return fail(stderr, err)
		}
		fmt.Fprintf(stdout, "resolved %s %s\n", safe(*scope), safe(*key))
	case "migrations":
		resp, err := admin.GetMigrationStatus(ctx, &idemgatev1.GetMigrationStatusRequest{})
		if err != nil {
			return fail(stderr, err)
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

// outcomeFromJSON parses the JSON of the scope's method's response type and
// packs it as the Any the interceptor would have stored.
func outcomeFromJSON(scope, text, descriptorFile string) (*anypb.Any, error) {
	method := dedupesvc.MethodOf(scope)
	service, name, ok := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	if !ok {
		return nil, fmt.Errorf("-scope %q does not start with a full method name (/pkg.Service/Method)", scope)
	}
	files := protoregistry.GlobalFiles
	if descriptorFile != "" {
		raw, err := os.ReadFile(descriptorFile)
		if err != nil {
			return nil, err
		}
		set := &descriptorpb.FileDescriptorSet{}
		if err := proto.Unmarshal(raw, set); err != nil {
			return nil, fmt.Errorf("-descriptors %s is not a FileDescriptorSet: %w", descriptorFile, err)
		}
		if files, err = protodesc.NewFiles(set); err != nil {
			return nil, fmt.Errorf("-descriptors %s: %w", descriptorFile, err)
		}
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(service))
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if err != nil || !ok {
		return nil, fmt.Errorf("service %s is unknown to idemctl; pass -descriptors (buf build -o set.binpb)", service)
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		return nil, fmt.Errorf("service %s has no method %s", service, name)
	}
	var msg proto.Message
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName()); err == nil && descriptorFile == "" {
		msg = mt.New().Interface()
	} else {
		msg = dynamicpb.NewMessage(md.Output())
	}
	if err := protojson.Unmarshal([]byte(text), msg); err != nil {
		return nil, fmt.Errorf("-complete-json is not a valid %s: %w", md.Output().FullName(), err)
	}
	outcome := &anypb.Any{}
	if err := anypb.MarshalFrom(outcome, msg, proto.MarshalOptions{Deterministic: true}); err != nil {
		return nil, err
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

func fail(stderr io.Writer, err error) int {
	st := status.Convert(err)
	fmt.Fprintf(stderr, "idemctl: %s %s: %s\n", st.Code(), safe(grpcerr.Reason(err)), safe(st.Message()))
	return 1
}

// isLoopback reports whether a target (host:port, or dns:///host:port)
// names this machine; a unix socket is local too.
func isLoopback(target string) bool {
	if strings.HasPrefix(target, "unix:") {
		return true
	}
	target = strings.TrimPrefix(strings.TrimPrefix(target, "dns:///"), "passthrough:///")
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
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

func completed(r *idemgatev1.Record) string {
	if r.GetCompletedAt() == nil {
		return "-"
	}
	return stamp(r.GetCompletedAt().AsTime())
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
