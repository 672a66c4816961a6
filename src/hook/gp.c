// SPDX-License-Identifier: MIT
/*
 * Grace periods for hooks (gp.h): liburcu's membarrier flavour, for readers
 * the program never registers.  This file is the write side (W1-W3), the
 * reader slots, their registration and parking (P1-P3), the counter's
 * balance (N1-N3) and the freeing of TLS (S); the read side (R1-R3) is
 * tramp.S's entries and exits.  The protocol, its proof and its limits:
 * doc/design/grace-periods.md.
 *
 * Locks (base/held.h: each `__` function checks its own): gp_lock
 * serialises grace periods and guards the writer's lists; defer_lock the
 * deferred callbacks' queue.  Neither is taken in signal context.
 */
#include <errno.h>
#include <limits.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "arch/arch.h"
#include "base/futex.h"
#include "base/grow.h"
#include "base/held.h"
#include "hook/gp.h"
#include "trace/fgraph.h"
#include "base/log.h"
#include "base/signals.h"

/* ---- readers ---- */

#define READERS_PER_PAGE 512
#define READER_PAGES	 2048 /* a million threads */

struct gp_reader {
	struct pki_tramp_tls *tls; /* NULL: free */
	pid_t tid;		   /* for messages */
	int state;		   /* READER_*: atomic (grace-periods.md, P1-P3) */
	int on_stack;		   /* atomic: on the woken stack (pushed at most once) */
	unsigned int next;	   /* the woken stack: next slot + 1 (0: end) */
	/* The writer's, under gp_lock. */
	bool listed;		 /* in the writer's list of slots to scan */
	unsigned char idle;	 /* passes in a row that found it outside every hook */
	unsigned char delay;	 /* idle passes before it is parked (0: default) */
	unsigned long parked_gp; /* gp_stat.periods when last parked */
};

enum { READER_ACTIVE, READER_PARKING, READER_PARKED };

/* Pages are mapped on demand and never unmapped (lock-free readers). */
static struct gp_reader *reader_pages[READER_PAGES];
static unsigned int reader_hwm;	 /* slots ever used */
static unsigned int woken;	 /* the woken stack's top slot + 1 (0: empty); atomic */
static unsigned int gp_scanning; /* passes in progress (S) */
static uint32_t gp_answers;	 /* futex: bumped by each slow exit */
static pthread_key_t exit_key;
static bool exit_key_ok;

#define TLS_EXITING 0x1u /* pki_tramp_tls.flags: past gp_thread_exit */
/*
 * pki_tramp_tls.flags: inside pki_gp_register, which calls libc: a hooked
 * libc function reached from there (relocation in every object) runs
 * unhooked instead of registering again, without end.
 */
#define TLS_REGISTERING 0x2u

static struct {
	unsigned long periods, readers, waited, answers, refused, parked, woke, scanned;
} gp_stat; /* atomic counters */

void pki_gp_stats(struct pki_gp_stats *st)
{
	st->periods = __atomic_load_n(&gp_stat.periods, __ATOMIC_RELAXED);
	st->readers = __atomic_load_n(&gp_stat.readers, __ATOMIC_RELAXED);
	st->waited = __atomic_load_n(&gp_stat.waited, __ATOMIC_RELAXED);
	st->answers = __atomic_load_n(&gp_stat.answers, __ATOMIC_RELAXED);
	st->refused = __atomic_load_n(&gp_stat.refused, __ATOMIC_RELAXED);
	st->parked = __atomic_load_n(&gp_stat.parked, __ATOMIC_RELAXED);
	st->woke = __atomic_load_n(&gp_stat.woke, __ATOMIC_RELAXED);
	st->scanned = __atomic_load_n(&gp_stat.scanned, __ATOMIC_RELAXED);
}

static struct gp_reader *reader_at(unsigned int i)
{
	struct gp_reader *page =
	    __atomic_load_n(&reader_pages[i / READERS_PER_PAGE], __ATOMIC_ACQUIRE);

