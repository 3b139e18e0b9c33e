package sqlitestore_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
	"github.com/idemgate/idemgate/dedupesvc/sqlitestore"
	"github.com/idemgate/idemgate/dedupesvc/storetest"
)

func TestEncryption(t *testing.T) {
	storetest.RunEncryption(t, func(t *testing.T) dedupesvc.Store {
		s, err := sqlitestore.Open(context.Background(), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}, storetest.Raw{Outcome: rawOutcome, SetOutcome: setRawOutcome})
}

// rawDB opens a second connection to the store's file, so the test reads and
// writes rows around the store.
func rawDB(t *testing.T, s dedupesvc.Store) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+s.(*sqlitestore.Store).Path()+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func rawOutcome(t *testing.T, s dedupesvc.Store, id dedupesvc.RecordID) ([]byte, string) {
	t.Helper()
	var (
		value []byte
		keyID sql.NullString
	)
	err := rawDB(t, s).QueryRow(`SELECT outcome_value, outcome_key_id FROM idemgate_records WHERE namespace = ? AND scope = ? AND idempotency_key = ?`,
		id.Namespace, id.Scope, id.Key).Scan(&value, &keyID)
	if err != nil {
		t.Fatal(err)
	}
	return value, keyID.String
}

func setRawOutcome(t *testing.T, s dedupesvc.Store, id dedupesvc.RecordID, value []byte, keyID string) {
	t.Helper()
	_, err := rawDB(t, s).Exec(`UPDATE idemgate_records SET outcome_value = ?, outcome_key_id = nullif(?, '') WHERE namespace = ? AND scope = ? AND idempotency_key = ?`,
		value, keyID, id.Namespace, id.Scope, id.Key)
	if err != nil {
		t.Fatal(err)
	}
}
