/*
 * idemgate's reservation protocol for one key, checked with SPIN (`make model`).
 *
 * Each store operation is one atomic step, as each is one SQL statement (RunBegin's
 * read-then-write is atomic here because every write re-checks what DecideBegin read).
 * Comments name the Go code each step mirrors.
 *
 * Configurations (-D at `spin -a`):
 *   (default)        FAIL_CLOSED; a Begin re-sent after a lost answer reaches the store
 *                    while the lease it may have made still runs (timing assumption T2).
 *   -DREEXECUTE      REEXECUTE; re-sent Begins may arrive at any time (-DLATE_RESEND implied).
 *   -DLATE_RESEND    drops T2 for FAIL_CLOSED too: a re-sent Begin may come after the lease (see below).
 *   -DEARLIER_SERVICE the follow-up of a lost Begin as with a Dedupe service without
 *                    ReleaseLostBegins: the same Begin re-sent, what it reserved released.
 *   -DHOLE_*         puts one fixed hole back; `make model` requires each to be found.
 *
 * Timing assumptions, enforced by the clock (proctype Env), each with what enforces it:
 *   T1: a live, unpaused holder whose keepLease runs renews before its effective lease ends
 *       while the store answers. Enforced by: keepLease renews every third of the lease and
 *       re-sends a failed renewal every tenth; after an outage the store answers only once its
 *       resume mark committed, and then grants every in-flight lease one full lease (EFF), so the
 *       clock runs free while the store is away. What T1 still assumes is that, once the service
 *       answers again, the holder's renewal gets through within that one lease: the gate resets
 *       its connection's reconnect backoff when the service answers again (issue 18), where
 *       grpc-go's default backoff took 4-8 s after a 20 s outage. -DHOLE_SLOW_RECONNECT drops
 *       T1 after an outage (the holder reconnects, and renews, arbitrarily late): SPIN then hands
 *       the live holder's key away.
 *   T2: likewise for an attempt whose Begin answer was lost and that is followed up
 *       (followUpLostBegin: ReleaseLostBegins, or with -DEARLIER_SERVICE the Begin re-sent),
 *       unless LATE_RESEND. Enforced by: the follow-up frees a crowd in a few batched calls
 *       about a backoff step (at most a quarter lease) after the service answers again (issue
 *       38). One by one at 250 a second a crowd of 480 in a 3s lease broke T2 on a loaded
 *       machine: -DHOLE_SLOW_FOLLOWUP drops T2 (but keeps its assertion), and SPIN finds the
 *       duplicate that marks a never-run reservation outcome-unknown.
 *   Outages end within the finish retry budget, so no settlement or follow-up is given up.
 *
 * A late re-sent Begin (-DLATE_RESEND): attempt A's Begin reserves, its answer is lost, and A's
 * re-sent Begin (gRPC retry or followUpLostBegin) arrives after the lease ended, so B's Begin may
 * mark the record outcome-unknown first: B is told OUTCOME_UNKNOWN for a handler that never ran
 * (a false alarm, allowed here and only here). The model found that this left the key blocked
 * for good; now A's late Begin takes its record back (DecideBegin: StepRenew on the attempt's own
 * unknown record) and the follow-up releases it, so no key stays blocked (Invariant 3b);
 * -DHOLE_LATE_RESEND_STRANDS puts the old behaviour back.
 *
 * Issue 18 added: the resume mark after the store comes back (pgstore resume; operations and
 * the sweeper wait for it), the holder's reconnect (T1), retention (expires_at, R ticks from the
 * reservation) and the sweeper, epochs from a store-wide source, the gate's replay-cache stamp
 * for a Finish retried after a lost answer, Invariant 4 as a state invariant, and 5-7.
 *
 * Issue 31 added the caller's answer (answer[], Invariant 8): a holder answers its caller OK only
 * once its Finish is acknowledged (gatecore settle retries a failed Finish before the answer, its
 * lease renewed, for at most a lease, then refuses it with ABORTED IDEMPOTENCY_IN_FLIGHT while
 * the retries go on: see settle_finish); a fenced Finish refuses it too. -DHOLE_FIRST_FINISH_ANSWERS puts the old settle back: a holder whose lease was
 * still confirmed when its first Finish failed answered OK at once, and SPIN finds the caller
 * holding an outcome the key never keeps: the holder answers during an outage, then stalls past
 * its lease, and its record is swept (REEXECUTE) or resolved by an operator, so its own outcome
 * is never stored.
 *
 * Abstracted away: fingerprints (one request per key), response metadata, max_wait waiting
 * (a duplicate answered in flight just returns), reconcilers (operator Resolve stands for them),
 * more than one replica (one cut-off flag and one store-wide resumed tick), NOTIFY, outcome
 * size limits, the caller giving up (the handler's context is detached from it, so nothing
 * the model sees changes, except under HOLE_CALLER_CANCEL). A completed record's expiry is
 * never acted on (past it a call is a new action, outside these invariants), and an
 * outcome-unknown record is kept beyond the horizon (the unknown retention, 7 days by default,
 * is far longer than the retention).
 */

