// SPDX-License-Identifier: MIT
/*
 * The watchpoint manager: admission, the root events of each watchpoint, the
 * SIGTRAP handler that turns perf sigtraps into hits, and safe freeing.
 *
 * Admission ("count an all-threads watchpoint once", the kernel's
 * tsk_pinned_all idea).  Every thread has PKI_HWBP_SLOTS slots.  A watchpoint
 * takes one slot per part (a range split over several debug registers,
 * doc/design/hw-watch-split.md: S1, S2), in every thread it watches.  A
 * thread uses
 *	nr_all (slots of all-threads watchpoints, the same for every thread)
 *	+ own(tid) (slots of its single-thread watchpoints).
 * own() lives in a map by tid (base/umap.h); a histogram (watch/hist.h)
 * counts the threads by own(); threads with own() == 0 are in neither (but
 * for idle records awaiting pruning), so creating a thread costs the
 * library nothing.  Then
 *	a single-thread add of n parts on T fits iff nr_all + own(T) + n <= SLOTS,
 *	an all-threads add of n parts fits   iff nr_all + n + max(own) <= SLOTS,
 * both O(SLOTS).  Only the failure path walks anything: it first reaps the
 * single-thread watchpoints of threads that exited (tgkill(pid, tid, 0) ==
 * ESRCH), then names the full thread and what holds its slots.
 *
 * Roots.  An all-threads watchpoint opens one inheritable event per part and
 * thread alive when it is added (the part's "roots"); threads created later
 * inherit a copy of each from their creator.  Modify/enable/disable are one
 * ioctl per root and reach the copies.  A root whose thread exited must stay
 * open: closing it would destroy the copies it carries.
 *
 * Locking.  mgr.lock (a mutex) serialises every pk_watch_* call and guards all
 * of mgr and every struct pk_watch except what the handler reads (below).  It
 * is never taken in signal context.  It is a struct pki_held_mutex
 * (base/held.h): the `__` functions here and in page.c check it.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/perf_event.h>
#include <probekit/watch.h>

#include "arch/arch.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/held.h"
#include "base/log.h"
#include "base/opts.h"
#include "base/threads.h"
#include "base/umap.h"
#include "base/sigtrap.h"
#include "base/peek.h"
#include "base/siglock.h"
#include "watch/cond.h"
#include "watch/gate.h"
#include "watch/hist.h"
#include "watch/page.h"
#include "watch/perf.h"
#include "watch/watch_int.h"

struct wroot {
	pid_t tid;
	int fd;
};

/*
 * One debug register of a watchpoint: a piece of its range (S1), with an
 * event of its own on each root thread.  @where and @shadow are read by the
 * handler (S3); a part is never freed before its watchpoint (R4).
 */
struct wpart {
	_Atomic uint64_t where;	 /* the piece: where_pack() */
	_Atomic uint64_t shadow; /* cond_values: the piece's value the last hit saw (OLD) */
	/* Under mgr.lock. */
	int nr_roots, cap;
	struct wroot *roots;
};

struct pk_watch {
	/* Read by the SIGTRAP handler: written once before publication. */
	pk_watch_cb cb;
	void *ctx;
	struct pk_hitq *queue;
	atomic_ulong hits;     /* reported (callback, queue), late ones included */
	atomic_ulong late;     /* of those, delivered after the thread unblocked SIGTRAP */
	atomic_ulong self;     /* made while a callback ran on that thread: not reported */
	atomic_ulong filtered; /* failed cond: not reported */
	bool has_cond;	       /* cond has something to check */
	bool cond_values;      /* ... on the values: the handler reads them */
	struct pk_watch_cond cond;
	struct wpart part[PKI_HWBP_SLOTS]; /* [0, nr_parts) in use; [nr_parts, SLOTS) idle */

	/* Page mode (page.c): everything above but cb, ctx and queue is its own. */
	struct pki_pwatch *page;

	/* Under mgr.lock. */
	uint32_t slot;
	pid_t tid;		      /* 0: all threads */
	struct pki_bp bp;	      /* the whole range; its parts' events are of their pieces */
	int nr_parts;		      /* debug registers it takes in each thread it watches */
	bool dead;		      /* nothing installed any more (thread exited, fork child) */
	unsigned long counted_closed; /* the kernel's count of roots closed so far */
	struct pk_watch *prev, *next;
};

/*
 * The slot table maps si_perf_data back to a watchpoint.  It is never freed
 * (chunks are allocated on demand and published with release), so the handler
 * may index it at any time.
 * sig_data = MAGIC << 48 | gen << 24 | part << 16 | index (S3).
 */
#define SIG_MAGIC   0x504bULL /* "PK" */
#define IDX_BITS    16
#define PART_SHIFT  16
#define PART_MASK   0xffU
#define GEN_SHIFT   24
#define GEN_MASK    ((1U << 24) - 1)
#define CHUNK_SLOTS 256
#define NR_CHUNKS   256 /* 65536 watchpoints at once */
_Static_assert(NR_CHUNKS *CHUNK_SLOTS <= 1U << IDX_BITS, "slot index in sig_data");
_Static_assert(PKI_HWBP_SLOTS <= PART_MASK + 1, "part in sig_data");

/*
 * A part's piece in one word, for the handler's one load (S3): the address
 * (below 2^56, x86-64 user space even with 5-level paging), log2 of the
 * length in bits 56-57, the offset in the watchpoint's range in 58-63.
 */
static uint64_t where_pack(uintptr_t addr, size_t len, uintptr_t start)
{
	return (uint64_t)addr | (uint64_t)__builtin_ctzl(len) << 56 |
	       (uint64_t)(addr - start) << 58;
}

static uintptr_t where_addr(uint64_t v)
{
	return (uintptr_t)(v & ((1ULL << 56) - 1));
}

static uint32_t where_len(uint64_t v)
{
	return 1U << ((v >> 56) & 3);
}

static uint32_t where_off(uint64_t v)
{
	return (uint32_t)(v >> 58);
}

struct wslot {
	atomic_uint inflight;	      /* handlers between enter and exit */
	atomic_uint gen;	      /* bumped when the slot's watchpoint is removed */
	_Atomic(struct pk_watch *) w; /* NULL while free or being removed */
	uint32_t next_free;	      /* under mgr.lock */
};

static _Atomic(struct wslot *) chunks[NR_CHUNKS];

/*
 * A thread's single-thread usage, in mgr.towns.  Made before anything
 * irreversible (__town_reserve()), so that counting cannot fail; a record
 * whose own() fell to 0 stays, idle, until the idle ones are the majority.
 */
struct town {
	unsigned long tid; /* the key */
	int own;
};

static struct {
	struct pki_held_mutex lock; /* base/held.h: the `__` functions check it */
	bool handler_installed;
	int nr_all;
	struct pki_hist hist;  /* threads by own(), own > 0 only */
	struct pki_umap towns; /* tid -> struct town */
	size_t nr_idle;	       /* towns with own() == 0 */
	struct pk_watch *list;
	uint32_t nr_slots_used, free_slot; /* free list head, UINT32_MAX = empty */
	unsigned long removals;		   /* pk_watch_remove() calls so far */
	uint64_t last_close_ns;		   /* mono ns: our last breakpoint event closed */
} mgr = {
    .lock = PKI_HELD_MUTEX_INIT,
    .towns = PKI_UMAP_INIT(struct town, tid),
    .free_slot = UINT32_MAX,
};

struct pki_held_mutex *const pki_watch_mgr_lock = &mgr.lock;

static const char *const type_name[] = {
    [PK_WATCH_W] = "W",
    [PK_WATCH_RW] = "RW",
    [PK_WATCH_X] = "X",
};

