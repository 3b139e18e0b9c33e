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
 *   -DHOLE_*         puts one fixed hole back; `make model` requires each to be found.
 *
 * Timing assumptions, enforced by the clock (proctype Env):
 *   T1: a live, unpaused holder whose keepLease runs reaches the store before its effective
 *       lease ends, unless the store is down (heartbeats every third of the lease).
 *   T2: likewise for an attempt whose Begin answer was lost and that re-sends it
 *       (followUpLostBegin), unless LATE_RESEND.
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
 * Abstracted away: fingerprints (one request per key), retention and the sweeper (records
 * never expire within the horizon), max_wait waiting (a duplicate answered in flight just
 * returns), reconcilers (operator Resolve stands for them), replica-local resume marks
 * (one store-wide resumed tick), NOTIFY, outcome size limits.
 */

#ifdef REEXECUTE
#ifndef LATE_RESEND
#define LATE_RESEND
#endif
#endif

#define NA    2  /* attempts: tool-server calls with the same key, each with its own token */
#define L     2  /* lease, in clock ticks */
#define MAXT  4  /* the clock stops here: bounds the state space */
#define OP    9  /* outcome stored by an operator's Resolve(complete) */

mtype = { NONE, INFLIGHT, COMPLETED, RELEASED, UNKNOWN };          /* record states (dedupesvc.State*) */
mtype = { A_RESERVED, A_COMPLETED, A_INFLIGHT, A_UNKNOWN, A_ERR };  /* Begin answers */
mtype = { OK, NOTHELD, ERR };                                        /* Finish/Release answers */

/* The record (idemgate_records row). tok is attempt id+1; outc is who stored the outcome. */
mtype st = NONE;
byte ep, tok, lend, outc;

/* The store's clock, availability and last resume (idemgate_store_state.resumed_at). */
byte now;
bool up = true;
byte resumed;

/* Ghost state for the properties. */
byte execs;      /* side effects that happened */
byte failures;   /* holders that crashed or stalled without storing an outcome, or REEXECUTE unknown errors */
byte firstoutc;  /* the first outcome stored: every later replay must be it */
bool started[NA], ran[NA], stored[NA], crashed[NA], paused[NA], mayrun[NA];
bool keeping[NA];  /* keepLease runs for this attempt */
bool pending[NA];  /* a lost Begin answer is being followed up */
byte myep[NA];
byte finished;     /* attempts that are done or dead */

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

/* The record is attempt i's live reservation, so T1/T2 bind the clock. */
#define MINE(i) (st == INFLIGHT && tok == (i)+1)
#define BOUND(i) (!crashed[i] && !paused[i] && MINE(i) && (keeping[i] || (pending[i] && !LATE)))
#ifdef LATE_RESEND
#define LATE 1
#else
#define LATE 0
#endif

/* Invariant 3: a record becomes outcome-unknown only if its holder's handler started, or the
 * holder failed (crashed or stalled past its lease). 3b (proctype Check): when every attempt is
 * done, no record is left outcome-unknown unless that holds. */
#define ASSERT_UNKNOWN_RAN(h) assert(started[h] || crashed[h] || paused[h])

/* Invariant 1: at most one execution under FAIL_CLOSED; under REEXECUTE one more per
 * failure only. */
#ifdef REEXECUTE
#define ASSERT_ONCE assert(execs <= 1 + failures)
#else
#define ASSERT_ONCE assert(execs <= 1)
#endif

/* Reserving upsert (pgstore reserveSQL): a new epoch, lease from now. */
inline reserve(me) {
	st = INFLIGHT; ep++; tok = me+1; lend = now + L; outc = 0
}