#ifdef REEXECUTE
#ifndef LATE_RESEND
#define LATE_RESEND
#endif
#endif

#define NA    2  /* attempts: tool-server calls with the same key, each with its own token */
#define L     2  /* lease, in clock ticks */
#define R     3  /* retention, in clock ticks: longer than the lease, so both end within the horizon */
#define MAXT  4  /* the clock stops here: bounds the state space */
#define NEVER 255 /* an expiry beyond the horizon */
#define OP    9  /* outcome stored by an operator's Resolve(complete) */

mtype = { NONE, INFLIGHT, COMPLETED, RELEASED, UNKNOWN };          /* record states (dedupesvc.State*) */
mtype = { A_RESERVED, A_COMPLETED, A_INFLIGHT, A_UNKNOWN, A_ERR };  /* Begin answers */
mtype = { OK, NOTHELD, ERR };                                        /* Finish/Release answers */

/* The record (idemgate_records row; NONE once the sweeper deleted it). tok is attempt id+1;
 * outc is who stored the outcome; lend is lease_expires_at, read only while the record is in
 * flight, so 0 once it is not; exp is expires_at. */
mtype st = NONE;
byte ep, tok, lend, outc, exp;

/* The store's clock, availability and last resume (idemgate_store_state.resumed_at). cut is
 * pgstore's cutOff: the store is back but its resume mark has not committed yet. */
byte now;
bool up = true;
bool cut;
byte resumed;

/* Ghost state for the properties. */
byte execs;      /* side effects that happened */
byte failures;   /* holders that crashed or stalled without storing an outcome, or REEXECUTE unknown errors */
byte firstoutc;  /* the first outcome stored: every later replay must be it */
byte maxep;      /* the highest epoch a reservation got */
byte ctime;      /* when the store completed the record, until its holder hears (Invariant 7) */
byte answer[NA]; /* what the holder answered its caller: ANS_NONE, ANS_OK (its own outcome) or ANS_REFUSED */
bool started[NA], ran[NA], stored[NA], crashed[NA], paused[NA], mayrun[NA];
bool keeping[NA];  /* keepLease runs for this attempt */
bool pending[NA];  /* a lost Begin answer is being followed up */
byte myep[NA];
byte finished;     /* attempts that are done or dead */

#define ANS_NONE    0
#define ANS_OK      1
#define ANS_REFUSED 2

/* Budgets for the nondeterministic faults. */
byte lostreplies, crashes, pauses, outages, resolves;
#define MAXLOST 1

/* pgstore leaseEnd(): greatest(lease_expires_at, resumed_at + lease). */
#ifdef HOLE_OUTAGE_COUNTS
#define EFF (lend)
#else
#define EFF ((lend > resumed + L) -> lend : (resumed + L))
#endif
#define EXPIRED (EFF <= now)

/* pgstore resume: every operation, the sweeper's too, waits until the resume mark committed
 * (issue 18): WAITMARK guards each store step. The holes: resume cleared cutOff before
 * MarkResumed committed, so an operation in that window decided on the old resumed_at; and the
 * sweeper never called resume at all. The mark is its own step (MARKSTEP) only with one of these
 * holes: with every operation waiting for it, a store that answers but has not marked yet does
 * nothing a store still away does not (a waiting step is a step not yet taken, and the clock is
 * free in both), so the fixed configurations let the mark commit as the store comes back. */
