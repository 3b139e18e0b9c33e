package pgstore

import (
	"strings"
	"testing"
)

// TestCitusFormsKeepNoFormCitusRefuses: every statement's Citus form has
// no timestamptz + interval, CASE, subquery on the store state or nextval
// in an UPDATE left, which Citus refuses in UPDATE, DELETE or INSERT on a
// distributed table; every server start in a lease's grace is joined by
// the start of the worker holding the row and by the resume mark of the
// row's shard; the plain forms are what they were.
func TestCitusFormsKeepNoFormCitusRefuses(t *testing.T) {
	for name, sql := range map[string]string{
		"read": readSQL, "first": firstSQL, "reserve": reserveSQL, "markUnknown": markUnknownSQL, "finish": finishSQL,
		"resolveComplete": resolveCompleteSQL, "resolveRelease": resolveReleaseSQL, "heartbeat": heartbeatSQL,
		"renew": renewSQL, "markLost": markLostSQL, "lostCandidates": lostCandidatesSQL, "forget": forgetSQL,
		"citusExpired": citusExpiredSQL, "citusDelete": citusDeleteSQL, "citusAddReplay": citusAddReplaySQL,
	} {
		out, _ := citusForm(sql)
		if starts, workers := strings.Count(sql, "pg_postmaster_start_time()"), strings.Count(out, "idemgate_server_start_plus_ms("); starts != workers {
			t.Errorf("%s: %d server starts in a lease's grace, %d of them the worker's in the Citus form:\n%s", name, starts, workers, out)
		}
		if starts, marks := strings.Count(sql, "pg_postmaster_start_time()"), strings.Count(out, "idemgate_shard_resumed_plus_ms("); starts != marks {
			t.Errorf("%s: %d leases' graces, %d of them with the shard's resume mark in the Citus form:\n%s", name, starts, marks, out)
		}
		for _, refused := range []string{"interval '1 millisecond'", "CASE WHEN", "greatest(nextval"} {
			if strings.Contains(out, refused) {
				t.Errorf("%s: Citus form still has %q:\n%s", name, refused, out)
			}
		}
	}
	out, extra := citusForm(resolveReleaseSQL)
	if len(extra) != 1 || extra[0] != extraEpoch || !strings.Contains(out, "greatest($4::bigint, ") {
		t.Errorf("resolveRelease's epoch is not parameter $4 (%v):\n%s", extra, out)
	}
	out, extra = citusForm(reserveSQL)
	if len(extra) != 4 || extra[1] != extraResumedAt || strings.Contains(out, resumedAtSubquery) || !strings.Contains(out, "$11::timestamptz") || strings.Contains(out, "now()") || strings.Contains(out, "pg_postmaster_start_time()") {
		t.Errorf("reserve's resume time is not parameter $11 (%v):\n%s", extra, out)
	}
	if got, _ := citusForm(`SELECT CASE WHEN a THEN greatest(b, now() + t.x * interval '1 millisecond') ELSE c END`); got != `SELECT idemgate_case(a, greatest(b, idemgate_plus_ms(now(), t.x)), c)` {
		t.Errorf("citusForm = %s", got)
	}
}