/* Begin: dedupesvc.RunBegin + DecideBegin, pgstore Begin (reserveSQL, markUnknownSQL, renewSQL). */
inline begin(me, res) {
	if
	:: !up -> res = A_ERR
	:: up && (st == NONE || st == RELEASED) -> reserve(me); res = A_RESERVED
	:: up && st == COMPLETED -> res = A_COMPLETED
	:: up && st == UNKNOWN && tok != me+1 -> res = A_UNKNOWN
	:: up && st == UNKNOWN && tok == me+1 ->
#ifdef HOLE_LATE_RESEND_STRANDS
		res = A_UNKNOWN
#else
		st = INFLIGHT; lend = now + L; res = A_RESERVED  /* StepRenew: the attempt takes its record back */
#endif
	:: up && MINE(me) && !EXPIRED -> res = A_RESERVED  /* the same attempt asks again */
	:: up && MINE(me) && EXPIRED ->
#ifndef HOLE_EXPIRED_RENEW
		lend = now + L;  /* StepRenew: never hand out a lease that already ended */
#endif
		res = A_RESERVED
	:: up && st == INFLIGHT && tok != me+1 && !EXPIRED -> res = A_INFLIGHT
	:: up && st == INFLIGHT && tok != me+1 && EXPIRED ->
#ifdef REEXECUTE
		reserve(me); res = A_RESERVED  /* StepReserve: take over */
#else
#ifndef LATE_RESEND
		ASSERT_UNKNOWN_RAN(tok-1);  /* under T2 not even a passing false alarm */
#endif
		st = UNKNOWN; res = A_UNKNOWN  /* StepMarkUnknown */
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
		st = INFLIGHT; lend = now + L
	:: else -> keeping[me] = false  /* ErrNotHeld: fenced, renewals stop */
	fi
}

/* Finish: pgstore finishSQL + dedupesvc.RefusedFinish. */
inline finish(me, res) {
	if
	:: !up -> res = ERR
	:: up && tok == me+1 && ep == myep[me] && (st == INFLIGHT || st == UNKNOWN) ->
		st = COMPLETED; outc = me+1; res = OK;
		if :: firstoutc == 0 -> firstoutc = outc :: else -> skip fi
	:: up && tok == me+1 && ep == myep[me] && st == COMPLETED -> res = OK  /* retry that took effect */
	:: else -> res = NOTHELD
	fi
}

/* Release: pgstore releaseSQL / releaseUnknownSQL + dedupesvc.RefusedRelease. */
inline release(me, unknown, res) {
	if
	:: !up -> res = ERR
	:: up && !unknown && tok == me+1 && ep == myep[me] && (st == INFLIGHT || st == UNKNOWN) ->
		st = RELEASED; lend = now; res = OK
	:: up && unknown && tok == me+1 && ep == myep[me] && st == INFLIGHT ->
		ASSERT_UNKNOWN_RAN(me); st = UNKNOWN; lend = now; res = OK
	:: up && tok == me+1 && ep == myep[me] && (st == RELEASED || st == UNKNOWN) -> res = OK  /* retried */
	:: else -> res = NOTHELD
	fi
}

/* A lost answer: the store did it, the caller never hears (bounded). */
#define LOSE_REPLY(res, lostval) \
	if :: lostreplies < MAXLOST && res != lostval -> lostreplies++; res = lostval :: true -> skip fi

/* The holder process dies here (stops forever, its keepLease with it). */
#define CRASHPOINT(me) \
	if :: crashes < 1 -> atomic { crashes++; crashed[me] = true; \
	      if :: ran[me] && !stored[me] -> failures++ :: else -> skip fi }; goto dead \
	   :: true -> skip fi

/* Settle: gatecore settle/trySettle; the lease is renewed until it returns. */
inline settle_finish(me) {
	do
	:: atomic { finish(me, r); LOSE_REPLY(r, ERR) };
		if
		:: r == OK -> assert(outc == me+1);  /* Invariant 2: an acknowledged Finish stored this attempt's outcome */
			stored[me] = true; break
		:: r == NOTHELD -> break  /* fenced: what the operator or the other attempt did stands */
		:: r == ERR -> CRASHPOINT(me)  /* retried with backoff */
		fi
	od
}