#if defined(HOLE_RESUME_NOT_ATOMIC) || defined(HOLE_SWEEPER_NO_RESUME)
#define MARKSTEP
#endif
#ifdef HOLE_RESUME_NOT_ATOMIC
#define WAITMARK 0
#else
#define WAITMARK cut
#endif
#ifdef HOLE_SWEEPER_NO_RESUME
#define SWEEPWAIT 0
#else
#define SWEEPWAIT WAITMARK
#endif

/* An in-flight record past both its lease and its retention (pgstore: greatest(expires_at,
 * leaseEnd) <= now). Under REEXECUTE it counts as absent: reserved anew, swept. Under FAIL_CLOSED
 * it counts as outcome-unknown until its unknown retention (issue 18): the hole let a retry after
 * the retention reserve it and run again, and the sweeper delete it without the unknown warning. */
#define INFL_PAST (st == INFLIGHT && EXPIRED && exp <= now)
#if defined(REEXECUTE) || defined(HOLE_RETENTION_RUNS_AGAIN)
#define INFL_GONE INFL_PAST
#else
#define INFL_GONE 0
#endif
#define ABSENT (st == NONE || st == RELEASED || INFL_GONE)

/* The record is attempt i's live reservation, so T1/T2 bind the clock. */
#define MINE(i) (st == INFLIGHT && tok == (i)+1)
#ifdef HOLE_SLOW_RECONNECT
#define RECONNECTED(i) (outages == 0)  /* after an outage a holder renews whenever it gets back */
#else
#define RECONNECTED(i) 1               /* it gets back, and renews, within its lease (T1) */
#endif
#ifdef HOLE_SLOW_FOLLOWUP
#define FOLLOWED_UP(i) 0  /* a crowd of lost Begins freed one by one at a capped rate: T2 fails */
#else
#define FOLLOWED_UP(i) (pending[i] && !LATE)
#endif
#define BOUND(i) (!crashed[i] && !paused[i] && MINE(i) && RECONNECTED(i) && (keeping[i] || FOLLOWED_UP(i)))
#ifdef LATE_RESEND
#define LATE 1
#else
#define LATE 0
#endif

/* Invariant 3: a record becomes outcome-unknown only if its holder's handler started, or the
 * holder failed (crashed or stalled past its lease). 3b (proctype Check): when every attempt is
 * done, no record is left outcome-unknown unless that holds. */
#define ASSERT_UNKNOWN_RAN(h) assert(started[h] || crashed[h] || paused[h])

/* Invariant 5: a live holder keeps its key: nothing takes over, marks unknown, resolves or
 * sweeps the reservation of a holder whose keepLease runs and that neither crashed nor stalled. */
#define ASSERT_LIVE_KEEPS(h) assert(crashed[h] || paused[h] || !keeping[h])

/* Invariant 1: at most one execution under FAIL_CLOSED; under REEXECUTE one more per
 * failure only. */
#ifdef REEXECUTE
#define ASSERT_ONCE assert(execs <= 1 + failures)
#else
#define ASSERT_ONCE assert(execs <= 1)
#endif
/* failures and stored are kept under REEXECUTE only, where Invariant 1 reads them. */
#ifdef REEXECUTE
#define FAILED(c) if :: c -> failures++ :: else -> skip fi
#define STORED(me) stored[me] = true
#else
#define FAILED(c) skip
#define STORED(me) skip
#endif

/* Reserving upsert (pgstore reserveSQL): a new epoch, lease and retention from now.
 * Invariant 6: a key's epochs never repeat, so a fencing token names one reservation (a
 * stalled holder and its successor never share one). Epochs come from a store-wide source,
 * so they keep growing after the sweeper deleted the row (issue 18; the hole restarted at 1). */
inline reserve(me) {
	st = INFLIGHT; ep++; tok = me+1; lend = now + L; exp = now + R; outc = 0;
	assert(ep > maxep); maxep = ep
}