	return page ? &page[i % READERS_PER_PAGE] : NULL;
}

/* The page holding slot @i, mapped if needed (async-signal-safe). */
static struct gp_reader *reader_page_get(unsigned int i)
{
	struct gp_reader **pp = &reader_pages[i / READERS_PER_PAGE], *page, *none = NULL;

	page = __atomic_load_n(pp, __ATOMIC_ACQUIRE);
	if (page)
		return page;
	page = mmap(NULL, READERS_PER_PAGE * sizeof(*page), PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return NULL;
	if (!__atomic_compare_exchange_n(pp, &none, page, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE)) {
		munmap(page, READERS_PER_PAGE * sizeof(*page));
		page = none;
	}
	return page;
}

/* Claim a free slot for @me: its index + 1, or 0. */
static unsigned int reader_claim(struct pki_tramp_tls *me)
{
	for (unsigned int i = 0; i < READERS_PER_PAGE * READER_PAGES; i++) {
		struct gp_reader *page = reader_page_get(i), *r;
		struct pki_tramp_tls *none = NULL;
		unsigned int hwm;

		if (!page)
			return 0;
		r = &page[i % READERS_PER_PAGE];
		if (__atomic_load_n(&r->tls, __ATOMIC_RELAXED) ||
		    !__atomic_compare_exchange_n(&r->tls, &none, me, false, __ATOMIC_SEQ_CST,
						 __ATOMIC_RELAXED))
			continue;
		r->tid = (pid_t)syscall(SYS_gettid);
		hwm = __atomic_load_n(&reader_hwm, __ATOMIC_RELAXED);
		while (hwm < i + 1 &&
		       !__atomic_compare_exchange_n(&reader_hwm, &hwm, i + 1, false,
						    __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
			;
		return i + 1;
	}
	return 0;
}

/*
 * The thread's own counter, from C.  Only the thread changes it, but for
 * the writer's park (P1), a compare-and-swap from -1: atomics say so (the
 * entries' incl/decl are plain, in tramp.S).  Each change is one
 * instruction (N1): a signal handler runs before or after it, never inside.
 */
static int nest_get(const struct pki_tramp_tls *me)
{
	return __atomic_load_n(&me->nest, __ATOMIC_RELAXED);
}

/* Undo the entry's incl of a refused call (N1: one locked add). */
static void nest_undo(struct pki_tramp_tls *me)
{
	__atomic_fetch_sub(&me->nest, 1, __ATOMIC_RELAXED);
}

/*
 * N2: base PKI_TRAMP_UNREG -> -1, keeping the levels, if the base is still
 * PKI_TRAMP_UNREG: a signal handler that interrupted this registration
 * before TLS_REGISTERING was set may have registered and converted already
 * (its levels are back to ours when it returns).  One compare-and-swap:
 * the read and the write are one instruction.
 */
static void nest_convert(struct pki_tramp_tls *me)
{
	int v = nest_get(me);

	while (v < -1 && !__atomic_compare_exchange_n(&me->nest, &v, v - PKI_TRAMP_UNREG - 1, false,
						      __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
		;
}

/*
 * Make slot @i one the writer scans (P3): active, and on the woken stack
 * unless it is there already (the writer clears on_stack as it pops).
 * Signals blocked (no nested activation between the two steps).
 */
static void reader_activate(unsigned int i)
{
	struct gp_reader *r = reader_at(i);
	int no = 0;
	unsigned int top;

	__atomic_exchange_n(&r->state, READER_ACTIVE, __ATOMIC_SEQ_CST);
	if (!__atomic_compare_exchange_n(&r->on_stack, &no, 1, false, __ATOMIC_SEQ_CST,
					 __ATOMIC_RELAXED))
		return;
	top = __atomic_load_n(&woken, __ATOMIC_RELAXED);
	do
		r->next = top;
	while (!__atomic_compare_exchange_n(&woken, &top, i + 1, false, __ATOMIC_SEQ_CST,
					    __ATOMIC_RELAXED));
}

/*
 * X_REG: the thread's first entry, or its first since parked (counter
 * PKI_TRAMP_UNREG + 1).  A nested entry meanwhile (a signal handler's
 * hooked call, or a hooked libc function this calls: relocation in every
 * object) finds TLS_REGISTERING and runs unhooked: no second slot is
 * claimed, and no signal is blocked here (a trap met with SIGTRAP blocked
 * kills the process).  One that came before the flag may have registered
 * the thread already: N2.
 */
int pki_gp_register(void)
{
	struct pki_tramp_tls *me = &pki_tramp_tls;
	int ok = 1;

	if (me->flags & (TLS_EXITING | TLS_REGISTERING)) { /* no system call per call */
		nest_undo(me);
		return 0;
	}
	me->flags |= TLS_REGISTERING;
	__atomic_signal_fence(__ATOMIC_SEQ_CST); /* set before any call */
	if (!me->slot && !(me->flags & TLS_EXITING)) {
		me->slot = reader_claim(me);
		if (me->slot) {
			__atomic_add_fetch(&gp_stat.readers, 1, __ATOMIC_RELAXED);
			if (exit_key_ok)
				pthread_setspecific(exit_key, (void *)1);
		}
	}
	if (me->slot)
		reader_activate(me->slot - 1); /* first entry, or the first since parked */
	if (me->slot) {
		nest_convert(me); /* our levels so far, the first one 0 (after the claim) */
	} else {
		nest_undo(me); /* the call runs unhooked (N2: still unconverted) */
		__atomic_add_fetch(&gp_stat.refused, 1, __ATOMIC_RELAXED);
		ok = 0;
	}
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	me->flags &= ~TLS_REGISTERING;
	return ok;
}

static void futex_wake_all(uint32_t *f)
{
	pki_futex_wake(f, INT_MAX);
}

/*
 * Thread exit, from the thread-specific-data destructors: at our first call
 * (set by the registration, so it comes in the round after it at the
 * latest) the slot is emptied (S) and later calls run unhooked.  Waiting
 * for a later round to let other libraries' destructors run hooked would
 * miss threads that register in a destructor round (glibc stops after
 * PTHREAD_DESTRUCTOR_ITERATIONS).
 */
static void gp_thread_exit(void *unused)
{
	struct pki_tramp_tls *me = &pki_tramp_tls;
	struct gp_reader *slot;
	sigset_t all, old;

	(void)unused;
	/* Exits of the frames the thread left, while it can still run callbacks (fgraph.h). */
	if (pki_fgraph_tls.depth && pki_fgraph_tls.st != PKI_FGRAPH_GONE)
		pki_fgraph_thread_exit((unsigned long)__builtin_frame_address(0));
	sigfillset(&all);
	sigdelset(&all, SIGTRAP); /* its calls may meet a patch's INT3 (sigown.c) */
	pthread_sigmask(SIG_BLOCK, &all, &old);
	me->flags |= TLS_EXITING;
	__atomic_store_n(&me->nest, PKI_TRAMP_UNREG, __ATOMIC_RELAXED); /* a pass may read it */
	slot = me->slot ? reader_at(me->slot - 1) : NULL;
	if (slot) {
		__atomic_store_n(&slot->tls, NULL, __ATOMIC_SEQ_CST);
		while (__atomic_load_n(&gp_scanning, __ATOMIC_SEQ_CST))
			sched_yield(); /* one pass at most: passes never sleep */
		__atomic_sub_fetch(&gp_stat.readers, 1, __ATOMIC_RELAXED);
	}
	me->slot = 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

__attribute__((constructor)) static void gp_init(void)
{
	exit_key_ok = !pthread_key_create(&exit_key, gp_thread_exit);
	if (!exit_key_ok)
		pki_warn("hooks: no thread-specific-data key: exited threads keep their "
			 "grace-period slot\n");
}

/*
 * X's slow exit: the grace period asked this thread (want), or a callback
 * of this level asked to skip the function (skip, pk_regs_skip()): nonzero
 * then, and skip is cleared.  A nested level's exit leaves skip to the
 * outermost one, whose callback set it.
 */
int pki_tramp_exit_slow(void)
{
	struct pki_tramp_tls *me = &pki_tramp_tls;

	if (__atomic_load_n(&me->want, __ATOMIC_RELAXED))
		pki_gp_exit_slow();
	if (me->skip != PKI_TRAMP_SKIP || nest_get(me) != 0)
		return 0;
	me->skip = 0;
	return 1;
}

/* The grace period asked this thread (want). */
void pki_gp_exit_slow(void)
{
	struct pki_tramp_tls *me = &pki_tramp_tls;

	if (nest_get(me) != 0) /* nested: the outermost exit answers */
		return;
	/* Atomic: the writer stores it from its thread (the entries read it as a byte). */
	__atomic_store_n(&me->want, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&me->qs, me->qs + 1, __ATOMIC_RELEASE);
	__atomic_add_fetch(&gp_stat.answers, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&gp_answers, 1, __ATOMIC_RELEASE);
	futex_wake_all(&gp_answers);
}

/* ---- write side ---- */

static pthread_once_t barrier_once = PTHREAD_ONCE_INIT;
bool pki_gp_barrier_ok; /* membarrier private expedited registered */

static void barrier_init(void)
{
	const char *e = getenv("PROBEKIT_GP_LOCKED");

	if (e && *e == '1') { /* tests and benchmarks of the fallback */
		pki_gp_barrier_ok = false;
		return;
	}
	pki_gp_barrier_ok =
	    !syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0);
	if (!pki_gp_barrier_ok)
		pki_debug("hooks: membarrier: %s: entries take a locked increment\n",
			  pki_errstr(errno));
}

bool pki_gp_readers_locked(void)
{
	pthread_once(&barrier_once, barrier_init);
	return !pki_gp_barrier_ok;
}

/*
 * W1.  -errno if membarrier() fails after its registration worked (a seccomp
 * filter installed since): the entries are not locked, a fence would not
 * order them, so the grace period fails and nothing is freed.
 */
static int gp_barrier(void)
{
	pthread_once(&barrier_once, barrier_init);
	if (!pki_gp_barrier_ok) {
		__atomic_thread_fence(__ATOMIC_SEQ_CST); /* readers' entries are locked */
		return 0;
	}
	if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0)) {
		int err = -errno;
		static bool warned;

		if (!__atomic_exchange_n(&warned, true, __ATOMIC_RELAXED))
			pki_warn("hooks: membarrier: %s: grace periods fail, nothing is freed\n",
				 pki_errstr(-err));
		return err;
	}
	return 0;
}

struct gp_busy {
	unsigned int slot;
	struct pki_tramp_tls *tls;
	unsigned long qs;
};

/* gp_lock serialises grace periods and guards `busy`. */
static struct pki_held_mutex gp_lock = PKI_HELD_MUTEX_INIT;
static struct gp_busy *busy;
static size_t nbusy, cap_busy;

static void scan_begin(void)
{
	__atomic_add_fetch(&gp_scanning, 1, __ATOMIC_SEQ_CST);
}

static void scan_end(void)
{
	__atomic_sub_fetch(&gp_scanning, 1, __ATOMIC_SEQ_CST);
}

/* The writer's list of slots to scan (W2): every slot not parked. */
static unsigned int *listed;
static size_t nlisted, cap_listed;

#define PARK_DELAY     2  /* idle passes before a slot is first parked */
#define PARK_DELAY_MAX 64 /* a thread woken soon after parking waits longer next time */

/* P3, W2's start: take the woken stack into the list (-ENOMEM: kept on it). */
static int __woken_take(void)
{
	PKI_HELD(&gp_lock);
	unsigned int top = __atomic_exchange_n(&woken, 0, __ATOMIC_SEQ_CST);
	int err = 0;

	while (top) {
		struct gp_reader *r = reader_at(top - 1);
		unsigned int next = r->next;

		if (!r->listed && PKI_GROW(listed, cap_listed, nlisted + 1)) {
			err = -ENOMEM; /* the rest stays off the list: put it back */
			__atomic_store_n(&woken, top, __ATOMIC_SEQ_CST);
			break;
		}
		__atomic_store_n(&r->on_stack, 0, __ATOMIC_SEQ_CST);
		if (!r->listed) {
			r->listed = true;
			listed[nlisted++] = top - 1;
		}
		if (r->parked_gp && gp_stat.periods - r->parked_gp <= 2 &&
		    r->delay < PARK_DELAY_MAX)
			r->delay = (unsigned char)(r->delay * 2); /* woken soon: park it later */
		r->parked_gp = 0;
		__atomic_add_fetch(&gp_stat.woke, 1, __ATOMIC_RELAXED);
		top = next;
	}
	return err;
}

/*
 * P2: a slot parked at an earlier pass (PARKING).  Its counter, read after
 * this grace period's W1: still PKI_TRAMP_UNREG (or below 0 but not -1) and
 * no activation: parked for good (true, off the list).  Anything else: the
 * park was lost to the thread's own increment, or the thread woke; either
 * way the slot is scanned as usual (false).
 */
static bool __park_confirm(struct gp_reader *r, struct pki_tramp_tls *t)
{
	PKI_HELD(&gp_lock);
	int nest = __atomic_load_n(&t->nest, __ATOMIC_SEQ_CST), st = READER_PARKING;

	if (nest >= -1) {
		__atomic_compare_exchange_n(&r->state, &st, READER_ACTIVE, false, __ATOMIC_SEQ_CST,
					    __ATOMIC_SEQ_CST);
		return false;
	}
	return __atomic_compare_exchange_n(&r->state, &st, READER_PARKED, false, __ATOMIC_SEQ_CST,
					   __ATOMIC_SEQ_CST);
}

/*
 * P1: slot @r, found outside every hook (-1) for its delay's worth of
 * passes, is parked: state first (so an activation that follows cannot be
 * overwritten), then the counter, which the thread's next entry then finds
 * negative (X_REG: it activates itself).  Lost to a concurrent increment of
 * the thread's own, the counter CAS fails or is overwritten: P2 sees it.
 */
static void __park(struct gp_reader *r, struct pki_tramp_tls *t)
{
	PKI_HELD(&gp_lock);
	int st = READER_ACTIVE, out = -1;

	if (!__atomic_compare_exchange_n(&r->state, &st, READER_PARKING, false, __ATOMIC_SEQ_CST,
					 __ATOMIC_SEQ_CST))
		return;
	if (!__atomic_compare_exchange_n(&t->nest, &out, PKI_TRAMP_UNREG, false, __ATOMIC_SEQ_CST,
					 __ATOMIC_SEQ_CST)) {
		st = READER_PARKING;
		__atomic_compare_exchange_n(&r->state, &st, READER_ACTIVE, false, __ATOMIC_SEQ_CST,
					    __ATOMIC_SEQ_CST);
		return;
	}
	r->idle = 0;
	r->parked_gp = gp_stat.periods;
	__atomic_add_fetch(&gp_stat.parked, 1, __ATOMIC_RELAXED);
}

/* Note thread @t in slot @i as busy (W2) and ask it to answer. */
static int __note_one(unsigned int i, struct pki_tramp_tls *t)
{
	PKI_HELD(&gp_lock);
	if (PKI_GROW(busy, cap_busy, nbusy + 1))
		return -ENOMEM;
	busy[nbusy++] = (struct gp_busy){i, t, __atomic_load_n(&t->qs, __ATOMIC_ACQUIRE)};
	__atomic_store_n(&t->want, 1, __ATOMIC_RELEASE);
	return 0;
}

/*
 * Look at listed slot @i: false when it leaves the list (emptied: its
 * thread exited; or parked for good), else true, having noted it busy
 * (W2) or counted it idle and perhaps parked it (P1).
 */
static bool __scan_one(unsigned int i, int *err)
{
	PKI_HELD(&gp_lock);
	struct gp_reader *r = reader_at(i);
	struct pki_tramp_tls *t = __atomic_load_n(&r->tls, __ATOMIC_SEQ_CST);
	int nest;

	if (!t || (__atomic_load_n(&r->state, __ATOMIC_SEQ_CST) == READER_PARKING &&
		   __park_confirm(r, t)))
		return false;
	nest = __atomic_load_n(&t->nest, __ATOMIC_SEQ_CST);
	if (nest >= 0) {
		r->idle = 0;
		*err = __note_one(i, t);
	} else if (nest == -1 && ++r->idle >= (r->delay ? r->delay : PARK_DELAY)) {
		if (!r->delay)
			r->delay = PARK_DELAY;
		__park(r, t);
	}
	return true;
}

/*
 * W2, inside a pass: the listed slots (P3 brings the woken ones in first).
 * -ENOMEM if a busy thread cannot be noted.
 */
static int __note_busy(void)
{
	PKI_HELD(&gp_lock);
	size_t kept = 0;
	int err = __woken_take();

	nbusy = 0;
	for (size_t k = 0; k < nlisted; k++) {
		unsigned int i = listed[k];

		if (err || __scan_one(i, &err)) /* after an error: kept as they are */
			listed[kept++] = i;
		else
			reader_at(i)->listed = false;
	}
	nlisted = kept;
	__atomic_add_fetch(&gp_stat.scanned, nlisted, __ATOMIC_RELAXED);
	__atomic_add_fetch(&gp_stat.waited, nbusy, __ATOMIC_RELAXED);
	return err;
}

/* W3, inside a pass: drop the noted threads that are done. */
static void __recheck_busy(void)
{
	PKI_HELD(&gp_lock);
	size_t kept = 0;

	for (size_t i = 0; i < nbusy; i++) {
		struct gp_busy *b = &busy[i];
		struct pki_tramp_tls *t =
		    __atomic_load_n(&reader_at(b->slot)->tls, __ATOMIC_SEQ_CST);

		if (t != b->tls || __atomic_load_n(&t->nest, __ATOMIC_ACQUIRE) < 0 ||
		    __atomic_load_n(&t->qs, __ATOMIC_ACQUIRE) != b->qs)
			continue;
		busy[kept++] = *b;
	}
	nbusy = kept;
}

static long elapsed_ns(const struct timespec *since)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - since->tv_sec) * 1000000000l + now.tv_nsec - since->tv_nsec;
}

int pki_gp_synchronize(void)
{
	return pki_gp_synchronize_for(0);
}

/* Spin this many passes (yielding) before sleeping: most threads leave a hook in microseconds. */
#define GP_SPINS 20

int pki_gp_synchronize_for(long timeout_ns)
{
	struct timespec start;
	bool warned = false;
	int err, spins = 0;

	if (pki_tramp_in_hook())
		return -EDEADLK;
	pki_hook_atfork_init();
	pki_held_lock(&gp_lock);
	__atomic_add_fetch(&gp_stat.periods, 1, __ATOMIC_RELAXED);
	err = gp_barrier();
	if (err)
		goto unlock;
	scan_begin();
	err = __note_busy();
	scan_end();
	if (err)
		goto unlock;
	clock_gettime(CLOCK_MONOTONIC, &start);
	while (nbusy) {
		uint32_t seen = __atomic_load_n(&gp_answers, __ATOMIC_ACQUIRE);
		long ns;

		scan_begin();
		__recheck_busy();
		scan_end();
		if (!nbusy)
			break;
		ns = elapsed_ns(&start);
		if (timeout_ns && ns > timeout_ns) {
			err = -ETIMEDOUT;
			goto unlock;
		}
		if (!warned && ns > 2000000000l) {
			pki_warn(
			    "hooks: grace period waits for thread %d, inside a callback for 2 s\n",
			    reader_at(busy[0].slot)->tid);
			warned = true;
		}
		if (spins++ < GP_SPINS) {
			sched_yield();
		} else {
			/* Woken by a slow exit; the timeout catches one that left by the fast exit.
			 */
			struct timespec to = {0, 1000000};

			pki_futex_wait(&gp_answers, seen, &to);
		}
	}
	err = 0;
unlock:
	pki_held_unlock(&gp_lock);
	return err;
}

/* Deferred frees. */
struct gp_cb {
	struct gp_cb *next;
	void (*fn)(void *);
	void *arg;
};

/* defer_lock guards the queue and the counters; the worker waits on defer_cv. */
static struct pki_held_mutex defer_lock = PKI_HELD_MUTEX_INIT;
static pthread_cond_t defer_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static struct gp_cb *queue;
static unsigned long queued, done; /* callbacks ever queued / run */
static unsigned long taken;	   /* queued before the worker's current batch */
static unsigned long waiting;	   /* pki_gp_barrier callers waiting: no batching delay */
static bool worker_up;

/*
 * How long the worker lets callbacks accumulate (10 ms) before it starts a grace
 * period, like call_rcu's batching: a burst of detaches costs one grace
 * period, not one each (and no signal per detach to threads running hooks).
 * This delays reclamation only; the grace period itself is still
 * pki_gp_synchronize().  A pki_gp_barrier() caller cuts the delay short.
 */
#define GP_BATCH_NS 10000000L

/*
 * Run every callback queued now, after one grace period that began after
 * they were queued: the worker's batch, or the caller's own when no worker
 * can be started.  defer_lock held on entry and on return, not meanwhile.
 */
static void __run_queue(void)
{
	PKI_HELD(&defer_lock);
	struct gp_cb *list = queue;
	unsigned long n = taken = queued;
	bool ok;

	queue = NULL;
	pki_held_unlock(&defer_lock);
	ok = !pki_gp_synchronize(); /* failed (membarrier refused): leak, never free early */
	while (list) {
		struct gp_cb *next = list->next;

		if (ok)
			list->fn(list->arg);
		free(list);
		list = next;
	}
	pki_held_lock(&defer_lock);
	if (done < n)
		done = n;
	pthread_cond_broadcast(&done_cv);
}

static void *defer_worker(void *unused)
{
	(void)unused;
	pki_held_lock(&defer_lock);
	for (;;) {
		while (!queue)
			pki_held_cond_wait(&defer_cv, &defer_lock);
		if (!waiting) {
			struct timespec until;

			clock_gettime(CLOCK_MONOTONIC, &until);
			until.tv_nsec += GP_BATCH_NS;
			if (until.tv_nsec >= 1000000000L) {
				until.tv_sec++;
				until.tv_nsec -= 1000000000L;
			}
			while (!waiting &&
			       pki_held_cond_clockwait(&defer_cv, &defer_lock, CLOCK_MONOTONIC,
						       &until) != ETIMEDOUT)
				;
		}
		__run_queue();
	}
	return NULL;
}

static int __start_worker(void)
{
	PKI_HELD(&defer_lock);
	pthread_t th;
	int err = pki_worker_start(&th, true, "probekit-gp", defer_worker, NULL);

	if (!err)
		worker_up = true;
	return err;
}

/*
 * fork(), called from the registry's atfork handlers (txn.c, which orders
 * them after its own lock).  In the child only the forking thread exists:
 *  - a grace period another thread (the worker) was running dies with it.
 *    gp_lock is made anew, and every reader slot but the forking thread's
 *    emptied (their threads do not exist in the child).  gp_lock is not
 *    taken before fork(): a grace period may wait long (a thread inside a
 *    callback), and fork() must not wait for it.
 *  - the queue is consistent (defer_lock is held across fork(), and nobody
 *    holds it for long); its callbacks still run in the child, after a grace
 *    period of the child, by a worker started again on demand (pki_gp_defer,
 *    pki_gp_barrier).  The batch the parent's worker had taken off the
 *    queue is lost with the worker: those objects leak in the child (never
 *    reused, so never unsafe), and count as done for pki_gp_barrier().
 */
void pki_gp_fork_prepare(void)
{
	pki_held_lock(&defer_lock);
}

void pki_gp_fork_parent(void)
{
	pki_held_unlock(&defer_lock);
}

void pki_gp_fork_child(void)
{
	unsigned int hwm = __atomic_load_n(&reader_hwm, __ATOMIC_RELAXED);

	pki_held_init(&gp_lock);
	/* A grace period of another thread may have been between realloc and its store: leak. */
	busy = NULL;
	nbusy = cap_busy = 0;
	gp_scanning = 0;
	gp_stat.readers = 0;
	listed = NULL; /* as busy: another thread's pass may have been growing it */
	nlisted = cap_listed = 0;
	woken = 0;
	for (unsigned int i = 0; i < hwm; i++) {
		struct gp_reader *r = reader_at(i);

		if (!r)
			continue;
		r->on_stack = 0;
		r->listed = false;
		if (r->tls && r->tls != &pki_tramp_tls) {
			r->tls = NULL;
		} else if (r->tls) {
			r->tid = (pid_t)syscall(SYS_gettid);
			gp_stat.readers = 1;
			reader_activate(i); /* the forking thread may be inside a hook */
		}
	}
	/*
	 * A membarrier() registration belongs to the address space: the
	 * child's is made again here (entries stay as they are, unlocked).
	 */
	if (pki_gp_barrier_ok &&
	    syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0))
		pki_warn("hooks: fork child: membarrier: %s: grace periods here do not "
			 "order running threads\n",
			 pki_errstr(errno));
	done = taken;
	waiting = 0;
	worker_up = false;
	pthread_cond_init(&defer_cv, NULL);
	pthread_cond_init(&done_cv, NULL);
	pki_held_unlock(&defer_lock);
}

