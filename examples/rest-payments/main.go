// Command rest-payments is a small REST payments API whose charge endpoint
// is gated by httpgate: POST /charges runs once per Idempotency-Key and
// replays its response, byte for byte, to every retry; GET /charges/{id}
// is safe and never gated. Its OpenAPI 3.1 document is at /openapi.yaml.
//
// Every call but GET /openapi.yaml authenticates with a bearer token from
// -caller-token-file ("name secret" a line, a file only its owner may
// read: any other is refused at start); the token's name is the
// caller's tenant: its keys and charges are its own, so another caller
// sending its key and body gets a charge of its own, never its answer. A
// call without a valid token gets 401 problem+json. The listener is bounded
// as the library's httpgate.ServerLimits defaults are (-read-timeout,
// -write-timeout, -max-connections-per-ip and the rest).
//
// Charge ids carry a random prefix drawn at start ("ch_k7q2m4xa_000001"):
// the Dedupe service replays a charge's Location for its retention, across
// restarts of this server, so a new process must never hand the same id to
// another charge.
//
// -charge-delay makes every charge take that long at the processor, to show
// what a duplicate sent while the original runs gets: it waits up to the
// route's MaxWait (3s) for the original's answer, then 409
// IDEMPOTENCY_IN_FLIGHT with Retry-After.
//
// On SIGINT or SIGTERM it stops taking requests and gives the requests in
// flight, then the outcomes still being stored, -shutdown-timeout (10s) in
// all; an outcome not stored by then (the Dedupe service unreachable) is
// logged as lost, its key left to the Dedupe service's lease, and the
// server exits 0.
//
//	install -m 600 examples/rest-payments/tokens.txt /tmp/rest-tokens.txt   # only its owner may read it
//	go run ./examples/rest-payments -caller-token-file /tmp/rest-tokens.txt -dedupe 127.0.0.1:50051   # make run first
//	go run ./examples/rest-payments -caller-token-file /tmp/rest-tokens.txt -data-dir /tmp/rest-dedupe # embedded store
package main

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base32"
	"encoding/json"
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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemgate/idemgate"
	"github.com/idemgate/idemgate/dedupesvc/embedded"
	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/httpgate"
	"github.com/idemgate/idemgate/internal/tokenfile"
)

//go:embed openapi.yaml
var openAPI []byte

func main() {
	dedupeAddr := flag.String("dedupe", "127.0.0.1:50051", "gRPC `address` of the Dedupe service (plaintext, loopback)")
	dataDir := flag.String("data-dir", "", "run a Dedupe service in this process on the embedded store in this `directory`, instead of -dedupe")
	listen := flag.String("listen", "127.0.0.1:8090", "serve HTTP on this `address`")
	tokenFile := flag.String("caller-token-file", "", "`file` of the callers' bearer tokens, \"name secret\" a line; each name is a tenant; required")
	var o options
	flag.DurationVar(&o.chargeDelay, "charge-delay", 0, "every charge takes this `long` at the processor, to show a concurrent duplicate's 409 (it waits up to 3s first); 0, the default, charges at once")
	flag.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGINT or SIGTERM, how `long` the requests in flight and the outcomes still being stored get in all; outcomes not stored by then are logged as lost")
	var limits httpgate.ServerLimits
	limits.RegisterFlags(flag.CommandLine)
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*dedupeAddr, *dataDir, *listen, *tokenFile, o, limits, logger); err != nil {
		logger.Error("rest-payments failed", slog.Any("error", err))
		os.Exit(1)
	}
	logger.Info("stopped")
}

// options are the example's own settings.
type options struct {
	// chargeDelay is how long each charge takes (-charge-delay).
	chargeDelay time.Duration
	// shutdownTimeout bounds the stop on a signal (-shutdown-timeout).
	shutdownTimeout time.Duration
}