inline settle_release(me, unknown) {
	do
	:: atomic { release(me, unknown, r); LOSE_REPLY(r, ERR) };
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
	mayrun[me] = true;
	/* Gate.gate: gatecore Engine.Begin. From the answer on, the attempt is bound by T1 (keepLease
	 * starts) or, when the answer is lost, by T2 (the follow-up re-sends). */
gate:
	atomic { begin(me, a); LOSE_REPLY(a, A_ERR); keeping[me] = (a == A_RESERVED); pending[me] = (a == A_ERR) };
	CRASHPOINT(me);
	if
	:: a == A_ERR && !retried ->
		/* DedupeServiceConfig's retry policy re-sends the same Begin within the call: a
		 * Reserved answer to it runs the handler. */
		retried = true; goto gate
	:: a == A_ERR ->
		/* UNAVAILABLE to the caller; the handler will not run. */
		mayrun[me] = false;
#ifdef HOLE_LOST_BEGIN
		pending[me] = false;  /* nobody follows the lost answer up */
#else
		/* followUpLostBegin: re-send the same Begin, release what it finds reserved. */
		do
		:: atomic { begin(me, a); LOSE_REPLY(a, A_ERR); keeping[me] = (a == A_RESERVED); pending[me] = (a == A_ERR) };
			if
			:: a == A_ERR -> CRASHPOINT(me)
			:: a == A_RESERVED -> settle_release(me, false); keeping[me] = false; break
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
	finished++
}

/* Invariant 3b: once every attempt is done, a record left outcome-unknown blocks its key
 * until an operator acts; that must never happen to a holder that never ran its handler. */
proctype Check() {
end:	(finished == NA) -> assert(st != UNKNOWN || started[tok-1] || crashed[tok-1] || paused[tok-1])
}

/* keepLease: renewals while the attempt's lease keeper runs. */
proctype Keeper(byte me) {
end:	do
	:: atomic { keeping[me] && !crashed[me] -> heartbeat(me) }  /* a paused holder renews late, not never */
	od
}

/* Resolve bumps the epoch, fencing the holder's late Finish, Release and Heartbeat. */
#ifdef HOLE_STALE_FINISH_AFTER_RESOLVE
#define RESOLVE_FENCE skip
#else
#define RESOLVE_FENCE ep++
#endif

/* The environment: clock, store outages, a stalled holder, the operator's Resolve. */
proctype Env() {
	byte i;
end:	do
	:: atomic {
		/* Clock: ticks unless a bound holder would see its effective lease run out (T1, T2). */
		now < MAXT && (!up || ((!BOUND(0) || EFF > now + 1) && (!BOUND(1) || EFF > now + 1))) ->
		now++
	}
	:: atomic { up && outages < 1 -> outages++; up = false }  /* the store goes away */
	:: atomic { !up -> up = true;
#ifndef HOLE_OUTAGE_COUNTS
		resumed = now  /* pgstore resume/MarkResumed */
#endif
	}
	:: atomic { pauses < 1 -> pauses++;  /* a holder stalls (GC pause): T1 no longer holds for it */
		if :: i = 0 :: i = 1 fi;
		paused[i] = true;
		if :: !stored[i] -> failures++ :: else -> skip fi
	}
	/* Resolve (pgstore resolveCompleteSQL / resolveReleaseSQL) by a truthful operator: complete
	 * only what ran, release only what did not and will not run. */
	:: atomic { up && resolves < 1 && (st == UNKNOWN || (st == INFLIGHT && EXPIRED)) && ran[tok-1] ->
		resolves++; st = COMPLETED; outc = OP;
		if :: firstoutc == 0 -> firstoutc = OP :: else -> skip fi;
		RESOLVE_FENCE
	}
	:: atomic { up && resolves < 1 && (st == UNKNOWN || (st == INFLIGHT && EXPIRED)) &&
		!ran[tok-1] && (crashed[tok-1] || !mayrun[tok-1]) ->
		resolves++; st = RELEASED; lend = now;
		RESOLVE_FENCE
	}
	od
}

init {
	atomic {
		run Env();
		run Keeper(0); run Keeper(1); run Check();
		run Attempt(0); run Attempt(1)
	}
}
