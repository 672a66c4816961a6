/* SPDX-License-Identifier: MIT */
/*
 * Turning a parsed trace into calls: replay of each thread's entry/exit
 * events against a shadow stack, and the per-function statistics of
 * `probekit report`.
 *
 * Replay rules (also in doc/trace-format.md, "Interpreting events"):
 *  - entry pushes a frame; an exit pops the frame of the same function.
 *  - an exit with an empty stack (the thread was inside the function when
 *    tracing began) or for a function not on the stack is counted in
 *    unmatched_exits and otherwise ignored.
 *  - an exit for a function deeper in the stack closes the frames above it
 *    at the same time (their exits were never seen: longjmp, exceptions, lost
 *    events); they are flagged unwound.
 *  - frames still open after the thread's last event (the program ended or
 *    crashed inside them) are closed where the thread's trace ended
 *    (pki_trace_thread_end(): END, or a snapshot's TRIGGER), flagged open.
 *    When that is not known (the thread exited before, the file was cut
 *    short) they are flagged no_end too: no duration is known.  So are the
 *    frames open at a GAP event (a flight recorder overwrote events there,
 *    the exits among them): the stack starts afresh after it.
 *  - self time = duration - durations of the direct children.
 */
#ifndef PK_TRACEREAD_ANALYZE_H
#define PK_TRACEREAD_ANALYZE_H

#include "traceread/argval.h"
#include "traceread/reader.h"

struct pki_trace_call {
	uint64_t fn;
	uint64_t start_ns, end_ns; /* relative to the trace origin */
	uint64_t dur_ns, self_ns;
	uint32_t depth;		  /* 0 = bottom of the thread's stack */
	bool outermost;		  /* no other frame of fn below: counts in total time */
	bool unwound, open;	  /* see above */
	bool no_end;		  /* open, end not known: dur_ns, self_ns 0, not times */
	bool instant;		  /* PKI_EV_CALL: no exit recorded, no duration (0, 0) */
	const uint64_t *stack;	  /* fns from the bottom to this call, depth + 1 entries */
	const uint64_t *stack_ts; /* their entry timestamps (ticks), depth + 1 entries */
	const uint64_t *ids;	  /* their frame serials, unique within the thread */
	/*
	 * With an ARGS record for fn (trace -A/-R): its items, and the values
	 * recorded, spec->n of them (an item not recorded, as the return
	 * value of a call unwound, has .any false).  Else NULL.  Valid only
	 * during the callback.
	 */
	const struct pki_argspec *spec;
	const struct pki_argval *vals;
};

struct pki_trace_replay_stats {
	uint64_t calls, unmatched_exits, unwound, open;
	uint64_t no_end; /* of the open calls, those whose end is not known */
	uint64_t gaps;	 /* GAP events (flight recorder): the frames open then were ended, open */
};

/*
 * Called once per call, when it ends (children before parents).  Nonzero
 * stops.  The stack arrays are valid only during the call.
 */
typedef int (*pki_trace_call_fn)(const struct pki_trace_thread *t, const struct pki_trace_call *c,
				 void *arg);

/*
 * Replay thread @t of @f (its events read with pki_trace_file_events).  0,
 * -ENOMEM, -EIO (the file changed), or the callback's nonzero return.
 */
int pki_trace_replay(const struct pki_trace_file *f, const struct pki_trace_thread *t,
		     pki_trace_call_fn fn, void *arg, struct pki_trace_replay_stats *st);

/*
 * Replay every thread, reading the events once: the calls of different
 * threads interleave (in file order); the calls still open at the end come
 * last, thread by thread.  Returns as pki_trace_replay().
 */
int pki_trace_replay_all(const struct pki_trace_file *f, pki_trace_call_fn fn, void *arg,
			 struct pki_trace_replay_stats *st);

struct pki_trace_fnstat {
	uint64_t fn;
	uint32_t tsn; /* 0 when aggregated over threads */
	uint64_t calls;
	uint64_t total_ns; /* outermost calls only: recursion is not counted twice */
	uint64_t self_ns;
	uint64_t sum_ns; /* every call's own duration: avg = sum_ns / calls */
	uint64_t min_ns, max_ns;
	uint64_t instants; /* of the calls, those without an exit (PKI_EV_CALL): no time */
	/*
	 * Of the calls, those open with no known end: in no sum, minimum or
	 * maximum, which are then unknown (total: if one is outermost)
	 */
	uint64_t no_end, no_end_outer;
	/* by_args: the values of these calls, "(1, \"a\") = 0" (in the report's
	 * texts), or NULL for the calls that carry none */
	const char *args;
};

/* @s's average duration over its timed calls (0 if it has none). */
static inline uint64_t pki_trace_fnstat_avg(const struct pki_trace_fnstat *s)
{
	return s->calls > s->instants + s->no_end ? s->sum_ns / (s->calls - s->instants - s->no_end)
						  : 0;
}

struct pki_trace_report {
	struct pki_trace_fnstat *st;
	size_t n;
	struct pki_trace_replay_stats rs; /* all threads */
	char **texts; /* by_args: the distinct values' texts st[].args point to */
	size_t ntexts;
};

enum pki_trace_sort {
	PKI_SORT_TOTAL,
	PKI_SORT_CALLS,
	PKI_SORT_SELF,
	PKI_SORT_AVG,
	PKI_SORT_MIN,
	PKI_SORT_MAX,
	PKI_SORT_NAME,
};

/* Per function (and per thread if @per_thread).  0 or -ENOMEM. */
int pki_trace_report_build(const struct pki_trace_file *f, bool per_thread,
			   struct pki_trace_report *r);

/*
 * The same, with @by_args one row per function and distinct values its
 * calls carried (trace -A/-R: the arguments and the return value as replay
 * shows them, a p value by @name_of's name), calls without values in a row
 * of their own.
 */
int pki_trace_report_build_args(const struct pki_trace_file *f, bool per_thread, bool by_args,
				const char *(*name_of)(uint64_t addr, void *arg),
				struct pki_trace_report *r);
/*
 * @s's figure for @key, as pki_trace_report_sort() orders by it (descending):
 * an unknown time (a call with no known end) is 0, after the known ones.
 */
uint64_t pki_trace_fnstat_key(const struct pki_trace_fnstat *s, enum pki_trace_sort key);
/*
 * Add @from's figures to @into's (the same function in another thread or
 * process): sums add up, the minimum and maximum are those of both.
 */
void pki_trace_fnstat_merge(struct pki_trace_fnstat *into, const struct pki_trace_fnstat *from);
/* Descending by the key (ascending by name), then by name, fn, values: deterministic. */
void pki_trace_report_sort(const struct pki_trace_file *f, struct pki_trace_report *r,
			   enum pki_trace_sort key);
void pki_trace_report_free(struct pki_trace_report *r);

/* The display name of @fn: its symbol, else "0x<hex>" in @buf. */
const char *pki_trace_fn_name(const struct pki_trace_file *f, uint64_t fn, char *buf, size_t len);

#endif /* PK_TRACEREAD_ANALYZE_H */
