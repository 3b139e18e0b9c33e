package chaos

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Ledger events, in the order one execution writes them.
const (
	// EventStart: the handler began, under a reservation.
	EventStart = "start"
	// EventEffect: the side effect happened; the record holds the response
	// the handler is about to return.
	EventEffect = "effect"
	// EventEnd: the handler is returning; Error is set when it fails.
	EventEnd = "end"
)

// LedgerEntry is one line of a tool server's ledger.
type LedgerEntry struct {
	// Event is EventStart, EventEffect or EventEnd.
	Event string `json:"event"`
	// Server names the tool server; Pid is its process.
	Server string `json:"server"`
	Pid    int    `json:"pid"`
	// Key is the idempotency key, Action the request's action, Method the
	// full gRPC method.
	Key    string `json:"key"`
	Action string `json:"action"`
	Method string `json:"method"`
	// Epoch is the reservation's fencing epoch.
	Epoch int64 `json:"epoch"`
	// Time is when the line was written, on the local clock.
	Time time.Time `json:"time"`
	// Response is the wire encoding of the response (EventEffect only).
	Response []byte `json:"response,omitempty"`
	// Error is the handler's error (EventEnd only).
	Error string `json:"error,omitempty"`
	// CallerGone: the handler set its response metadata after its caller
	// had given up (EventEnd of a LateMetadataSuffix key only).
	CallerGone bool `json:"caller_gone,omitempty"`
}

// Ledger appends entries to a file, each written and fsynced before Append
// returns, so an execution a caller may have seen survives a SIGKILL.
type Ledger struct {
	mu sync.Mutex
	f  *os.File
}

// OpenLedger opens path for appending, creating it if needed.
func OpenLedger(path string) (*Ledger, error) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	return &Ledger{f: f}, nil
}

// Append writes e as one line and fsyncs it.
func (l *Ledger) Append(e LedgerEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.f.Write(b); err != nil {
		return err
	}
	return l.f.Sync()
}

// Close closes the file.
func (l *Ledger) Close() error { return l.f.Close() }

// Attempt is one line of the workload's history: one call as the
// application's innermost interceptor saw it, below the retry interceptor
// and above grpc-go's own transparent and service-config retries.
type Attempt struct {
	// Action names the logical action; Key is its idempotency key; Method
	// the full gRPC method.
	Action string `json:"action"`
	Key    string `json:"key"`
	Method string `json:"method"`
	// Caller numbers the concurrent callers of one action, from 0.
	Caller int `json:"caller"`
	// Attempt counts the application loop's calls of this caller, from 1;
	// Try the retry interceptor's tries within one, from 1.
	Attempt int `json:"attempt"`
	Try     int `json:"try"`
	// Target is the tool server's address.
	Target string `json:"target"`
	// Start and End bracket the try.
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Code is the status code's name; Reason the ErrorInfo reason, if any.
	Code   string `json:"code"`
	Reason string `json:"reason,omitempty"`
	// Response is the response as it came off the wire (OK only).
	Response []byte `json:"response,omitempty"`
	// Replayed is the idempotency-replayed response header.
	Replayed bool `json:"replayed"`
	// Header and Trailer are the response metadata the handler set (keys
	// starting with MetadataPrefix), as it came off the wire (OK only).
	Header  map[string][][]byte `json:"header,omitempty"`
	Trailer map[string][][]byte `json:"trailer,omitempty"`
}

// ReadLedger reads ledger files. A last line cut short by a SIGKILL mid-write
// is counted in torn, not returned: its fsync never finished, so the handler
// never answered from it.
func ReadLedger(paths ...string) (entries []LedgerEntry, torn int, err error) {
	for _, p := range paths {
		err := readLines(p, func(line []byte, last bool) error {
			var e LedgerEntry
			if err := json.Unmarshal(line, &e); err != nil {
				if last {
					torn++
					return nil
				}
				return fmt.Errorf("%s: %w", p, err)
			}
			entries = append(entries, e)
			return nil
		})
		if err != nil {
			return nil, 0, err
		}
	}
	return entries, torn, nil
}

// ReadHistory reads history files.
func ReadHistory(paths ...string) ([]Attempt, error) {
	var attempts []Attempt
	for _, p := range paths {
		err := readLines(p, func(line []byte, _ bool) error {
			var a Attempt
			if err := json.Unmarshal(line, &a); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			attempts = append(attempts, a)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return attempts, nil
}

// readLines calls fn with each non-empty line of path, and last set for the
// final one.
func readLines(path string, fn func(line []byte, last bool) error) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil // a server that never executed anything wrote no ledger
	}
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var pending []byte
	for {
		line, err := r.ReadBytes('\n')
		line = bytes.TrimSpace(line)
		if pending != nil {
			if ferr := fn(pending, len(line) == 0 && err == io.EOF); ferr != nil {
				return ferr
			}
			pending = nil
		}
		if len(line) > 0 {
			pending = line
		}
		if err == io.EOF {
			if pending != nil {
				return fn(pending, true)
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
}
