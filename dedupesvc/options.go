package dedupesvc

import (
	"log/slog"
	"time"
)

type options struct {
	logger          *slog.Logger
	storeRetryAfter time.Duration
}

var defaultOptions = options{
	logger:          slog.Default(),
	storeRetryAfter: 200 * time.Millisecond,
}

// Option configures NewServer.
type Option func(*options)

// WithLogger sets the logger for store failures. Defaults to slog.Default().
func WithLogger(logger *slog.Logger) Option {
	return func(o *options) { o.logger = logger }
}

// WithStoreRetryAfter sets the RetryInfo delay sent with
// DEDUPE_STORE_UNAVAILABLE. Defaults to 200ms.
func WithStoreRetryAfter(d time.Duration) Option {
	return func(o *options) { o.storeRetryAfter = d }
}