static struct wslot *slot_at(uint32_t idx)
{
	struct wslot *c = atomic_load_explicit(&chunks[idx / CHUNK_SLOTS], memory_order_acquire);

	return c ? &c[idx % CHUNK_SLOTS] : NULL;
}

/* ---- the SIGTRAP client ------------------------------------------------- */

/*
 * Depth of watch callbacks running on this thread.  The handler runs with
 * SIGTRAP unblocked (base/sigown.c: SA_NODEFER), so an access the callback
 * makes to watched memory traps at once, nested; it is counted as `self`
 * and not reported.  (With SIGTRAP blocked, as before, it stayed pending and
 * was delivered when the handler returned: a callback reading a read/write
 * watchpoint's variable then trapped again forever.)  Initial-exec TLS: no
 * allocation on first use, safe in a signal handler.
 */
static __thread unsigned int cb_depth __attribute__((tls_model("initial-exec")));

/* R5's bounds: CPU time each runnable thread runs, wall time waited. */
#define SETTLE_RUN_NS  1000000
#define SETTLE_WAIT_MS 2000

/*
 * Freeing protocol (why pk_watch_remove may free a watchpoint).
 *   handler:  H1 inflight++   H2 load gen, load w   H3 use w   H4 inflight--
 *   remover:  R1 w = NULL, gen++   R2 disable, close fds   R3 wait until inflight == 0
 *             R4 free w, recycle the slot
 * All of H1, H2, R1 and R3's loads are seq_cst, so they sit in one total
 * order.  A handler that loaded the old w did H2 before R1, hence H1 before R1
 * before every R3 load: R3 reads inflight >= 1 until that handler's H4, which
 * follows its last use of w.  A handler whose H1 comes after R3's final load
 * is after R1 too and loads w == NULL (or a new gen): it never touches the old
 * w.  The wait is bounded by the longest callback running at R1 (callbacks
 * must be short, see watch.h); it is not a sleep, it watches a counter.
 * A SIGTRAP still pending after R2 (a thread blocking SIGTRAP) carries the old
 * generation and is swallowed, never forwarded: it is ours.
 *
 * R2 disables before it closes: a fork child holds copies of the fds until
 * its fork handler closes them (a raw clone or vfork, until it exits or
 * execs), and an event open there keeps counting and raising SIGTRAPs on
 * our threads.
 *
 * R5, giving SIGTRAP back to the program (pki_watch_release, no watchpoint
 * left): disabling or closing an event at R2 does not wait for a hit's
 * SIGTRAP the kernel has yet to send.  That signal is sent by work queued on the thread that
 * hit, run on its way back to user space; a thread preempted on that way
 * runs it whenever it gets a CPU again, and the SIGTRAP it then queues would
 * reach the program's handler (seen under load: si_code TRAP_PERF in the
 * program's handler after a detach).  So the handler is dropped only once
 * every thread has been seen off that way (pki_threads_settled: asleep, or
 * SETTLE_RUN_NS of CPU run since R2, which the work and the handler take a
 * small part of), then with no SIGTRAP pending (pki_sigtrap_client_drop).
 * A thread starved for SETTLE_WAIT_MS keeps the handler in place, swallowing
 * ours and passing the program's on.
 *
 * A watchpoint split over several registers (doc/design/hw-watch-split.md)
 * keeps this protocol as it is: its parts' events all carry its slot and
 * generation, and what H3 reads of a part lies inside w (S3).
 *
 * A hit the kernel could not deliver at once because the thread blocked
 * SIGTRAP comes when it unblocks, flagged TRAP_PERF_FLAG_ASYNC, with the
 * context of that moment: reported with PK_WATCH_HIT_LATE.  The hits that
 * came meanwhile were merged into it (one SIGTRAP pending at most): only the
 * kernel's count knows them (pk_watch_stats).
 */
/*
 * @w's condition on a hit of the hardware in part @p, whose piece is
 * @hit->addr, @hit->len (S4): NEW the piece read now without faulting or
 * trapping again (process_vm_readv: a read by the kernel is not a user
 * access), OLD the value the previous hit of that part saw.
 */
static bool hw_cond_pass(struct pk_watch *w, struct wpart *p, const struct pk_watch_hit *hit)
{
	uint64_t now = 0, before;

	if (!w->cond_values)
		return pki_watch_cond_pass_values(&w->cond, 0, 0, hit->tid, hit->ip, hit->uc);
	if (pki_peek((const void *)hit->addr, &now, hit->len))
		return true; /* unreadable: reported, not judged */
	before = atomic_exchange_explicit(&p->shadow, now, memory_order_relaxed);
	if (w->cond.changed && before == now)
		return false;
	return pki_watch_cond_pass_values(
	    &w->cond, pki_watch_value((const uint8_t *)&before, hit->len),
	    pki_watch_value((const uint8_t *)&now, hit->len), hit->tid, hit->ip, hit->uc);
}

static bool watch_sigtrap(int sig, siginfo_t *si, void *ucv)
{
	uint64_t data;
	uint32_t idx, gen, part;
	struct wslot *s;
	struct pk_watch *w;
	int saved_errno;

	(void)sig;
	if (si->si_code != TRAP_PERF || pki_si_perf_type(si) != PERF_TYPE_BREAKPOINT)
		return false;
	data = pki_si_perf_data(si);
	if ((data >> 48) != SIG_MAGIC)
		return false;
	idx = (uint32_t)data & ((1U << IDX_BITS) - 1);
	part = (uint32_t)(data >> PART_SHIFT) & PART_MASK;
	gen = (uint32_t)(data >> GEN_SHIFT) & GEN_MASK;
	if (idx >= (uint32_t)NR_CHUNKS * CHUNK_SLOTS || part >= PKI_HWBP_SLOTS ||
	    !(s = slot_at(idx)))
		return false;

	saved_errno = errno;
	atomic_fetch_add(&s->inflight, 1); /* H1 */
	w = atomic_load(&s->w);		   /* H2 */
	if (w && atomic_load(&s->gen) == gen) {
		/* S3: the piece of the part that trapped, in one load */
		struct wpart *p = &w->part[part];
		uint64_t where = atomic_load_explicit(&p->where, memory_order_relaxed);
		ucontext_t *uc = ucv;
		struct pk_watch_hit hit = {
		    .sz = sizeof(hit),
		    .watch = w,
		    .ctx = w->ctx,
		    .tid = (pid_t)syscall(SYS_gettid),
		    .addr = where ? where_addr(where) : (uintptr_t)si->si_addr,
		    .ip = pki_uc_ip(uc),
		    .uc = uc,
		    .off = where ? where_off(where) : 0,
		    .len = where ? where_len(where) : 0,
		};

		if (cb_depth) {
			atomic_fetch_add_explicit(&w->self, 1, memory_order_relaxed);
		} else if (w->has_cond && hit.len && !hw_cond_pass(w, p, &hit)) {
			atomic_fetch_add_explicit(&w->filtered, 1, memory_order_relaxed);
		} else {
			if (pki_si_perf_flags(si) & TRAP_PERF_FLAG_ASYNC) {
				hit.flags |= PK_WATCH_HIT_LATE;
				atomic_fetch_add_explicit(&w->late, 1, memory_order_relaxed);
			}
			atomic_fetch_add_explicit(&w->hits, 1, memory_order_relaxed);
			cb_depth++;
			if (w->cb)
				w->cb(&hit);
			if (w->queue)
				pk_hitq_push(w->queue, &hit);
			cb_depth--;
		}
	}
	atomic_fetch_sub(&s->inflight, 1); /* H4 */
	errno = saved_errno;
	return true;
}

