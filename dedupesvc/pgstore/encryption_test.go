package pgstore_test

import (
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/pgstore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
	"github.com/idemgate/idemgate/internal/testing/pgtest"
)

func TestEncryption(t *testing.T) {
	storetest.RunEncryption(t, func(t *testing.T) dedupesvc.Store {
		pool, schema := pgtest.Schema(t)
		return pgstore.New(pool, pgstore.WithChannel(schema))
	}, storetest.Raw{Outcome: rawOutcome, SetOutcome: setRawOutcome})
}

func rawOutcome(t *testing.T, s dedupesvc.Store, id dedupesvc.RecordID) ([]byte, string) {
	t.Helper()
	var (
		value []byte
		keyID *string
	)
	err := s.(*pgstore.Store).Pool().QueryRow(ctx, `SELECT outcome_value, outcome_key_id FROM idemgate_records WHERE namespace = $1 AND scope = $2 AND idempotency_key = $3`,
		id.Namespace, id.Scope, id.Key).Scan(&value, &keyID)
	if err != nil {
		t.Fatal(err)
	}
	if keyID == nil {
		return value, ""
	}
	return value, *keyID
}

func setRawOutcome(t *testing.T, s dedupesvc.Store, id dedupesvc.RecordID, value []byte, keyID string) {
	t.Helper()
	_, err := s.(*pgstore.Store).Pool().Exec(ctx, `UPDATE idemgate_records SET outcome_value = $4, outcome_key_id = nullif($5, '') WHERE namespace = $1 AND scope = $2 AND idempotency_key = $3`,
		id.Namespace, id.Scope, id.Key, value, keyID)
	if err != nil {
		t.Fatal(err)
	}
}