/* Begin: dedupesvc.RunBegin + DecideBegin, pgstore Begin (reserveSQL, markUnknownSQL, renewSQL). */
inline begin(me, res) {
	if
	:: !up -> res = A_ERR
	:: up && ABSENT ->
		if :: st == INFLIGHT -> ASSERT_LIVE_KEEPS(tok-1) :: else -> skip fi;
		reserve(me); res = A_RESERVED
	:: up && st == COMPLETED -> res = A_COMPLETED
	:: up && st == UNKNOWN && tok != me+1 -> res = A_UNKNOWN
	:: up && st == UNKNOWN && tok == me+1 ->
#ifdef HOLE_LATE_RESEND_STRANDS
		res = A_UNKNOWN
#else
		st = INFLIGHT; lend = now + L; res = A_RESERVED  /* StepRenew: the attempt takes its record back */
#endif
	:: up && MINE(me) && !EXPIRED -> res = A_RESERVED  /* the same attempt asks again */
	:: up && MINE(me) && EXPIRED && !INFL_GONE ->
#ifndef HOLE_EXPIRED_RENEW
		lend = now + L;  /* StepRenew: never hand out a lease that already ended */
		if :: exp < lend -> exp = lend :: else -> skip fi;
#endif
		res = A_RESERVED
	:: up && st == INFLIGHT && tok != me+1 && !EXPIRED -> res = A_INFLIGHT
	:: up && st == INFLIGHT && tok != me+1 && EXPIRED && !INFL_GONE ->
		ASSERT_LIVE_KEEPS(tok-1);
#ifdef REEXECUTE
		reserve(me); res = A_RESERVED  /* StepReserve: take over */
#else
#ifndef LATE_RESEND
		ASSERT_UNKNOWN_RAN(tok-1);  /* under T2 not even a passing false alarm */
#endif
		st = UNKNOWN; lend = 0; exp = NEVER; res = A_UNKNOWN  /* StepMarkUnknown */
#endif
	fi;
	/* Invariant 4: once an outcome exists every Begin replays it. */
	assert(firstoutc == 0 || (res == A_COMPLETED && outc == firstoutc) || res == A_ERR);
	if
	:: res == A_RESERVED -> myep[me] = ep
	:: else -> skip
	fi
}

/* Heartbeat: gatecore keepLease → pgstore heartbeatSQL (revives its own 'unknown'). */
inline heartbeat(me) {
	if
	:: !up -> skip  /* failed renewal: keepLease retries every tenth of the lease */
	:: up && tok == me+1 && ep == myep[me] && (st == INFLIGHT || st == UNKNOWN) ->
		st = INFLIGHT; lend = now + L;
		if :: exp < lend -> exp = lend :: else -> skip fi
	:: else -> keeping[me] = false  /* ErrNotHeld: fenced, renewals stop */
	fi
}

/* Finish: pgstore finishSQL + dedupesvc.RefusedFinish. */
inline finish(me, res) {
	if
	:: !up -> res = ERR
	:: up && tok == me+1 && ep == myep[me] && (st == INFLIGHT || st == UNKNOWN) ->
		st = COMPLETED; outc = me+1; lend = 0; exp = NEVER; ctime = now; res = OK;
		if :: firstoutc == 0 -> firstoutc = outc :: else -> skip fi
	:: up && tok == me+1 && ep == myep[me] && st == COMPLETED -> res = OK  /* retry that took effect */
	:: else -> res = NOTHELD
	fi
}

/* Release: pgstore releaseSQL / releaseUnknownSQL + dedupesvc.RefusedRelease (a deleted
 * record is nothing held: NOTHELD here ends the settlement as its nil does). */
inline release(me, unknown, res) {
	if
	:: !up -> res = ERR
	:: up && !unknown && tok == me+1 && ep == myep[me] && (st == INFLIGHT || st == UNKNOWN) ->
		st = RELEASED; lend = 0; res = OK
	:: up && unknown && tok == me+1 && ep == myep[me] && st == INFLIGHT ->
		ASSERT_UNKNOWN_RAN(me); st = UNKNOWN; lend = 0; exp = NEVER; res = OK
	:: up && tok == me+1 && ep == myep[me] && (st == RELEASED || st == UNKNOWN) -> res = OK  /* retried */
	:: else -> res = NOTHELD
	fi
}

/* ReleaseLostBegins (issue 38): pgstore releaseLostSQL frees the record the attempt holds, in
 * flight or marked unknown, whatever its epoch (an attempt whose Begin answer was lost never
 * learnt it); anything else is left as it is, and answered OK. */
inline release_lost(me, res) {
	if
	:: !up -> res = ERR
	:: up && tok == me+1 && (st == INFLIGHT || st == UNKNOWN) -> st = RELEASED; lend = 0; res = OK
	:: else -> res = OK
	fi
}

