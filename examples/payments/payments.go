// Package payments is the example tool server: PaymentsService over an
// in-memory ledger that counts every side effect, so a test or a newcomer can
// see whether a retried charge ran twice.
//
// ChargeCard and SendReceipt are marked mutating in
// proto/examples/payments/v1/payments.proto and are gated by the interceptor;
// GetBalance is NO_SIDE_EFFECTS and is not.
package payments

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
)

// Ledger records every executed charge and receipt. Its zero value is ready.
//
// The ledger lives in memory, while the Dedupe service keeps outcomes for
// their retention, so a restarted server starts a new ledger whose ids must
// not collide with the ones the Dedupe service still replays: every id
// carries a random prefix drawn once per ledger ("ch_k7q2m4xa_000001").
type Ledger struct {
	mu        sync.Mutex
	prefix    string
	charges   []Charge
	receipts  int
	perClient map[string]*balance
}

// Charge is one executed charge.
type Charge struct {
	// ID is the charge's id: "ch_", the ledger's random prefix, then a
	// sequence number from 000001, e.g. "ch_k7q2m4xa_000001".
	ID string
	// CustomerID is the charged customer.
	CustomerID string
	// AmountCents is the charged amount.
	AmountCents int64
	// IdempotencyKey is the key the charge was sent to the provider under:
	// idemgate.DownstreamKeyFromContext, the same for every attempt at
	// the action and unique per tenant and method.
	IdempotencyKey string
}

type balance struct {
	chargedCents, charges, receipts int64
}

// Charges returns every executed charge in order.
func (l *Ledger) Charges() []Charge {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Charge(nil), l.charges...)
}

// Receipts returns how many receipts were sent.
func (l *Ledger) Receipts() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.receipts
}

// Executions returns how many charges and receipts ran for a customer.
func (l *Ledger) Executions(customerID string) (charges, receipts int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.perClient[customerID]
	if !ok {
		return 0, 0
	}
	return b.charges, b.receipts
}

// nextID returns the ledger's next id of a kind ("ch", "msg"); l.mu is held.
func (l *Ledger) nextID(kind string, n int) string {
	if l.prefix == "" {
		var b [5]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		l.prefix = strings.ToLower(base32.StdEncoding.EncodeToString(b[:]))
	}
	return fmt.Sprintf("%s_%s_%06d", kind, l.prefix, n)
}

func (l *Ledger) customer(id string) *balance {
	if l.perClient == nil {
		l.perClient = map[string]*balance{}
	}
	b, ok := l.perClient[id]
	if !ok {
		b = &balance{}
		l.perClient[id] = b
	}
	return b
}

// Server implements PaymentsService on a Ledger.
type Server struct {
	paymentsv1.UnimplementedPaymentsServiceServer
	// Ledger receives the side effects.
	Ledger *Ledger
	// Provider, when set, is the simulated payment provider's answer to a
	// call it has just acted on: the handler calls it with its context after
	// the side effect and returns its error, as a real handler returns its
	// provider client's (the side effect happened, the answer is lost). It
	// must honour ctx. Defaults to an immediate answer.
	Provider func(ctx context.Context) error
}

// reachProvider is the start of a provider call: like a real provider client
// it sends nothing on a context that has already ended.
func reachProvider(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	return nil
}

// awaitProvider waits for the simulated provider's answer.
func (s *Server) awaitProvider(ctx context.Context) error {
	if s.Provider == nil {
		return nil
	}
	return s.Provider(ctx)
}

// ChargeCard implements paymentsv1.PaymentsServiceServer.
func (s *Server) ChargeCard(ctx context.Context, req *paymentsv1.ChargeCardRequest) (*paymentsv1.ChargeCardResponse, error) {
	if req.GetCustomerId() == "" || req.GetAmountCents() <= 0 {
		return nil, status.Error(codes.InvalidArgument, "customer_id is required and amount_cents must be positive")
	}
	// The key a payment provider dedupes on: unique per tenant and method.
	key, _ := idemgate.DownstreamKeyFromContext(ctx)
	if err := reachProvider(ctx); err != nil {
		return nil, err
	}
	l := s.Ledger
	l.mu.Lock()
	c := Charge{ID: l.nextID("ch", len(l.charges)+1), CustomerID: req.GetCustomerId(), AmountCents: req.GetAmountCents(), IdempotencyKey: key}
	l.charges = append(l.charges, c)
	b := l.customer(c.CustomerID)
	b.charges++
	b.chargedCents += c.AmountCents
	l.mu.Unlock()
	if err := s.awaitProvider(ctx); err != nil {
		return nil, err
	}
	return &paymentsv1.ChargeCardResponse{ChargeId: c.ID, CustomerId: c.CustomerID, AmountCents: c.AmountCents}, nil
}

// SendReceipt implements paymentsv1.PaymentsServiceServer.
func (s *Server) SendReceipt(ctx context.Context, req *paymentsv1.SendReceiptRequest) (*paymentsv1.SendReceiptResponse, error) {
	if req.GetCustomerId() == "" || req.GetChargeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "customer_id and charge_id are required")
	}
	if err := reachProvider(ctx); err != nil {
		return nil, err
	}
	l := s.Ledger
	l.mu.Lock()
	l.receipts++
	l.customer(req.GetCustomerId()).receipts++
	id := l.nextID("msg", l.receipts)
	l.mu.Unlock()
	if err := s.awaitProvider(ctx); err != nil {
		return nil, err
	}
	return &paymentsv1.SendReceiptResponse{MessageId: id}, nil
}

// GetBalance implements paymentsv1.PaymentsServiceServer.
func (s *Server) GetBalance(_ context.Context, req *paymentsv1.GetBalanceRequest) (*paymentsv1.GetBalanceResponse, error) {
	l := s.Ledger
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.customer(req.GetCustomerId())
	return &paymentsv1.GetBalanceResponse{CustomerId: req.GetCustomerId(), ChargedCents: b.chargedCents, Charges: b.charges, Receipts: b.receipts}, nil
}