/* Registered once, on the first pk_watch_add (see base/sigown.c for the flags). */
static int __install_handler(void)
{
	PKI_HELD(&mgr.lock);
	int err;

	if (mgr.handler_installed)
		return 0;
	err = pki_sigtrap_client_add(PKI_SIGTRAP_WATCH, watch_sigtrap, 0);
	if (err) {
		pki_warn("watch: cannot install the SIGTRAP handler: %s\n", pki_errstr(err));
		return err;
	}
	mgr.handler_installed = true;
	return 0;
}

bool pki_watch_release(void)
{
	for (int tries = 0; tries < 3; tries++) {
		unsigned long removals;
		bool done, installed;

		pki_held_lock(&mgr.lock);
		done = !mgr.list;
		installed = mgr.handler_installed;
		removals = mgr.removals;
		pki_held_unlock(&mgr.lock);
		if (!done || !installed)
			return done;
		/*
		 * R5, outside the lock (a fork or an API call meanwhile is not
		 * held up): the threads seen off their way back, then no SIGTRAP
		 * pending.  A removal meanwhile has hits of its own: again.
		 */
		if (!pki_threads_settled(SETTLE_RUN_NS, SETTLE_WAIT_MS) ||
		    pki_threads_pending(1ull << (SIGTRAP - 1), SETTLE_WAIT_MS / 2))
			return false;
		pki_held_lock(&mgr.lock);
		if (mgr.removals == removals) {
			done = !mgr.list;
			if (done && mgr.handler_installed) {
				done = pki_sigtrap_client_drop(PKI_SIGTRAP_WATCH);
				mgr.handler_installed = !done;
			}
			pki_held_unlock(&mgr.lock);
			return done;
		}
		pki_held_unlock(&mgr.lock);
	}
	return false;
}

/* ---- slots -------------------------------------------------------------- */

static int __slot_get(uint32_t *idx)
{
	PKI_HELD(&mgr.lock);
	struct wslot *c;
	uint32_t i;

	if (mgr.free_slot != UINT32_MAX) {
		i = mgr.free_slot;
		mgr.free_slot = slot_at(i)->next_free;
		*idx = i;
		return 0;
	}
	i = mgr.nr_slots_used;
	if (i >= (uint32_t)NR_CHUNKS * CHUNK_SLOTS)
		return -ENOMEM;
	if (i % CHUNK_SLOTS == 0) {
		c = calloc(CHUNK_SLOTS, sizeof(*c));
		if (!c)
			return -ENOMEM;
		atomic_store_explicit(&chunks[i / CHUNK_SLOTS], c, memory_order_release);
	}
	mgr.nr_slots_used++;
	*idx = i;
	return 0;
}

static void __slot_put(uint32_t idx)
{
	PKI_HELD(&mgr.lock);
	slot_at(idx)->next_free = mgr.free_slot;
	mgr.free_slot = idx;
}

/* The sig_data of part 0 of the watchpoint in slot @idx; part k's adds k << PART_SHIFT. */
static uint64_t slot_sig_data(uint32_t idx)
{
	uint32_t gen = atomic_load(&slot_at(idx)->gen) & GEN_MASK;

	return SIG_MAGIC << 48 | (uint64_t)gen << GEN_SHIFT | idx;
}

/* R1 + R3 of the freeing protocol (the caller closed the fds in between). */
static void slot_unpublish(uint32_t idx)
{
	struct wslot *s = slot_at(idx);

	atomic_store(&s->w, NULL);
	atomic_fetch_add(&s->gen, 1);
}

static void slot_wait_idle(uint32_t idx)
{
	struct wslot *s = slot_at(idx);

	while (atomic_load(&s->inflight))
		sched_yield();
}

/* ---- per-thread usage --------------------------------------------------- */

static struct town *__town_find(pid_t tid)
{
	PKI_HELD(&mgr.lock);
	return pki_umap_find(&mgr.towns, (unsigned long)tid);
}

static int __own(pid_t tid)
{
	PKI_HELD(&mgr.lock);
	struct town *t = __town_find(tid);

	return t ? t->own : 0;
}

/* Make sure @tid has a record, before anything irreversible happens. */
static int __town_reserve(pid_t tid)
{
	PKI_HELD(&mgr.lock);
	struct town *t = __town_find(tid);

	if (t)
		return 0;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->tid = (unsigned long)tid;
	if (pki_umap_insert(&mgr.towns, t)) {
		free(t);
		return -ENOMEM;
	}
	mgr.nr_idle++;
	return 0;
}

/* Free every record, or only the idle ones, putting the others back. */
static void __towns_prune(bool all)
{
	PKI_HELD(&mgr.lock);
	struct pki_umap *m = &mgr.towns;
	struct town **keep = all ? NULL : malloc(m->n * sizeof(*keep));
	size_t i, k = 0;

	if (!all && !keep)
		return; /* next time */
	for (i = 0; i < m->cap; i++) {
		struct town *t = m->slot[i];

		if (!t)
			continue;
		if (!all && t->own)
			keep[k++] = t;
		else
			free(t);
	}
	pki_umap_clear(m);
	/* No more records than before in the same capacity: cannot fail. */
	for (i = 0; i < k; i++)
		(void)pki_umap_insert(m, keep[i]);
	mgr.nr_idle = 0;
	free(keep);
}

/* own(@tid) += @delta (+1 or -1); its record exists (__town_reserve()). */
static void __own_move(pid_t tid, int delta)
{
	PKI_HELD(&mgr.lock);
	struct town *t = __town_find(tid);

	pki_hist_move(&mgr.hist, t->own, delta);
	if (!t->own)
		mgr.nr_idle--;
	t->own += delta;
	if (t->own)
		return;
	if (++mgr.nr_idle > 16 && 2 * mgr.nr_idle > mgr.towns.n)
		__towns_prune(false);
}

/* ---- admission ---------------------------------------------------------- */

/*
 * Close the events of @w's part @k.  In the process that owns them they are
 * disabled first and their count is kept in counted_closed
 * (pki_perf_bp_retire); a fork child only closes its copies (@parents).
 */
static void __part_close(struct pk_watch *w, int k, bool parents)
{
	PKI_HELD(&mgr.lock);
	struct wpart *p = &w->part[k];

	for (int i = 0; i < p->nr_roots; i++) {
		uint64_t n = 0;

		if (parents) {
			pki_perf_bp_close(p->roots[i].fd);
			continue;
		}
		pki_perf_bp_retire(p->roots[i].fd, &n);
		w->counted_closed += (unsigned long)n;
	}
	if (p->nr_roots && !parents)
		mgr.last_close_ns = pki_mono_ns(); /* its slots may come back late: S2 */
	p->nr_roots = 0;
}

static void __roots_close(struct pk_watch *w, bool parents)
{
	PKI_HELD(&mgr.lock);
	for (int k = 0; k < w->nr_parts; k++)
		__part_close(w, k, parents);
}

static void __close_roots(struct pk_watch *w)
{
	PKI_HELD(&mgr.lock);
	__roots_close(w, false);
}

/* @n slots more (or fewer) in use by watchpoints of @tid (0: all threads). */
static void __slots_move(pid_t tid, int n)
{
	PKI_HELD(&mgr.lock);
	if (tid)
		__own_move(tid, n);
	else
		mgr.nr_all += n;
}

/* Give back what @w holds in the accounting (it stays in the list). */
static void __unaccount(struct pk_watch *w)
{
	PKI_HELD(&mgr.lock);
	__slots_move(w->tid, -w->nr_parts);
}