/* A lost answer: the store did it, the caller never hears (bounded). */
#define LOSE_REPLY(res, lostval) \
	if :: lostreplies < MAXLOST && res != lostval -> lostreplies++; res = lostval :: true -> skip fi

/* The holder process dies here (stops forever, its keepLease with it). */
#define CRASHPOINT(me) \
	if :: crashes < 1 -> atomic { crashes++; crashed[me] = true; \
	      FAILED(ran[me] && !stored[me]) }; goto dead \
	   :: true -> skip fi

/* The gate's replay cache keeps the outcome until its stored-at time plus the retention
 * (gatecore Attempt.Finish → Call.Stored), the store the record until its completion (ctime)
 * plus the retention. Invariant 7: the cache never outlives the record, so its stored-at time
 * is never later than ctime. A Finish whose answer was lost (after its caller gave up, say) is
 * retried later and answered OK by RefusedFinish: the cache keeps the first send's time
 * (issue 18); -DHOLE_CACHE_RETRY_TIME takes the retry's. */
#ifdef HOLE_CACHE_RETRY_TIME
#define STAMP(s) s = now + 1
#else
#define STAMP(s) if :: s == 0 -> s = now + 1 :: else -> skip fi
#endif

/* Settle: gatecore settle/trySettle; the lease is renewed until it returns. The caller is
 * answered OK (its own outcome) once a Finish is acknowledged, IDEMPOTENCY_IN_FLIGHT when it is
 * fenced. While the Finish fails, settle's bound (a lease) may run out first, refusing the caller
 * with IDEMPOTENCY_IN_FLIGHT (AnswerUnstored) while the retries go on: not a step of its own here,
 * as a refused caller holds no outcome and the store sees nothing of it; answering every holder
 * OK once stored, however late, checks a superset of the callers Invariant 8 is about, and
 * costs almost nothing (the REEXECUTE search: 23.1 million states before issue 31, 23.3 million
 * after, 30.7 million with the refusal as a step of its own). */
#define ANSWER(me, ans) if :: answer[me] == ANS_NONE -> answer[me] = ans :: else -> skip fi
inline settle_finish(me) {
	do
	:: atomic { !WAITMARK -> STAMP(sent); finish(me, r); LOSE_REPLY(r, ERR);
		if
		:: r == OK -> assert(outc == me+1);  /* Invariant 2: an acknowledged Finish stored this attempt's outcome */
			assert(sent - 1 <= ctime);  /* Invariant 7 */
			ctime = 0; sent = 0; ANSWER(me, ANS_OK)
		:: r == NOTHELD -> sent = 0; ANSWER(me, ANS_REFUSED)
		:: else ->
#ifdef HOLE_FIRST_FINISH_ANSWERS
			/* the old settle: a lease still confirmed (not yet run out) answered at once */
			if :: MINE(me) && !EXPIRED -> ANSWER(me, ANS_OK) :: else -> skip fi;
#endif
			skip
		fi };
		if
		:: r == OK -> STORED(me); break
		:: r == NOTHELD -> break  /* fenced: what the operator or the other attempt did stands */
		:: r == ERR -> CRASHPOINT(me)  /* retried with backoff */
		fi
	od
}

inline settle_release(me, unknown) {
	do
	:: atomic { !WAITMARK -> release(me, unknown, r); LOSE_REPLY(r, ERR) };
		if
		:: r == OK || r == NOTHELD -> break
		:: r == ERR -> CRASHPOINT(me)
		fi
	od
}

