package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestUnreachable(t *testing.T) {
	t.Parallel()
	live := context.Background()
	ended, cancel := context.WithCancel(live)
	cancel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"connection refused", live, fmt.Errorf("pgstore: read record: %w", refused), true},
		{"connection reset", live, syscall.ECONNRESET, true},
		{"unexpected EOF", live, io.ErrUnexpectedEOF, true},
		{"conn closed", live, pgconn.ErrConnClosed, true},
		{"admin shutdown", live, &pgconn.PgError{Code: "57P01"}, true},
		{"cannot connect now", live, &pgconn.PgError{Code: "57P03"}, true},
		{"connection exception", live, &pgconn.PgError{Code: "08006"}, true},
		{"admin shutdown, the caller gone too", ended, &pgconn.PgError{Code: "57P01"}, true},
		{"unique violation", live, &pgconn.PgError{Code: "23505"}, false},
		{"invalid byte sequence", live, &pgconn.PgError{Code: "22021"}, false},
		{"serialization failure", live, &pgconn.PgError{Code: "40001"}, false},
		{"the caller cancelled", ended, context.Canceled, false},
		{"the caller cancelled mid-read", ended, io.ErrUnexpectedEOF, false},
		{"a plain error", live, errors.New("boom"), false},
	}
	for _, tt := range tests {
		if got := unreachable(tt.ctx, tt.err); got != tt.want {
			t.Errorf("%s: unreachable = %v, want %v", tt.name, got, tt.want)
		}
	}
}