/*
 * Failure path only: single-thread watchpoints of exited threads give their
 * slots back.  Their handles stay valid (dead) until pk_watch_remove.
 * Returns how many were reaped.
 */
static int __reap_dead_threads(void)
{
	PKI_HELD(&mgr.lock);
	int n = 0;

	for (struct pk_watch *w = mgr.list; w; w = w->next) {
		if (w->dead || !w->tid || pki_thread_alive(w->tid))
			continue;
		pki_debug("watch %#lx: thread %d exited, its %d slot(s) are free again\n",
			  (unsigned long)w->bp.addr, (int)w->tid, w->nr_parts);
		__close_roots(w);
		__unaccount(w);
		w->dead = true;
		n++;
	}
	return n;
}

/* Do @n more slots fit on @tid (0: on every thread)? */
static bool __fits(pid_t tid, int n)
{
	PKI_HELD(&mgr.lock);
	if (tid)
		return mgr.nr_all + __own(tid) + n <= PKI_HWBP_SLOTS;
	return mgr.nr_all + n + pki_hist_max(&mgr.hist) <= PKI_HWBP_SLOTS;
}

/* Append a description of the watchpoints holding @tid's slots to @buf. */
static void __describe_holders(char *buf, size_t size, pid_t tid)
{
	PKI_HELD(&mgr.lock);
	size_t len = strlen(buf);

	for (struct pk_watch *w = mgr.list; w && len < size; w = w->next) {
		char parts[32] = "";

		if (w->dead || w->page || (w->tid && w->tid != tid))
			continue;
		if (w->nr_parts > 1)
			snprintf(parts, sizeof(parts), " in %d registers", w->nr_parts);
		len += (size_t)snprintf(buf + len, size - len, "%s %s %#lx/%zu%s%s", len ? "," : "",
					type_name[w->bp.type], (unsigned long)w->bp.addr, w->bp.len,
					parts, w->tid ? "" : " (all threads)");
	}
}

/*
 * Room for @n more slots on @tid (0: all threads), or -ENOSPC with a
 * message naming the full thread.
 */
static int __admit(pid_t tid, int n, const void *addr)
{
	PKI_HELD(&mgr.lock);
	char holders[512] = "";
	pid_t full = tid;

	if (__fits(tid, n) || (__reap_dead_threads() && __fits(tid, n)))
		return 0;
	if (!tid) {
		/* a thread using the most own slots: the first one found */
		int max = pki_hist_max(&mgr.hist);

		for (size_t i = 0; max && i < mgr.towns.cap; i++) {
			const struct town *t = mgr.towns.slot[i];

			if (t && t->own == max) {
				full = (pid_t)t->tid;
				break;
			}
		}
	}
	__describe_holders(holders, sizeof(holders), full);
	if (full)
		pki_warn(
		    "watch %p: needs %d debug register(s), and thread %d has %d free: "
		    "%d all-threads + %d of its own watchpoint slot(s) of its %d are taken:%s: "
		    "%s\n",
		    addr, n, (int)full, PKI_HWBP_SLOTS - mgr.nr_all - __own(full), mgr.nr_all,
		    __own(full), PKI_HWBP_SLOTS, holders, pki_errstr(ENOSPC));
	else
		pki_warn("watch %p: needs %d debug register(s), and every thread has %d free: "
			 "%d all-threads watchpoint slot(s) of its %d are taken:%s: %s\n",
			 addr, n, PKI_HWBP_SLOTS - mgr.nr_all, mgr.nr_all, PKI_HWBP_SLOTS, holders,
			 pki_errstr(ENOSPC));
	return -ENOSPC;
}

/* ---- adding ------------------------------------------------------------- */

/*
 * The pieces of a target (S1) into @pc: how many, or -EINVAL with the
 * reason said.  X: the one instruction at @addr.
 */
static int split_target(const void *addr, size_t len, enum pk_watch_type type,
			struct pki_hwbp_piece pc[PKI_HWBP_SLOTS])
{
	uintptr_t a = (uintptr_t)addr;
	int n;

