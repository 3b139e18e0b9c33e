package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	paymentsv1 "github.com/idemgate/idemgate/gen/examples/payments/v1"
)

// The floor pair is not copied from dedupesvc/pgstore: the load test runs
// one fresh-key Begin and one Finish through pgstore on the floor's
// database, records the statements pgx sends, and turns the reserve INSERT
// and the Finish UPDATE into a pgbench script. So the floor is always the
// store's current SQL, with the arguments the store binds.

// statement is one SQL statement as pgx sent it.
type statement struct {
	SQL  string
	Args []any
}

// recorder is a pgx.QueryTracer that keeps the statements sent while on.
type recorder struct {
	mu  sync.Mutex
	on  bool
	got []statement
}

// TraceQueryStart implements pgx.QueryTracer.
func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on {
		r.got = append(r.got, statement{SQL: d.SQL, Args: d.Args})
	}
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the statements recorded since the last take and keeps
// recording.
func (r *recorder) take() []statement {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got, r.on = nil, true
	return got
}

// floorScope is the scope the captured pair is bound with: the payments
// server's gated method, as the interceptor scopes it without tenants.
const floorScope = "/examples.payments.v1.PaymentsService/ChargeCard"

// captureFloor migrates the database at dbURL with the project's
// migrations, marks it resumed as a starting Dedupe service does, and
// returns the reserve INSERT and the Finish UPDATE that pgstore runs for
// one fresh key, with their arguments, that key and the epoch it got.
func captureFloor(ctx context.Context, dbURL string) (reserve, finish statement, key string, epoch int64, err error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return statement{}, statement{}, "", 0, err
	}
	rec := &recorder{}
	cfg.ConnConfig.Tracer = rec
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return statement{}, statement{}, "", 0, err
	}
	defer pool.Close()
	if _, err := pgstore.Migrate(ctx, pool); err != nil {
		return statement{}, statement{}, "", 0, fmt.Errorf("migrate the floor's database: %w", err)
	}
	store := pgstore.New(pool) // notifications on, as dedupesvc runs by default
	if err := store.MarkResumed(ctx); err != nil {
		return statement{}, statement{}, "", 0, err
	}

	key = "loadtest-capture-" + rand.Text()
	token := rand.Text()
	fingerprint := sha256.Sum256([]byte(key))
	rec.take()
	res, err := store.Begin(ctx, dedupesvc.BeginParams{
		Scope: floorScope, Key: key, Fingerprint: fingerprint[:], AttemptToken: token,
		Lease: 10 * time.Second, Retention: 24 * time.Hour, OnLostOutcome: dedupesvc.FailClosed,
		// No quota: the Dedupe service asks the store to skip its usage read
		// for a caller far below its quotas (its usage ledger), as every
		// caller of the gated rows is.
		UnknownRetention: 7 * 24 * time.Hour,
	})
	if err != nil {
		return statement{}, statement{}, "", 0, fmt.Errorf("capture Begin: %w", err)
	}
	if res.State != dedupesvc.BeginReserved {
		return statement{}, statement{}, "", 0, fmt.Errorf("capture Begin: a fresh key answered %v, want reserved", res.State)
	}
	begun := rec.take()
	value, err := proto.Marshal(&paymentsv1.ChargeCardResponse{ChargeId: "ch_000001", CustomerId: "cust_loadtest", AmountCents: 100})
	if err != nil {
		return statement{}, statement{}, "", 0, err
	}
	if err := store.Finish(ctx, dedupesvc.FinishParams{
		Scope: floorScope, Key: key, AttemptToken: token, Epoch: res.Epoch,
		Outcome: dedupesvc.Outcome{TypeURL: "type.googleapis.com/examples.payments.v1.ChargeCardResponse", Value: value},
	}); err != nil {
		return statement{}, statement{}, "", 0, fmt.Errorf("capture Finish: %w", err)
	}
	finished := rec.take()

	reserve, ok := find(begun, "INSERT INTO idemgate_records")
	if !ok {
		return statement{}, statement{}, "", 0, fmt.Errorf("pgstore's Begin sent no INSERT INTO idemgate_records; it sent:\n%s", sqlOf(begun))
	}
	finish, ok = find(finished, "UPDATE idemgate_records")
	if !ok {
		return statement{}, statement{}, "", 0, fmt.Errorf("pgstore's Finish sent no UPDATE idemgate_records; it sent:\n%s", sqlOf(finished))
	}
	return reserve, finish, key, res.Epoch, nil
}

// find returns the first statement whose SQL contains what.
func find(stmts []statement, what string) (statement, bool) {
	for _, s := range stmts {
		if strings.Contains(s.SQL, what) {
			return s, true
		}
	}
	return statement{}, false
}

func sqlOf(stmts []statement) string {
	var b strings.Builder
	for _, s := range stmts {
		fmt.Fprintf(&b, "%s;\n", strings.TrimSpace(s.SQL))
	}
	return b.String()
}

// floorScript is a pgbench custom script and the variables (-D name=value)
// it needs.
type floorScript struct {
	Script string
	Vars   []string
	// reserve and finish are the two statements as the script has them,
	// without their \gset or semicolon, for batched.
	reserve, finish string
}

var (
	keyVar = regexp.MustCompile(`:key\b`)
	// epochCheck is the Finish's check of the epoch its reserve got.
	epochCheck = regexp.MustCompile(`(\w+\.)?epoch = :floor_epoch\b`)
)