/* One gated call: interceptor gate() → run() → classify → finish/release. */
proctype Attempt(byte me) {
	mtype a, r;
	bool retryable, retried;
	byte sent;  /* the first Finish's send time + 1 (the replay cache's stamp) */
	mayrun[me] = true;
	/* Gate.gate: gatecore Engine.Begin. From the answer on, the attempt is bound by T1 (keepLease
	 * starts) or, when the answer is lost, by T2 (the follow-up re-sends). */
gate:
	atomic { !WAITMARK -> begin(me, a); LOSE_REPLY(a, A_ERR); keeping[me] = (a == A_RESERVED); pending[me] = (a == A_ERR) };
	CRASHPOINT(me);
	if
	:: a == A_ERR && !retried ->
		/* DedupeServiceConfig's retry policy re-sends the same Begin within the call: a
		 * Reserved answer to it runs the handler. */
		retried = true; goto gate
	:: a == A_ERR ->
		/* UNAVAILABLE to the caller; the handler will not run. */
		mayrun[me] = false;
#if defined(HOLE_LOST_BEGIN)
		pending[me] = false;  /* nobody follows the lost answer up */
#elif defined(EARLIER_SERVICE)
		/* followUpLostBegin with a service without ReleaseLostBegins: re-send the same Begin,
		 * release what it finds reserved. */
		do
		:: atomic { !WAITMARK -> begin(me, a); LOSE_REPLY(a, A_ERR); keeping[me] = (a == A_RESERVED); pending[me] = (a == A_ERR) };
			if
			:: a == A_ERR -> CRASHPOINT(me)
			:: a == A_RESERVED -> settle_release(me, false); keeping[me] = false; break
			:: else -> break
			fi
		od
#else
		/* followUpLostBegin: ReleaseLostBegins names the attempt; one step at the store. */
		do
		:: atomic { !WAITMARK -> release_lost(me, r); LOSE_REPLY(r, ERR); pending[me] = (r == ERR) };
			if
			:: r == ERR -> CRASHPOINT(me)
			:: else -> break
			fi
		od
#endif
		goto done
	:: a == A_COMPLETED || a == A_INFLIGHT || a == A_UNKNOWN -> goto done  /* replay / ABORTED / OUTCOME_UNKNOWN */
	:: a == A_RESERVED -> skip
	fi;

	/* Gate.run: gatecore Start and keepLease from Begin until settled; the handler on a detached context. */
	started[me] = true;
	CRASHPOINT(me);
	if
	:: atomic { execs++; ran[me] = true; ASSERT_ONCE }; retryable = false;  /* success: the side effect */
#ifdef HOLE_CALLER_CANCEL
		/* the caller's cancellation reaches the handler; its context error reads as "did not happen" */
		if :: retryable = true :: skip fi;
#endif
		CRASHPOINT(me);
#ifdef HOLE_HEARTBEAT_GAP
		keeping[me] = false;  /* renewals stopped when the handler returned */
#endif
		if
		:: !retryable -> settle_finish(me)
		:: retryable -> settle_release(me, false)
		fi
	:: retryable = true; settle_release(me, false)  /* RetryableError: nothing happened */
	:: atomic { execs++; ran[me] = true; ASSERT_ONCE };  /* unknown error: it may have happened */
#ifdef REEXECUTE
		failures++; settle_release(me, false)
#else
		keeping[me] = false;  /* lease.stop() before Release{outcome_unknown} */
		settle_release(me, true)
#endif
	fi;
	keeping[me] = false;
done:
	mayrun[me] = false;
dead:
	/* Nothing reads these any more: cleared, so finished attempts differ only in what they did. */
	atomic { a = 0; r = 0; retryable = false; retried = false; sent = 0; myep[me] = 0; finished++ }
}

/* Invariant 8: a caller answered OK got the outcome the key keeps: no other outcome is ever
 * stored (at every step), and, once every attempt is done, its own was (Check). */
#define ANSWER_KEPT(i) (answer[i] != ANS_OK || firstoutc == 0 || firstoutc == (i)+1)
#define ANSWER_STORED(i) (answer[i] != ANS_OK || firstoutc == (i)+1)

/* Invariant 3b: once every attempt is done, a record left outcome-unknown blocks its key
 * until an operator acts; that must never happen to a holder that never ran its handler. */
proctype Check() {
end:	(finished == NA) -> assert(st != UNKNOWN || started[tok-1] || crashed[tok-1] || paused[tok-1]);
	assert(ANSWER_STORED(0) && ANSWER_STORED(1))  /* Invariant 8, at the end */
}

/* Invariant 4 as a state invariant: once an outcome is stored the record keeps it (completed,
 * the first outcome) at every step, whether or not a Begin comes to look; with Invariant 8's
 * step part. */
#define KEPT ((firstoutc == 0 || (st == COMPLETED && outc == firstoutc)) && ANSWER_KEPT(0) && ANSWER_KEPT(1))
proctype Kept() {
end:	atomic { !KEPT -> assert(KEPT) }
}

/* keepLease: renewals while the attempt's lease keeper runs. */
proctype Keeper(byte me) {
end:	do
	:: atomic { keeping[me] && !crashed[me] && !WAITMARK -> heartbeat(me) }  /* a paused holder renews late, not never */
	od
}

