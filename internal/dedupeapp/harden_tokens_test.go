package dedupeapp_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemgatev1 "github.com/idemgate/idemgate/gen/idemgate/v1"
	"github.com/idemgate/idemgate/internal/dedupeapp"
)

// The token file is reloaded when it changes: a removed token stops working
// without a restart. One readable by group or others is refused, at start
// and on reload (the previous tokens stay in force then).
func TestTokenFileIsReloadedAndMustBePrivate(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, "payments client "+clientSecret+"\n")
	addr, logs := startLogged(t, dedupeapp.Config{TokenFile: path, TokenReloadInterval: 50 * time.Millisecond})
	begin := func(secret string) error {
		_, err := idemgatev1.NewDedupeServiceClient(dial(t, addr, withToken(secret))).Begin(callCtx(t), beginRequest("k-"+secret[:3]))
		return err
	}
	if err := begin(clientSecret); err != nil {
		t.Fatal(err)
	}
	const newSecret = "rotated-payments-secret-0123456789"
	writeTokens(t, path, "payments client "+newSecret+"\n")
	eventually(t, "the removed token is refused", func() bool { return status.Code(begin(clientSecret)) == codes.Unauthenticated })
	if err := begin(newSecret); err != nil {
		t.Fatalf("the added token: %v", err)
	}

	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a warning about the readable token file", func() bool { return strings.Contains(logs.String(), "chmod 600 "+path) })
	if err := begin(newSecret); err != nil {
		t.Fatalf("after a refused reload, the tokens in force: %v", err)
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	err = dedupeapp.Serve(context.Background(), dedupeapp.Config{DataDir: t.TempDir(), TokenFile: path}, lis, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "chmod 600 "+path) {
		t.Fatalf("Serve with a world-readable token file: %v, want a refusal naming the file and the chmod to run", err)
	}
}

// SIGHUP reloads the token file at once.
func TestTokenFileIsReloadedOnSIGHUP(t *testing.T) {
	// Not parallel: it signals the test process.
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, "payments client "+clientSecret+"\n")
	addr, _ := startLogged(t, dedupeapp.Config{TokenFile: path, TokenReloadInterval: -1})
	dedupe := idemgatev1.NewDedupeServiceClient(dial(t, addr, withToken(clientSecret)))
	if _, err := dedupe.Begin(callCtx(t), beginRequest("k")); err != nil {
		t.Fatal(err)
	}
	writeTokens(t, path, "payments client rotated-payments-secret-0123456789\n")
	if err := sighup(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the removed token is refused after SIGHUP", func() bool {
		_, err := dedupe.Begin(callCtx(t), beginRequest("k"))
		return status.Code(err) == codes.Unauthenticated
	})
}