void pki_gp_defer(void (*fn)(void *), void *arg)
{
	struct gp_cb *cb = malloc(sizeof(*cb));

	pki_hook_atfork_init(); /* our fork handling is called from the registry's */
	pki_held_lock(&defer_lock);
	if (!cb || (!worker_up && __start_worker())) {
		pki_held_unlock(&defer_lock);
		free(cb);
		if (!pki_gp_synchronize())
			fn(arg);
		return;
	}
	*cb = (struct gp_cb){.next = queue, .fn = fn, .arg = arg};
	/*
	 * Wake the worker only for the first callback of a batch: later ones
	 * join the batch it is already timing, without making it run (a running
	 * worker makes every membarrier of the patch layer interrupt its CPU).
	 */
	if (!queue)
		pthread_cond_signal(&defer_cv);
	queue = cb;
	queued++;
	pki_held_unlock(&defer_lock);
}

void pki_gp_barrier(void)
{
	unsigned long want;

	pki_held_lock(&defer_lock);
	want = queued;
	if (done < want && !worker_up && __start_worker())
		__run_queue(); /* e.g. a fork child's queue, no thread to be had */
	if (done < want) {
		waiting++;
		pthread_cond_signal(&defer_cv); /* end the worker's batching delay */
		while (done < want)
			pki_held_cond_wait(&done_cv, &defer_lock);
		waiting--;
	}
	pki_held_unlock(&defer_lock);
}