func run(dedupeAddr, dataDir, listen, tokenFile string, o options, limits httpgate.ServerLimits, logger *slog.Logger) error {
	if tokenFile == "" {
		return errors.New("-caller-token-file is required: without it anyone who learns a caller's key and body would be replayed that caller's charge")
	}
	tokens, err := tokenfile.Read("-caller-token-file", tokenFile, nil)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var dedupe idemgatev1.DedupeServiceClient
	opts := []httpgate.Option{httpgate.WithLogger(logger)}
	if dataDir != "" {
		// The Dedupe service inside this process, as dedupesvc runs it.
		svc, err := embedded.Start(ctx, embedded.Config{DataDir: dataDir, Logger: logger})
		if err != nil {
			return err
		}
		defer svc.Close() // after gate.Close below
		dedupe = svc.Client()
	} else {
		conn, err := grpc.NewClient(dedupeAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultServiceConfig(idemgate.DedupeServiceConfig))
		if err != nil {
			return err
		}
		defer conn.Close()
		dedupe = idemgatev1.NewDedupeServiceClient(conn)
		opts = append(opts, httpgate.WithDedupeConn(conn))
	}
	gate, err := newGate(dedupe, opts...)
	if err != nil {
		return err
	}
	checkCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = gate.CheckDedupe(checkCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("the Dedupe service does not serve this API (start it with make run, or pass -data-dir): %w", err)
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	// Slow, idle or never-reading clients are cut, and one client address
	// holds at most its share of the connections.
	srv := limits.Server(newAPI(&provider{delay: o.chargeDelay}).handler(gate, tokens))
	logger.Info("rest-payments: serving", slog.String("addr", lis.Addr().String()), slog.String("openapi", "http://"+lis.Addr().String()+"/openapi.yaml"))
	// One deadline for the whole stop, from the signal on.
	var stopCtx context.Context
	shutDown := make(chan struct{})
	go func() {
		<-ctx.Done()
		logger.Info("stopping on a signal: no new requests; the requests in flight, then the outcomes still being stored, get -shutdown-timeout in all",
			slog.Duration("shutdown_timeout", o.shutdownTimeout))
		var cancel context.CancelFunc
		stopCtx, cancel = context.WithTimeout(context.Background(), o.shutdownTimeout)
		_ = cancel // the deadline ends it, with the process
		_ = srv.Shutdown(stopCtx)
		close(shutDown)
	}()
	if err := srv.Serve(limits.Listener(lis)); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-shutDown // Serve returns as Shutdown starts; the requests in flight end here
	if err := gate.Close(stopCtx); err != nil {
		// The Dedupe service did not take them in time: their keys stay
		// reserved until their leases end, then the next retry runs the
		// charge again unless the route says otherwise. Nothing more this
		// process can do; waiting longer would only delay the restart.
		logger.Error("outcomes lost at shutdown: not stored within -shutdown-timeout", slog.Any("error", err))
	}
	return nil
}

// newGate gates POST /charges (as openapi.yaml declares with its
// Idempotency-Key parameter): a charge is replayed for 24h; a declined card
// (402) is the charge's outcome too, so a retry never tries the card again.
// Each caller is its own tenant (callerOf), so its keys are its own.
func newGate(dedupe idemgatev1.DedupeServiceClient, opts ...httpgate.Option) (*httpgate.Gate, error) {
	return httpgate.New(dedupe, "rest-payments", append([]httpgate.Option{
		httpgate.WithRoute("POST /charges", httpgate.RoutePolicy{Retention: 24 * time.Hour, ReplayClientErrors: true}),
		httpgate.WithTenant(func(r *http.Request) (string, error) {
			if name := callerOf(r); name != "" {
				return name, nil
			}
			return "", errors.New("no authenticated caller")
		}),
	}, opts...)...)
}

type callerKey struct{}

// callerOf is the name of r's authenticated caller, "" when none.
func callerOf(r *http.Request) string {
	name, _ := r.Context().Value(callerKey{}).(string)
	return name
}

// authenticate lets through only a request with one of tokens (secret to
// caller name) as "Authorization: Bearer <secret>", its caller's name in
// its context; others get 401 problem+json. The gate runs after it, so a
// caller's keys are looked up in its own tenant.
func authenticate(tokens map[string]string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := tokenfile.Lookup(tokens, tokenfile.Bearer(r))
		if name == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="rest-payments"`)
			problem(w, http.StatusUnauthorized, "Unauthenticated", "send an Authorization: Bearer header with one of the tokens in the server's -caller-token-file")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, name)))
	})
}

// handler is the served API: /openapi.yaml to anyone, the rest to
// authenticated callers through gate.
func (a *api) handler(gate *httpgate.Gate, tokens map[string]string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /openapi.yaml", a.mux())
	mux.Handle("/", authenticate(tokens, gate.Handler(a.mux())))
	return mux
}

// provider is the fake card processor: it honours its context and keeps the
// charges it made.
type provider struct {
	// delay is how long each charge takes (-charge-delay).
	delay time.Duration
	// wait, when set (tests), is waited on in place of delay.
	wait func(context.Context) error

	mu      sync.Mutex
	charges map[string]charge
	// prefix, drawn once, makes this process's charge ids its own.
	prefix string
}

type charge struct {
	// owner is the caller that made it; only it reads it back.
	owner    string
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"`
}

var errDeclined = errors.New("card declined")

func (p *provider) charge(ctx context.Context, c charge) (charge, error) {
	if err := p.processing(ctx); err != nil {
		return charge{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.Amount > 100000 {
		return charge{}, errDeclined
	}
	if p.charges == nil {
		p.charges = map[string]charge{}
		var b [5]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		p.prefix = strings.ToLower(base32.StdEncoding.EncodeToString(b[:]))
	}
	c.ID, c.Status = fmt.Sprintf("ch_%s_%06d", p.prefix, len(p.charges)+1), "succeeded"
	p.charges[c.ID] = c
	return c, nil
}

// processing is the processor's time on a charge: delay, or wait; it ends
// early, with ctx's error, when ctx does.
func (p *provider) processing(ctx context.Context) error {
	if p.wait != nil {
		return p.wait(ctx)
	}
	if p.delay > 0 {
		t := time.NewTimer(p.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return ctx.Err()
}

func (p *provider) get(id string) (charge, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.charges[id]
	return c, ok
}

// api is the REST API on a provider.
type api struct{ p *provider }

func newAPI(p *provider) *api { return &api{p: p} }

// mux routes the API; every route here is declared in openapi.yaml
// (main_test.go holds the two to each other).
func (a *api) mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", a.createCharge)
	mux.HandleFunc("GET /charges/{id}", a.getCharge)
	mux.HandleFunc("GET /openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(openAPI)
	})
	return mux
}

func (a *api) createCharge(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Customer string `json:"customer"`
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Customer == "" || in.Amount <= 0 || in.Currency == "" {
		problem(w, http.StatusBadRequest, "Invalid charge", "send a JSON body with customer, a positive amount in minor units, and currency")
		return
	}
	c, err := a.p.charge(r.Context(), charge{owner: callerOf(r), Customer: in.Customer, Amount: in.Amount, Currency: in.Currency})
	switch {
	case errors.Is(err, errDeclined):
		problem(w, http.StatusPaymentRequired, "Card declined", "the card was declined; use a new Idempotency-Key for a new attempt")
		return
	case err != nil:
		// The processor's call ended before it answered: the charge may or
		// may not have happened.
		httpgate.MarkOutcomeUnknown(w)
		problem(w, http.StatusBadGateway, "Processor did not answer", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/charges/"+c.ID)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(c)
}

func (a *api) getCharge(w http.ResponseWriter, r *http.Request) {
	c, ok := a.p.get(r.PathValue("id"))
	if !ok || c.owner != callerOf(r) {
		problem(w, http.StatusNotFound, "No such charge", "no charge has this id")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(c)
}

func problem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", httpgate.ProblemContentType)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(httpgate.Problem{Type: "about:blank", Title: title, Status: status, Detail: detail})
}