// batched is the floor pair committed as group commit commits it: n
// reserves in one transaction, then their n Finishes in another, so n
// pairs share two commits, each batch sent in one round trip as pgx sends
// a pgx.Batch (a pgbench pipeline, whose statements up to its sync are one
// implicit transaction). pgbench counts a run of it as one transaction, of
// n pairs. A pipeline cannot \gset, so a Finish cannot name the epoch its
// reserve returned: its check becomes the column compared with itself (the
// same index lookup and row filter, with no fencing to test); the check
// that every record ended completed still holds it to its reserve.
func (fs floorScript) batched(n int) (string, error) {
	if len(epochCheck.FindAllStringIndex(fs.finish, -1)) != 1 {
		return "", errors.New("the Finish does not check the epoch once as \"[alias.]epoch = :floor_epoch\"")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- The floor pair batched: %d reserves in one pipelined transaction, then their %d\n", n, n)
	b.WriteString("-- Finishes in another, as the store's group commit writes a batch.\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "\\set key%d random(1, 999999999999999)\n", i)
	}
	b.WriteString("\\startpipeline\n")
	for i := 1; i <= n; i++ {
		b.WriteString(keyVar.ReplaceAllString(fs.reserve, fmt.Sprintf(":key%d", i)) + ";\n")
	}
	b.WriteString("\\endpipeline\n\\startpipeline\n")
	for i := 1; i <= n; i++ {
		sql := keyVar.ReplaceAllString(fs.finish, fmt.Sprintf(":key%d", i))
		b.WriteString(epochCheck.ReplaceAllString(sql, "${1}epoch = ${1}epoch") + ";\n")
	}
	b.WriteString("\\endpipeline\n")
	return b.String(), nil
}

var placeholder = regexp.MustCompile(`\$(\d+)`)

// renderFloor turns the captured statements into a pgbench script: each
// statement its own transaction (pgbench runs a statement outside BEGIN in
// autocommit), the captured key replaced by :key, a fresh number a run,
// every other argument bound from a -D variable (run with -M prepared, as
// pgx prepares), and a NULL or empty argument written as NULL or as an
// empty string literal. The store hands out epochs from a sequence, so each
// run's Finish names the epoch its reserve got: the reserve stores the one
// it returns first (reserved.epoch, aliased floor_epoch) with \gset, and the
// Finish argument that was the captured epoch becomes :floor_epoch.
func renderFloor(reserve, finish statement, key string, epoch int64) (floorScript, error) {
	var fs floorScript
	var b strings.Builder
	b.WriteString("-- The floor pair: the reserve INSERT and the Finish UPDATE that dedupesvc/pgstore\n")
	b.WriteString("-- sends for a fresh key, captured from it by the load test; each commits alone.\n")
	b.WriteString("\\set key random(1, 999999999999999)\n")
	epochArgs := map[string]bool{}
	const returned = "SELECT reserved.epoch,"
	if strings.Count(reserve.SQL, returned) != 1 {
		return floorScript{}, fmt.Errorf("the captured reserve does not return its new epoch as %q once, so the Finish cannot name it", returned)
	}
	reserve.SQL = strings.Replace(reserve.SQL, returned, "SELECT reserved.epoch AS floor_epoch,", 1)
	for _, st := range []struct {
		prefix string
		stmt   statement
	}{{"r", reserve}, {"f", finish}} {
		var bad error
		bound := map[string]bool{}
		sql := placeholder.ReplaceAllStringFunc(st.stmt.SQL, func(p string) string {
			n, _ := strconv.Atoi(p[1:])
			if n < 1 || n > len(st.stmt.Args) {
				bad = fmt.Errorf("%s has no argument for it (%d given)", p, len(st.stmt.Args))
				return p
			}
			arg := st.stmt.Args[n-1]
			if s, ok := arg.(string); ok && s == key {
				return ":key"
			}
			if n, ok := arg.(int64); ok && st.prefix == "f" && n == epoch {
				epochArgs[p] = true
				return ":floor_epoch"
			}
			text, null, err := argText(arg)
			if err != nil {
				bad = fmt.Errorf("%s: %w", p, err)
				return p
			}
			switch {
			case null:
				return "NULL"
			case text == "":
				return "''" // pgbench refuses an empty -D variable
			}
			name := fmt.Sprintf("%s%d", st.prefix, n)
			if !bound[name] {
				bound[name] = true
				fs.Vars = append(fs.Vars, name+"="+text)
			}
			return ":" + name
		})
		if bad != nil {
			return floorScript{}, bad
		}
		if strings.Contains(sql, ";") {
			return floorScript{}, errors.New("a captured statement contains a semicolon, which would split it in a pgbench script")
		}
		b.WriteString(strings.TrimSpace(sql))
		if st.prefix == "r" {
			fs.reserve = strings.TrimSpace(sql)
			b.WriteString(" \\gset\n")
		} else {
			fs.finish = strings.TrimSpace(sql)
			b.WriteString(";\n")
		}
	}
	if !strings.Contains(b.String(), ":key") {
		return floorScript{}, errors.New("the captured statements do not bind the key")
	}
	if len(epochArgs) != 1 {
		return floorScript{}, fmt.Errorf("the captured Finish binds the epoch %d in %d places, want exactly one", epoch, len(epochArgs))
	}
	fs.Script = b.String()
	return fs, nil
}

// argText is an argument in PostgreSQL's text input format; null for a nil
// argument or nil pointer.
func argText(arg any) (text string, null bool, err error) {
	v := reflect.ValueOf(arg)
	for v.IsValid() && v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return "", true, nil
		}
		v = v.Elem()
	}
	if !v.IsValid() {
		return "", true, nil
	}
	switch v.Kind() {
	case reflect.String:
		return v.String(), false, nil
	case reflect.Bool:
		return strconv.FormatBool(v.Bool()), false, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10), false, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(v.Uint(), 10), false, nil
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return `\x` + hex.EncodeToString(v.Bytes()), false, nil
		}
	}
	return "", false, fmt.Errorf("argument of type %T has no text form here", arg)
}