/* Sweeper.SweepOnce → pgstore deleteExpiredSQL: deletes a record past its retention, never an
 * in-flight one within its effective lease; an epoch from the store-wide source outlives it. */
#if defined(REEXECUTE) || defined(HOLE_RETENTION_RUNS_AGAIN)
#define SWEEP_INFL INFL_PAST
#else
#define SWEEP_INFL 0
#endif
proctype Sweeper() {
end:	do
	:: atomic { up && !SWEEPWAIT && exp <= now && (st == RELEASED || SWEEP_INFL) ->
		if :: st == INFLIGHT -> ASSERT_LIVE_KEEPS(tok-1) :: else -> skip fi;
		st = NONE; tok = 0; lend = 0; exp = 0;
#ifdef HOLE_EPOCH_REUSE
		ep = 0  /* the next reservation of the key starts again at epoch 1 */
#else
		skip
#endif
	}
	od
}

/* Resolve bumps the epoch, fencing the holder's late Finish, Release and Heartbeat. */
#ifdef HOLE_STALE_FINISH_AFTER_RESOLVE
#define RESOLVE_FENCE skip
#else
#define RESOLVE_FENCE ep++
#endif

/* Resolve(complete) applies only to an unknown or run-out in-flight record (pgstore
 * resolveCompleteSQL, RefusedResolve: ErrNotUnknown otherwise); the hole lets it replace a
 * completed record's outcome, which replays already got (Invariant 4 must catch it). */
#ifdef HOLE_RESOLVE_COMPLETED
#define RESOLVABLE (st == UNKNOWN || (st == INFLIGHT && EXPIRED) || st == COMPLETED)
#else
#define RESOLVABLE (st == UNKNOWN || (st == INFLIGHT && EXPIRED))
#endif

#ifdef HOLE_OUTAGE_COUNTS
#define MARK skip
#else
#define MARK resumed = now
#endif

/* The environment: clock, store outages, the resume mark, a stalled holder, the operator's Resolve. */
proctype Env() {
	byte i;
end:	do
	:: atomic {
		/* Clock: ticks unless a bound holder would see its effective lease run out (T1, T2);
		 * free while the store does not answer (down, or waiting for its resume mark). */
		now < MAXT && (!up || WAITMARK || ((!BOUND(0) || EFF > now + 1) && (!BOUND(1) || EFF > now + 1))) ->
		now++
	}
	/* The Dedupe service or the store goes away (a restart, an outage), and answers again;
	 * this replica saw it, so it marks the store resumed (pgstore resume → MarkResumed). */
	:: atomic { up && outages < 1 -> outages++; up = false }
#ifdef MARKSTEP
	:: atomic { !up -> up = true; cut = true }
	:: atomic { up && cut -> cut = false; MARK }
#else
	:: atomic { !up -> up = true; MARK }
#endif
	:: atomic { pauses < 1 -> pauses++;  /* a holder stalls (GC pause): T1 no longer holds for it */
		if :: i = 0 :: i = 1 fi;
		paused[i] = true;
		FAILED(!stored[i])
	}
	/* Resolve (pgstore resolveCompleteSQL / resolveReleaseSQL) by a truthful operator: complete
	 * only what ran, release only what did not and will not run. */
	:: atomic { up && !WAITMARK && resolves < 1 && RESOLVABLE && ran[tok-1] ->
		if :: st == INFLIGHT -> ASSERT_LIVE_KEEPS(tok-1) :: else -> skip fi;
		resolves++; st = COMPLETED; outc = OP; lend = 0; exp = NEVER;
		if :: firstoutc == 0 -> firstoutc = OP :: else -> skip fi;
		RESOLVE_FENCE
	}
	:: atomic { up && !WAITMARK && resolves < 1 && (st == UNKNOWN || (st == INFLIGHT && EXPIRED)) &&
		!ran[tok-1] && (crashed[tok-1] || !mayrun[tok-1]) ->
		if :: st == INFLIGHT -> ASSERT_LIVE_KEEPS(tok-1) :: else -> skip fi;
		resolves++; st = RELEASED; lend = 0;
		RESOLVE_FENCE
	}
	od
}

init {
	atomic {
		run Env(); run Sweeper(); run Kept();
		run Keeper(0); run Keeper(1); run Check();
		run Attempt(0); run Attempt(1)
	}
}