	if (type != PK_WATCH_W && type != PK_WATCH_RW && type != PK_WATCH_X) {
		pki_warn("watch %p: unknown type %d (PK_WATCH_W, _RW or _X): %s\n", addr, (int)type,
			 pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (!a) {
		pki_warn("watch: NULL address: %s\n", pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (type == PK_WATCH_X) {
		if (len != 1) {
			pki_warn("watch %p: X watchpoints take length 1, not %zu: %s\n", addr, len,
				 pki_errstr(EINVAL));
			return -EINVAL;
		}
		pc[0] = (struct pki_hwbp_piece){.addr = a, .len = 1};
		return 1;
	}
	n = pki_hwbp_split(a, len, pc, PKI_HWBP_SLOTS);
	if (n < 1 || n > PKI_HWBP_SLOTS) {
		pki_warn("watch %p: %s watchpoints take " PKI_HWBP_SPLIT_LENS "; %zu byte(s) at "
			 "this address %s: %s\n",
			 addr, type_name[type], len,
			 n < 1 ? "is no range"
			       : "take more than a thread has (page mode takes any)",
			 pki_errstr(EINVAL));
		return -EINVAL;
	}
	return n;
}

static int check_target(const void *addr, size_t len, enum pk_watch_type type)
{
	struct pki_hwbp_piece pc[PKI_HWBP_SLOTS];
	int n = split_target(addr, len, type, pc);

	return n < 0 ? n : 0;
}

/* The event of @w's part @k: @w->bp narrowed to the part's piece. */
static struct pki_bp part_bp(const struct pk_watch *w, int k)
{
	uint64_t where = atomic_load_explicit(&w->part[k].where, memory_order_relaxed);
	struct pki_bp bp = w->bp;

	bp.addr = where_addr(where);
	bp.len = where_len(where);
	bp.sig_data = w->bp.sig_data | (uint64_t)k << PART_SHIFT;
	return bp;
}

/*
 * Publish @pc as @w's parts [0, @n) for the handler (S3), with OLD seeded
 * from memory where a condition needs it.
 */
static void parts_set(struct pk_watch *w, const struct pki_hwbp_piece *pc, int n, uintptr_t start)
{
	for (int k = 0; k < n; k++) {
		uint64_t v = 0;

		if (w->cond_values && !pki_peek((const void *)pc[k].addr, &v, pc[k].len))
			atomic_store_explicit(&w->part[k].shadow, v, memory_order_relaxed);
		atomic_store_explicit(&w->part[k].where, where_pack(pc[k].addr, pc[k].len, start),
				      memory_order_relaxed);
	}
}

static int root_cmp(const void *a, const void *b)
{
	pid_t x = ((const struct wroot *)a)->tid, y = ((const struct wroot *)b)->tid;

	return (x > y) - (x < y);
}

static bool has_root(const struct wpart *p, int nr_sorted, pid_t tid)
{
	struct wroot key = {.tid = tid};

	if (nr_sorted && bsearch(&key, p->roots, (size_t)nr_sorted, sizeof(key), root_cmp))
		return true;
	for (int i = nr_sorted; i < p->nr_roots; i++)
		if (p->roots[i].tid == tid)
			return true;
	return false;
}

/*
 * perf_event_open on @tid, waiting out a slot the kernel has not given back
 * yet (doc/design/hw-watch-split.md, S2): where our count has room, ENOSPC
 * after a close of ours may be that close's slot, held until the thread
 * returns to user space (a hit's SIGTRAP work) or ends its exit.  So the
 * tries go on, sleeping between them, for BP_SLOT_WAIT_NS after our last
 * close, and after that while the thread may still be on that way: runnable
 * without having run BP_SLOT_RUN_NS of CPU since the first refusal (a
 * thread starved under load), up to BP_SLOT_STARVED_NS after the close.
 * A thread that ran or slept meanwhile, or no close of ours that recent:
 * the register is held outside probekit, ENOSPC.  The caller holds
 * mgr.lock and may hold the thread-creation gate: the wait is bounded, and
 * what ends it (the thread's return to user mode) needs neither.
 */
#define BP_SLOT_WAIT_NS	   (500 * 1000 * 1000ull)
#define BP_SLOT_RUN_NS	   (1000 * 1000ull)
#define BP_SLOT_STARVED_NS (10ull * 1000 * 1000 * 1000)

struct slot_wait {
	uint64_t first;	 /* mono ns of the first refusal */
	uint64_t run0;	 /* the thread's CPU time then (0: not read yet) */
	char state;	 /* its state at the last look */
	uint64_t ran_ns; /* CPU time it ran since run0 */
};

/* May the slot ENOSPC refused on @tid still be one of ours on its way back? */
static bool __slot_may_come_back(pid_t tid, struct slot_wait *sw, uint64_t now)
{
	PKI_HELD(&mgr.lock);
	uint64_t run;
	int err;

	if (now < mgr.last_close_ns + BP_SLOT_WAIT_NS)
		return true;
	if (now >= mgr.last_close_ns + BP_SLOT_STARVED_NS)
		return false;
	err = pki_thread_progress(tid, &sw->state, &run);
	if (err == -ESRCH)
		return true; /* gone: the next try says ESRCH */
	if (sw->state != 'R')
		return false;
	if (err)
		return true; /* unreadable: as if runnable, up to the bound */
	if (!sw->run0) {
		sw->run0 = run ? run : 1;
		return true;
	}
	sw->ran_ns = run > sw->run0 ? run - sw->run0 : 0;
	return sw->ran_ns < BP_SLOT_RUN_NS;
}

static int __bp_open_waiting(const struct pki_bp *bp, pid_t tid)
{
	PKI_HELD(&mgr.lock);
	struct slot_wait sw = {.state = '?'};
	long pause_ns = 100 * 1000;
	int fd;

	while ((fd = pki_perf_bp_open(bp, tid)) == -ENOSPC && mgr.last_close_ns) {
		uint64_t now = pki_mono_ns();

		if (!sw.first)
			sw.first = now;
		if (!__slot_may_come_back(tid, &sw, now))
			break;
		nanosleep(&(struct timespec){.tv_nsec = pause_ns}, NULL);
		if (pause_ns < 8 * 1000 * 1000)
			pause_ns *= 2;
	}
	if (sw.first)
		pki_debug(
		    "watch: thread %d's debug register given back after %.1f ms (%.1f ms after "
		    "our last close; thread state %c, %.2f ms run meanwhile): %s\n",
		    (int)tid, (double)(pki_mono_ns() - sw.first) / 1e6,
		    (double)(pki_mono_ns() - mgr.last_close_ns) / 1e6, sw.state,
		    (double)sw.ran_ns / 1e6, fd < 0 ? "no" : "yes");
	return fd;
}

/* The event of @w's part @k on thread @tid: 1 opened, 0 the thread exited, or -errno. */
static int add_root(struct pk_watch *w, int k, pid_t tid)
{
	struct wpart *p = &w->part[k];
	struct pki_bp bp = part_bp(w, k);
	int fd;

	if (p->nr_roots == p->cap) {
		int n = p->cap ? p->cap * 2 : 16;
		struct wroot *r = realloc(p->roots, (size_t)n * sizeof(*r));

		if (!r)
			return -ENOMEM;
		p->roots = r;
		p->cap = n;
	}
	fd = __bp_open_waiting(&bp, tid);
	if (fd == -ESRCH)
		return 0; /* exited meanwhile: nothing to watch there */
	if (fd == -EACCES || fd == -EPERM) {
		char why[320];

		pki_perf_denied_why(why, sizeof(why));
		pki_warn("watch %#lx: perf_event_open on thread %d: %s: %s\n",
			 (unsigned long)w->bp.addr, (int)tid, why, pki_errstr(fd));
		return fd;
	}
	if (fd < 0) {
		pki_warn("watch %#lx: perf_event_open on thread %d%s: %s\n",
			 (unsigned long)w->bp.addr, (int)tid,
			 fd == -ENOSPC
			     ? " (its debug registers are taken outside probekit: none was "
			       "given back though the thread ran or slept since our last close, "
			       "or it was starved for 10 s)"
			     : "",
			 pki_errstr(fd));
		return fd;
	}
	p->roots[p->nr_roots].tid = tid;
	p->roots[p->nr_roots].fd = fd;
	p->nr_roots++;
	return 1;
}

/* __open_all_roots() across its passes over the threads (pki_threads_each()). */
struct roots_pass {
	struct pk_watch *w;
	int k;	    /* the part */
	int sorted; /* its roots[0 .. sorted) are sorted by tid */
	int added;  /* this pass */
	bool failed;
};

static int roots_add(pid_t tid, void *arg)
{
	struct roots_pass *p = arg;
	int r;

	if (has_root(&p->w->part[p->k], p->sorted, tid))
		return 0;
	r = add_root(p->w, p->k, tid);
	if (r < 0) {
		p->failed = true;
		return r;
	}
	p->added += r;
	return 0;
}

/*
 * One root of part @k per thread alive now.  Called with the thread-creation
 * gate closed (gate.c): no pthread_create() is in flight, so the first pass
 * lists every thread, and a thread created after the gate opens inherits from
 * its creator's root.  The listing is still repeated until a pass adds
 * nothing, for threads the gate does not see (a raw clone(), a library's call
 * bound to libc's pthread_create): for those the old residual races remain, a
 * thread inside clone() during the last pass not covered, or one created
 * after its creator's root and listed later given a second event.
 */
static int __open_all_roots(struct pk_watch *w, int k)
{
	PKI_HELD(&mgr.lock);
	struct roots_pass p = {.w = w, .k = k};
	struct wpart *part = &w->part[k];
	int err;

	do {
		p.added = 0;
		err = pki_threads_each(0, roots_add, &p);
		if (err && !p.failed)
			pki_warn("watch %#lx: cannot list threads: /proc/self/task: %s\n",
				 (unsigned long)w->bp.addr, pki_errstr(err));
		if (err)
			return err;
		qsort(part->roots, (size_t)part->nr_roots, sizeof(*part->roots), root_cmp);
		p.sorted = part->nr_roots;
	} while (p.added);
	return 0;
}

/*
 * The roots of @w's parts [@from, @to): on its one thread, or on every
 * thread alive now (S2: under one closing of the gate).  On failure the
 * caller closes them (__part_close).
 */
static int __open_parts(struct pk_watch *w, int from, int to)
{
	PKI_HELD(&mgr.lock);
	int err = 0;

	if (!w->tid) {
		pki_gate_close(); /* no thread is being created meanwhile: gate.c */
		for (int k = from; !err && k < to; k++)
			err = __open_all_roots(w, k);
		pki_gate_open();
		return err;
	}
	for (int k = from; !err && k < to; k++) {
		int r = add_root(w, k, w->tid);

		if (!r) {
			/* exited between the check and the open */
			pki_warn("watch %#lx: thread %d exited: %s\n", (unsigned long)w->bp.addr,
				 (int)w->tid, pki_errstr(ESRCH));
			r = -ESRCH;
		}
		err = r < 0 ? r : 0;
	}
	return err;
}

static void fork_child(void);
/*
 * mgr.lock is held from fork's prepare handler to the parent or child one:
 * the program's fork handlers registered before ours run meanwhile, and its
 * mprotect on watched pages (pki_watch_page_mprotect) finds the lock its
 * thread's own (pki_held_mine).
 */
static void fork_prepare(void)
{
	pki_held_lock(&mgr.lock);
	__pki_page_fork_prepare();
}
static void fork_parent(void)
{
	__pki_page_fork_parent();
	pki_held_unlock(&mgr.lock);
}
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* @opts as this library knows them into @o (the defaults if NULL). */
static int opts_get(const void *addr, const struct pk_watch_opts *opts, struct pk_watch_opts *o)
{
	char what[48];

	*o = (struct pk_watch_opts){.sz = sizeof(*o)};
	if (!opts)
		return 0;
	snprintf(what, sizeof(what), "watch %p: opts", addr);
	return pki_opts_in(o, sizeof(*o), opts,
			   offsetof(struct pk_watch_opts, disabled) + sizeof(bool), what);
}

/* What can be refused before taking the lock. */
static int watch_check(const void *addr, size_t len, enum pk_watch_type type,
		       const struct pk_watch_opts *o)
{
	int err = check_target(addr, len, type);

	if (err)
		return err;
	if (o->tid < 0 || (o->tid && !pki_thread_alive(o->tid))) {
		pki_warn("watch %p: thread %d is not a thread of process %d: %s\n", addr,
			 (int)o->tid, (int)getpid(), pki_errstr(ESRCH));
		return -ESRCH;
	}
	return 0;
}

/*
 * Are hardware breakpoints delivered here?  Checked once per process, at
 * the first pk_watch_add() (pki_perf_bp_delivered: one event opened on the
 * calling thread, one write, one read), and kept.  A check that cannot open
 * its event concludes nothing: the add goes on and its own open says why.
 * PROBEKIT_HWBP_UNDELIVERED=1 makes the check arm its breakpoint over
 * another word than the one it writes, to test the refusal (doc/api.md).
 */
static struct {
	int delivered; /* under mgr.lock; a fork child keeps it */
	bool pretend;
} hw = {.delivered = -1};

/* 1 delivered, 0 not, -1 nothing concluded (the check could not open its event). */
static int __delivered(void)
{
	PKI_HELD(&mgr.lock);
	if (hw.delivered < 0) {
		const char *e = getenv("PROBEKIT_HWBP_UNDELIVERED");

		hw.pretend = e && *e && strcmp(e, "0");
		hw.delivered = pki_perf_bp_delivered(hw.pretend);
	}
	return hw.delivered;
}

void pki_watch_assume_delivered(void)
{
	pki_held_lock(&mgr.lock);
	hw.delivered = 1;
	pki_held_unlock(&mgr.lock);
}

static int __check_delivered(const void *addr)
{
	PKI_HELD(&mgr.lock);
	if (__delivered())
		return 0; /* delivered, or nothing concluded: the open says why */
	pki_warn("watch %p: this machine accepts hardware breakpoints but does not deliver them "
		 "(a write to a watched word of probekit's own raised no hit; a hypervisor that "
		 "does not pass debug exceptions on?)%s; page mode (PK_WATCH_MODE_PAGE, "
		 "--mode page) works here: %s\n",
		 addr, hw.pretend ? "; PROBEKIT_HWBP_UNDELIVERED is set: pretending so" : "",
		 pki_errstr(EOPNOTSUPP));
	return -EOPNOTSUPP;
}

/*
 * PK_WATCH_MODE_AUTO: debug registers where they fit and deliver, page mode
 * otherwise (for W and RW on all threads; X and single-thread watches have
 * only the hardware).  Refusals of the hardware are not said here: the page
 * mode's own, if any, are.
 */
static enum pk_watch_mode __auto_mode(const void *addr, size_t len, enum pk_watch_type type,
				      const struct pk_watch_opts *o)
{
	PKI_HELD(&mgr.lock);
	struct pki_hwbp_piece pc[PKI_HWBP_SLOTS];
	int n = pki_hwbp_split((uintptr_t)addr, len, pc, PKI_HWBP_SLOTS);
	const char *why;

	if (type == PK_WATCH_X || o->tid)
		return PK_WATCH_MODE_HW;
	if (n < 1 || n > PKI_HWBP_SLOTS)
		why = "longer or less aligned than the debug registers take";
	else if (!__delivered())
		why = "hardware breakpoints are not delivered on this machine";
	else if (mgr.hist.count && !__fits(0, n) && !(__reap_dead_threads() && __fits(0, n)))
		why = "not enough debug registers are free"; /* S2 */
	else
		return PK_WATCH_MODE_HW;
	pki_debug("watch %p/%zu: page mode: %s\n", addr, len, why);
	return PK_WATCH_MODE_PAGE;
}

/* The manager ready, and room for @n more slots on @tid (0: all threads). */
static int __watch_admit(pid_t tid, int n, const void *addr)
{
	PKI_HELD(&mgr.lock);
	int err;

	if (!mgr.hist.count && pki_hist_init(&mgr.hist, PKI_HWBP_SLOTS))
		return -ENOMEM;
	err = __check_delivered(addr);
	if (!err)
		err = __install_handler();
	if (!err)
		err = __admit(tid, n, addr);
	if (!err && tid)
		err = __town_reserve(tid);
	return err;
}

/* @c (checked already) into @w; the values OLD starts from come with its parts. */
static void watch_cond_set(struct pk_watch *w, enum pk_watch_type type,
			   const struct pk_watch_cond *c)
{
	if (!c || !pki_watch_cond_any(c))
		return;
	w->cond = *c;
	w->has_cond = true;
	w->cond_values = type != PK_WATCH_X;
}

/*
 * A new watchpoint over the pieces @pc[0, @n) in a slot of its own,
 * published to the handler before its first event exists, so that no early
 * hit is lost.
 */
static int __watch_new(const void *addr, size_t len, enum pk_watch_type type,
		       const struct pki_hwbp_piece *pc, int n, const struct pk_watch_opts *o,
		       struct pk_watch **wp)
{
	PKI_HELD(&mgr.lock);
	struct pk_watch *w = calloc(1, sizeof(*w));
	uint32_t idx;
	int err;

	if (!w)
		return -ENOMEM;
	err = __slot_get(&idx);
	if (err) {
		free(w);
		return err;
	}
	w->cb = o->callback;
	w->ctx = o->ctx;
	w->queue = o->queue;
	watch_cond_set(w, type, o->cond);
	w->slot = idx;
	w->tid = o->tid;
	w->bp = (struct pki_bp){
	    .addr = (uintptr_t)addr,
	    .len = len,
	    .type = type,
	    .disabled = o->disabled,
	    .inherit = !o->tid,
	    .sig_data = slot_sig_data(idx),
	};
	parts_set(w, pc, n, (uintptr_t)addr);
	w->nr_parts = n;
	atomic_store(&slot_at(idx)->w, w);
	*wp = w;
	return 0;
}

static void parts_free(struct pk_watch *w)
{
	for (int k = 0; k < PKI_HWBP_SLOTS; k++)
		free(w->part[k].roots);
}

/* Free @w, which failed to open: nobody saw it but the handler (R1-R4). */
static void __watch_discard(struct pk_watch *w)
{
	PKI_HELD(&mgr.lock);
	slot_unpublish(w->slot);
	__close_roots(w);
	slot_wait_idle(w->slot);
	__slot_put(w->slot);
	parts_free(w);
	free(w);
}

/* Count @w in the admission (S2) and list it. */
static void __watch_account(struct pk_watch *w)
{
	PKI_HELD(&mgr.lock);
	__slots_move(w->tid, w->nr_parts);
	w->next = mgr.list;
	if (mgr.list)
		mgr.list->prev = w;
	mgr.list = w;
}

/* A watchpoint in page mode (page.c); on the list, outside the slot model. */
static int __watch_add_page(const void *addr, size_t len, enum pk_watch_type type,
			    const struct pk_watch_opts *o, struct pk_watch **wp)
{
	PKI_HELD(&mgr.lock);
	struct pk_watch *w = calloc(1, sizeof(*w));
	int err;

	if (!w)
		return -ENOMEM;
	w->cb = o->callback;
	w->ctx = o->ctx;
	w->queue = o->queue;
	w->has_cond = o->cond && pki_watch_cond_any(o->cond);
	if (w->has_cond)
		w->cond = *o->cond;
	w->bp = (struct pki_bp){.addr = (uintptr_t)addr, .len = len, .type = type};
	err = __pki_page_add(w, addr, len, type, o, w->has_cond ? &w->cond : NULL, &w->page);
	if (err) {
		free(w);
		return err;
	}
	w->next = mgr.list;
	if (mgr.list)
		mgr.list->prev = w;
	mgr.list = w;
	pki_debug("watch %p: %s/%zu on all threads of %d, page mode\n", addr, type_name[type], len,
		  (int)getpid());
	*wp = w;
	return 0;
}

static int page_check(const void *addr, size_t len, enum pk_watch_type type)
{
	if (!addr || !len || (uintptr_t)addr + len < (uintptr_t)addr) {
		pki_warn("watch %p/%zu: page mode needs a non-NULL address and a length: %s\n",
			 addr, len, pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (type != PK_WATCH_W && type != PK_WATCH_RW) {
		pki_warn("watch %p: page mode watches writes (W) or reads and writes (RW), type %d "
			 "is neither: %s\n",
			 addr, (int)type, pki_errstr(EINVAL));
		return -EINVAL;
	}
	return 0;
}

PK_API struct pk_watch *pk_watch_add(const void *addr, size_t len, enum pk_watch_type type,
				     const struct pk_watch_opts *opts)
{
	struct pki_hwbp_piece pc[PKI_HWBP_SLOTS];
	struct pk_watch_opts o;
	struct pk_watch *w;
	int err, n;

	err = opts_get(addr, opts, &o);
	if (!err && o.cond) {
		char why[128];

		err = pki_watch_cond_check(o.cond, why, sizeof(why));
		if (err)
			pki_warn("watch %p: %s: %s\n", addr, why, pki_errstr(EINVAL));
	}
	if (!err && (unsigned)o.mode > PK_WATCH_MODE_PAGE) {
		pki_warn("watch %p: unknown mode %d (PK_WATCH_MODE_AUTO, _HW or _PAGE): %s\n", addr,
			 (int)o.mode, pki_errstr(EINVAL));
		err = -EINVAL;
	}
	if (err)
		goto out_errno;
	pthread_once(&atfork_once, register_atfork);
	if (o.mode != PK_WATCH_MODE_HW) {
		pki_held_lock(&mgr.lock);
		if (o.mode == PK_WATCH_MODE_AUTO)
			o.mode = __auto_mode(addr, len, type, &o);
		if (o.mode == PK_WATCH_MODE_PAGE) {
			err = page_check(addr, len, type);
			if (!err)
				err = __watch_add_page(addr, len, type, &o, &w);
			pki_held_unlock(&mgr.lock);
			if (err)
				goto out_errno;
			return w;
		}
		pki_held_unlock(&mgr.lock);
	}
	err = watch_check(addr, len, type, &o);
	if (err)
		goto out_errno;
	n = split_target(addr, len, type, pc);

	pki_held_lock(&mgr.lock);
	err = __watch_admit(o.tid, n, addr);
	if (!err)
		err = __watch_new(addr, len, type, pc, n, &o, &w);
	if (err)
		goto out_unlock;
	err = __open_parts(w, 0, n);
	if (err) {
		__watch_discard(w);
		goto out_unlock;
	}
	__watch_account(w);
	pki_debug("watch %p: %s/%zu on %s%d, %d register(s), %d root event(s) each\n", addr,
		  type_name[type], len, o.tid ? "thread " : "all threads of ",
		  o.tid ? (int)o.tid : (int)getpid(), n, w->part[0].nr_roots);
	pki_held_unlock(&mgr.lock);
	return w;

out_unlock:
	pki_held_unlock(&mgr.lock);
out_errno:
	return pki_err_ptr(err);
}

/* ---- the rest of the life cycle ----------------------------------------- */

PK_API void pk_watch_remove(struct pk_watch *w)
{
	if (!w)
		return;
	pki_held_lock(&mgr.lock);
	if (w->prev)
		w->prev->next = w->next;
	else
		mgr.list = w->next;
	if (w->next)
		w->next->prev = w->prev;
	if (w->page) {
		__pki_page_remove(w->page);
		mgr.removals++;
		pki_held_unlock(&mgr.lock);
		free(w);
		return;
	}
	if (!w->dead)
		__unaccount(w);
	slot_unpublish(w->slot); /* R1 */
	__close_roots(w);	 /* R2 */
	slot_wait_idle(w->slot); /* R3 */
	__slot_put(w->slot);
	mgr.removals++;
	pki_held_unlock(&mgr.lock);
	parts_free(w); /* R4 */
	free(w);
}

static int __live(struct pk_watch *w)
{
	PKI_HELD(&mgr.lock);
	if (!w->dead && w->tid && !pki_thread_alive(w->tid)) {
		__close_roots(w);
		__unaccount(w);
		w->dead = true;
	}
	return w->dead || !w->part[0].nr_roots ? -ESRCH : 0;
}

/*
 * Every root of @w's parts to @on, or none: on a failure the ones done are
 * set back (S5).
 */
static int __parts_enable(struct pk_watch *w, bool on)
{
	PKI_HELD(&mgr.lock);
	int err = 0, k, i = 0;

	for (k = 0; !err && k < w->nr_parts; k++)
		for (i = 0; !err && i < w->part[k].nr_roots; i++)
			err = pki_perf_bp_enable(w->part[k].roots[i].fd, on);
	if (!err)
		return 0;
	/* the failed one is part k - 1, root i - 1: set back those before it */
	for (int kk = 0; kk < k; kk++)
		for (int j = 0; j < (kk == k - 1 ? i - 1 : w->part[kk].nr_roots); j++)
			pki_perf_bp_enable(w->part[kk].roots[j].fd, !on);
	return err;
}

static int set_enabled(struct pk_watch *w, bool on)
{
	int err;

	if (!w) {
		pki_warn("watch: NULL watchpoint: %s\n", pki_errstr(EINVAL));
		return -EINVAL;
	}
	pki_held_lock(&mgr.lock);
	if (w->page) {
		__pki_page_enable(w->page, on);
		pki_held_unlock(&mgr.lock);
		return 0;
	}
	err = __live(w);
	if (!err)
		err = __parts_enable(w, on);
	if (!err)
		w->bp.disabled = !on;
	else if (err != -ESRCH)
		pki_warn("watch %#lx: cannot %s: %s\n", (unsigned long)w->bp.addr,
			 on ? "enable" : "disable", pki_errstr(err));
	pki_held_unlock(&mgr.lock);
	return err;
}

PK_API int pk_watch_enable(struct pk_watch *w)
{
	return set_enabled(w, true);
}

PK_API int pk_watch_disable(struct pk_watch *w)
{
	return set_enabled(w, false);
}

/*
 * Retarget @w's parts [0, @n) to their new pieces (published already): 0,
 * or -errno with every root retargeted so far set back to its piece of
 * @old (@old_where: the parts' words before).
 */
static int __parts_retarget(struct pk_watch *w, int n, const struct pki_bp *old,
			    const uint64_t *old_where)
{
	PKI_HELD(&mgr.lock);
	int err = 0, k, i = 0;

	for (k = 0; !err && k < n; k++) {
		struct pki_bp bp = part_bp(w, k);

		for (i = 0; !err && i < w->part[k].nr_roots; i++)
			err = pki_perf_bp_modify(w->part[k].roots[i].fd, &bp);
	}
	if (!err)
		return 0;
	pki_warn("watch %#lx: cannot move to %#lx %s/%zu (thread %d): %s\n",
		 (unsigned long)old->addr, (unsigned long)w->bp.addr, type_name[w->bp.type],
		 w->bp.len, (int)w->part[k - 1].roots[i - 1].tid, pki_errstr(err));
	for (int kk = 0; kk < k; kk++) {
		struct pki_bp bp = *old;

		bp.addr = where_addr(old_where[kk]);
		bp.len = where_len(old_where[kk]);
		bp.sig_data = old->sig_data | (uint64_t)kk << PART_SHIFT;
		for (int j = 0; j < (kk == k - 1 ? i - 1 : w->part[kk].nr_roots); j++)
			pki_perf_bp_modify(w->part[kk].roots[j].fd, &bp);
	}
	return err;
}

/*
 * Moving a watchpoint whose number of parts may change: S6 in
 * doc/design/hw-watch-split.md.  M1 admit the parts gained (before any
 * system call), M2 publish the new pieces, M3 open the parts gained, M4
 * retarget the parts kept, M5 retire the parts lost and account.  Only M5
 * cannot be undone, and it cannot fail; a failure at M3 or M4 puts back
 * the pieces, the parts kept's targets and the accounting of M1.
 */
PK_API int pk_watch_modify(struct pk_watch *w, const void *addr, size_t len,
			   enum pk_watch_type type)
{
	struct pki_hwbp_piece pc[PKI_HWBP_SLOTS];
	uint64_t old_where[PKI_HWBP_SLOTS], old_shadow[PKI_HWBP_SLOTS];
	struct pki_bp old;
	int err, n, nold;

	if (!w) {
		pki_warn("watch: NULL watchpoint: %s\n", pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (w->page) {
		pki_warn("watch %#lx: a page-mode watchpoint cannot be moved: remove it and add "
			 "another: %s\n",
			 (unsigned long)w->bp.addr, pki_errstr(EOPNOTSUPP));
		return -EOPNOTSUPP;
	}
	n = split_target(addr, len, type, pc);
	if (n < 0)
		return n;
	pki_held_lock(&mgr.lock);
	err = __live(w);
	if (err)
		goto out;
	nold = w->nr_parts;
	/* M1; x86: one pool for code and data, so the type does not count */
	if (n > nold && (err = __admit(w->tid, n - nold, addr)))
		goto out;
	old = w->bp;
	for (int k = 0; k < nold; k++) {
		old_where[k] = atomic_load_explicit(&w->part[k].where, memory_order_relaxed);
		old_shadow[k] = atomic_load_explicit(&w->part[k].shadow, memory_order_relaxed);
	}
	w->bp.addr = (uintptr_t)addr;
	w->bp.len = len;
	w->bp.type = type;
	parts_set(w, pc, n, (uintptr_t)addr);	       /* M2 */
	err = n > nold ? __open_parts(w, nold, n) : 0; /* M3 */
	if (!err)
		err = __parts_retarget(w, n < nold ? n : nold, &old, old_where); /* M4 */
	if (err) {
		for (int k = nold; k < n; k++)
			__part_close(w, k, false);
		w->bp = old;
		for (int k = 0; k < nold; k++) {
			atomic_store_explicit(&w->part[k].where, old_where[k],
					      memory_order_relaxed);
			atomic_store_explicit(&w->part[k].shadow, old_shadow[k],
					      memory_order_relaxed);
		}
		goto out;
	}
	/* M5 */
	for (int k = n; k < nold; k++)
		__part_close(w, k, false);
	w->nr_parts = n;
	__slots_move(w->tid, n - nold);
out:
	pki_held_unlock(&mgr.lock);
	return err;
}

PK_API unsigned long pk_watch_hits(const struct pk_watch *w)
{
	if (w && w->page)
		return pki_page_hits(w->page);
	return w ? atomic_load_explicit(&((struct pk_watch *)w)->hits, memory_order_relaxed) : 0;
}

PK_API int pk_watch_mode_of(const struct pk_watch *w)
{
	if (!w)
		return -EINVAL;
	return w->page ? PK_WATCH_MODE_PAGE : PK_WATCH_MODE_HW;
}

PK_API int pk_watch_stats(struct pk_watch *w, struct pk_watch_stats *st)
{
	struct pk_watch_stats s = {.sz = sizeof(s)};
	unsigned long seen;

	if (!w || !st)
		return -EINVAL;
	if (pki_opts_out_check(st, PKI_OPTS_END(struct pk_watch_stats, unseen), "pk_watch_stats"))
		return -EINVAL;
	pki_held_lock(&mgr.lock);
	if (w->page) {
		__pki_page_stats(w->page, &s);
		pki_held_unlock(&mgr.lock);
		pki_opts_out(st, &s, sizeof(s));
		return 0;
	}
	s.counted = w->counted_closed;
	for (int k = 0; k < w->nr_parts; k++)
		for (int i = 0; i < w->part[k].nr_roots; i++) {
			uint64_t n;

			if (!pki_perf_bp_count(w->part[k].roots[i].fd, &n))
				s.counted += (unsigned long)n;
		}
	/* Read after the kernel's count: a hit is counted before it is delivered. */
	s.hits = atomic_load(&w->hits);
	s.late = atomic_load(&w->late);
	s.self = atomic_load(&w->self);
	s.filtered = atomic_load(&w->filtered);
	pki_held_unlock(&mgr.lock);
	seen = s.hits + s.self + s.filtered;
	s.unseen = s.counted > seen ? s.counted - seen : 0;
	pki_opts_out(st, &s, sizeof(s));
	return 0;
}

/*
 * In a fork child no event is ours (inherit_thread: fork does not inherit,
 * and single-thread events never do), but the fds were duplicated: close them
 * so the parent's events die with the parent's own close.  Handles become
 * dead; the accounting starts from zero.  The lock was taken in
 * fork_prepare by the thread that is now the child's only thread.
 */
static void fork_child(void)
{
	__pki_page_fork_child();
	for (struct pk_watch *w = mgr.list; w; w = w->next) {
		if (!w->page)
			__roots_close(w, true); /* the parent's events, the parent's counts */
		w->dead = true;
	}
	mgr.nr_all = 0;
	if (mgr.hist.count)
		memset(mgr.hist.count, 0, sizeof(long) * PKI_HWBP_SLOTS);
	__towns_prune(true);
	pki_held_unlock(&mgr.lock);
}

int pki_watch_page_mprotect(void *addr, size_t len, int prot)
{
	sigset_t saved;
	int err;

	/*
	 * Signals blocked while the lock is held: a handler of this thread
	 * calling mprotect on the watched pages too (a collector's SIGSEGV
	 * handler, a timer's) would wait for it for ever.  Not taken again
	 * when this thread holds it already: a fork handler of the program's,
	 * run between ours.
	 */
	if (pki_held_mine(&mgr.lock))
		return __pki_page_mprotect(addr, len, prot);
	pki_siglock_block(&saved);
	pki_held_lock(&mgr.lock);
	err = __pki_page_mprotect(addr, len, prot);
	pki_held_unlock(&mgr.lock);
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	return err;
}
