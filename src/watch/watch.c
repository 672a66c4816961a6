// SPDX-License-Identifier: MIT
/*
 * The watchpoint manager: admission, the root events of each watchpoint, the
 * SIGTRAP handler that turns perf sigtraps into hits, and safe freeing.
 *
 * Admission ("count an all-threads watchpoint once", the kernel's
 * tsk_pinned_all idea).  Every thread has PKI_HWBP_SLOTS slots.  A thread uses
 *	nr_all (all-threads watchpoints, the same for every thread)
 *	+ own(tid) (its single-thread watchpoints).
 * own() lives in a map by tid (base/umap.h); a histogram (watch/hist.h)
 * counts the threads by own(); threads with own() == 0 are in neither (but
 * for idle records awaiting pruning), so creating a thread costs the
 * library nothing.  Then
 *	a single-thread add on T fits iff nr_all + own(T) + 1 <= SLOTS,
 *	an all-threads add fits   iff nr_all + 1 + max(own) <= SLOTS,
 * both O(SLOTS).  Only the failure path walks anything: it first reaps the
 * single-thread watchpoints of threads that exited (tgkill(pid, tid, 0) ==
 * ESRCH), then names the full thread and what holds its slots.
 *
 * Roots.  An all-threads watchpoint opens one inheritable event per thread
 * alive when it is added (its "roots"); threads created later inherit a copy
 * from their creator.  Modify/enable/disable are one ioctl per root and reach
 * the copies.  A root whose thread exited must stay open: closing it would
 * destroy the copies it carries.
 *
 * Locking.  mgr.lock (a mutex) serialises every pk_watch_* call and guards all
 * of mgr and every struct pk_watch except what the handler reads (below).  It
 * is never taken in signal context.
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
#include "base/log.h"
#include "base/threads.h"
#include "base/umap.h"
#include "base/sigtrap.h"
#include "base/peek.h"
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

struct pk_watch {
	/* Read by the SIGTRAP handler: written once before publication. */
	pk_watch_cb cb;
	void *ctx;
	struct pk_hitq *queue;
	atomic_ulong hits; /* reported (callback, queue), late ones included */
	atomic_ulong late; /* of those, delivered after the thread unblocked SIGTRAP */
	atomic_ulong self; /* made while a callback ran on that thread: not reported */
	atomic_ulong filtered; /* failed cond: not reported */
	bool has_cond;	       /* cond has something to check */
	bool cond_values;      /* ... on the values: the handler reads them */
	struct pk_watch_cond cond;
	_Atomic uint64_t shadow; /* cond_values: the value the last hit saw (OLD) */

	/* Page mode (page.c): everything above but cb, ctx and queue is its own. */
	struct pki_pwatch *page;

	/* Under mgr.lock. */
	uint32_t slot;
	pid_t tid; /* 0: all threads */
	struct pki_bp bp;
	bool dead;		      /* nothing installed any more (thread exited, fork child) */
	unsigned long counted_closed; /* the kernel's count of roots closed so far */
	int nr_roots;
	struct wroot *roots;
	struct pk_watch *prev, *next;
};

/*
 * The slot table maps si_perf_data back to a watchpoint.  It is never freed
 * (chunks are allocated on demand and published with release), so the handler
 * may index it at any time.  sig_data = MAGIC << 48 | gen << 24 | index.
 */
#define SIG_MAGIC   0x504bULL /* "PK" */
#define SLOT_BITS   24
#define GEN_MASK    ((1U << 24) - 1)
#define CHUNK_SLOTS 256
#define NR_CHUNKS   256 /* 65536 watchpoints at once */

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
	pthread_mutex_t lock;
	bool handler_installed;
	int nr_all;
	struct pki_hist hist;  /* threads by own(), own > 0 only */
	struct pki_umap towns; /* tid -> struct town */
	size_t nr_idle;	       /* towns with own() == 0 */
	struct pk_watch *list;
	uint32_t nr_slots_used, free_slot; /* free list head, UINT32_MAX = empty */
	unsigned long removals;		   /* pk_watch_remove() calls so far */
} mgr = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .towns = PKI_UMAP_INIT(struct town, tid),
    .free_slot = UINT32_MAX,
};

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
#define SETTLE_RUN_NS 1000000
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
 * A hit the kernel could not deliver at once because the thread blocked
 * SIGTRAP comes when it unblocks, flagged TRAP_PERF_FLAG_ASYNC, with the
 * context of that moment: reported with PK_WATCH_HIT_LATE.  The hits that
 * came meanwhile were merged into it (one SIGTRAP pending at most): only the
 * kernel's count knows them (pk_watch_stats).
 */
/*
 * @w's condition on a hit of the hardware: NEW read now without faulting or
 * trapping again (process_vm_readv: a read by the kernel is not a user
 * access), OLD the value the previous hit saw.
 */
static bool hw_cond_pass(struct pk_watch *w, const struct pk_watch_hit *hit)
{
	uint64_t now = 0, before;

	if (!w->cond_values)
		return pki_watch_cond_pass_values(&w->cond, 0, 0, hit->tid, hit->ip, hit->uc);
	if (pki_peek((const void *)w->bp.addr, &now, w->bp.len))
		return true; /* unreadable: reported, not judged */
	before = atomic_exchange_explicit(&w->shadow, now, memory_order_relaxed);
	if (w->cond.changed && before == now)
		return false;
	return pki_watch_cond_pass_values(
	    &w->cond, pki_watch_value((const uint8_t *)&before, w->bp.len),
	    pki_watch_value((const uint8_t *)&now, w->bp.len), hit->tid, hit->ip, hit->uc);
}

static bool watch_sigtrap(int sig, siginfo_t *si, void *ucv)
{
	uint64_t data;
	uint32_t idx, gen;
	struct wslot *s;
	struct pk_watch *w;
	int saved_errno;

	(void)sig;
	if (si->si_code != TRAP_PERF || pki_si_perf_type(si) != PERF_TYPE_BREAKPOINT)
		return false;
	data = pki_si_perf_data(si);
	if ((data >> 48) != SIG_MAGIC)
		return false;
	idx = (uint32_t)data & ((1U << SLOT_BITS) - 1);
	gen = (uint32_t)(data >> SLOT_BITS) & GEN_MASK;
	if (idx >= (uint32_t)NR_CHUNKS * CHUNK_SLOTS || !(s = slot_at(idx)))
		return false;

	saved_errno = errno;
	atomic_fetch_add(&s->inflight, 1); /* H1 */
	w = atomic_load(&s->w);		   /* H2 */
	if (w && atomic_load(&s->gen) == gen) {
		ucontext_t *uc = ucv;
		struct pk_watch_hit hit = {
		    .watch = w,
		    .ctx = w->ctx,
		    .tid = (pid_t)syscall(SYS_gettid),
		    .addr = (uintptr_t)si->si_addr,
		    .ip = pki_uc_ip(uc),
		    .uc = uc,
		};

		if (cb_depth) {
			atomic_fetch_add_explicit(&w->self, 1, memory_order_relaxed);
		} else if (w->has_cond && !hw_cond_pass(w, &hit)) {
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

		pthread_mutex_lock(&mgr.lock);
		done = !mgr.list;
		installed = mgr.handler_installed;
		removals = mgr.removals;
		pthread_mutex_unlock(&mgr.lock);
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
		pthread_mutex_lock(&mgr.lock);
		if (mgr.removals == removals) {
			done = !mgr.list;
			if (done && mgr.handler_installed) {
				done = pki_sigtrap_client_drop(PKI_SIGTRAP_WATCH);
				mgr.handler_installed = !done;
			}
			pthread_mutex_unlock(&mgr.lock);
			return done;
		}
		pthread_mutex_unlock(&mgr.lock);
	}
	return false;
}

/* ---- slots -------------------------------------------------------------- */

static int __slot_get(uint32_t *idx)
{
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
	slot_at(idx)->next_free = mgr.free_slot;
	mgr.free_slot = idx;
}

static uint64_t slot_sig_data(uint32_t idx)
{
	uint32_t gen = atomic_load(&slot_at(idx)->gen) & GEN_MASK;

	return SIG_MAGIC << 48 | (uint64_t)gen << SLOT_BITS | idx;
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
	return pki_umap_find(&mgr.towns, (unsigned long)tid);
}

static int __own(pid_t tid)
{
	struct town *t = __town_find(tid);

	return t ? t->own : 0;
}

/* Make sure @tid has a record, before anything irreversible happens. */
static int __town_reserve(pid_t tid)
{
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
 * Close @w's events.  In the process that owns them they are disabled
 * first and their count is kept in counted_closed (pki_perf_bp_retire); a
 * fork child only closes its copies (@parents).
 */
static void __roots_close(struct pk_watch *w, bool parents)
{
	for (int i = 0; i < w->nr_roots; i++) {
		uint64_t n = 0;

		if (parents) {
			pki_perf_bp_close(w->roots[i].fd);
			continue;
		}
		pki_perf_bp_retire(w->roots[i].fd, &n);
		w->counted_closed += (unsigned long)n;
	}
	w->nr_roots = 0;
}

static void __close_roots(struct pk_watch *w)
{
	__roots_close(w, false);
}

/* Give back what @w holds in the accounting (it stays in the list). */
static void __unaccount(struct pk_watch *w)
{
	if (w->tid)
		__own_move(w->tid, -1);
	else
		mgr.nr_all--;
}

/*
 * Failure path only: single-thread watchpoints of exited threads give their
 * slots back.  Their handles stay valid (dead) until pk_watch_remove.
 * Returns how many were reaped.
 */
static int __reap_dead_threads(void)
{
	int n = 0;

	for (struct pk_watch *w = mgr.list; w; w = w->next) {
		if (w->dead || !w->tid || pki_thread_alive(w->tid))
			continue;
		pki_debug("watch %#lx: thread %d exited, its slot is free again\n",
			  (unsigned long)w->bp.addr, (int)w->tid);
		__close_roots(w);
		__unaccount(w);
		w->dead = true;
		n++;
	}
	return n;
}

static bool __fits(pid_t tid)
{
	if (tid)
		return mgr.nr_all + __own(tid) + 1 <= PKI_HWBP_SLOTS;
	return mgr.nr_all + 1 + pki_hist_max(&mgr.hist) <= PKI_HWBP_SLOTS;
}

/* Append a description of the watchpoints holding @tid's slots to @buf. */
static void __describe_holders(char *buf, size_t size, pid_t tid)
{
	size_t len = strlen(buf);

	for (struct pk_watch *w = mgr.list; w && len < size; w = w->next) {
		if (w->dead || w->page || (w->tid && w->tid != tid))
			continue;
		len += (size_t)snprintf(buf + len, size - len, "%s %s %#lx/%zu%s", len ? "," : "",
					type_name[w->bp.type], (unsigned long)w->bp.addr, w->bp.len,
					w->tid ? "" : " (all threads)");
	}
}

/* -ENOSPC with a message naming the full thread, or 0 if it fits after all. */
static int __admit(pid_t tid, const void *addr)
{
	char holders[512] = "";
	pid_t full = tid;

	if (__fits(tid) || (__reap_dead_threads() && __fits(tid)))
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
		    "watch %p: thread %d has no free debug register: %d all-threads + %d of its "
		    "own watchpoint(s) hold its %d slots:%s: %s\n",
		    addr, (int)full, mgr.nr_all, __own(full), PKI_HWBP_SLOTS, holders,
		    pki_errstr(ENOSPC));
	else
		pki_warn("watch %p: every thread is full: %d all-threads watchpoint(s) hold all %d "
			 "slots:%s: %s\n",
			 addr, mgr.nr_all, PKI_HWBP_SLOTS, holders, pki_errstr(ENOSPC));
	return -ENOSPC;
}

/* ---- adding ------------------------------------------------------------- */

static int check_target(const void *addr, size_t len, enum pk_watch_type type)
{
	uintptr_t a = (uintptr_t)addr;

	if (type != PK_WATCH_W && type != PK_WATCH_RW && type != PK_WATCH_X) {
		pki_warn("watch %p: unknown type %d (PK_WATCH_W, _RW or _X): %s\n", addr, (int)type,
			 pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (!a) {
		pki_warn("watch: NULL address: %s\n", pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (type == PK_WATCH_X ? len != 1 : !pki_hwbp_data_ok(a, len)) {
		pki_warn("watch %p: %s watchpoints take %s, not %zu byte(s) at this address: %s\n",
			 addr, type_name[type],
			 type == PK_WATCH_X ? "length 1" : "1, 2, 4 or 8 naturally aligned bytes",
			 len, pki_errstr(EINVAL));
		return -EINVAL;
	}
	return 0;
}

static int root_cmp(const void *a, const void *b)
{
	pid_t x = ((const struct wroot *)a)->tid, y = ((const struct wroot *)b)->tid;

	return (x > y) - (x < y);
}

static bool has_root(const struct pk_watch *w, int nr_sorted, pid_t tid)
{
	struct wroot key = {.tid = tid};

	if (nr_sorted && bsearch(&key, w->roots, (size_t)nr_sorted, sizeof(key), root_cmp))
		return true;
	for (int i = nr_sorted; i < w->nr_roots; i++)
		if (w->roots[i].tid == tid)
			return true;
	return false;
}

static int add_root(struct pk_watch *w, int *cap, pid_t tid)
{
	int fd;

	if (w->nr_roots == *cap) {
		int n = *cap ? *cap * 2 : 16;
		struct wroot *r = realloc(w->roots, (size_t)n * sizeof(*r));

		if (!r)
			return -ENOMEM;
		w->roots = r;
		*cap = n;
	}
	fd = pki_perf_bp_open(&w->bp, tid);
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
		pki_warn("watch %#lx: perf_event_open on thread %d: %s\n",
			 (unsigned long)w->bp.addr, (int)tid, pki_errstr(fd));
		return fd;
	}
	w->roots[w->nr_roots].tid = tid;
	w->roots[w->nr_roots].fd = fd;
	w->nr_roots++;
	return 1;
}

/* __open_all_roots() across its passes over the threads (pki_threads_each()). */
struct roots_pass {
	struct pk_watch *w;
	int cap;    /* of w->roots */
	int sorted; /* w->roots[0 .. sorted) are sorted by tid */
	int added;  /* this pass */
	bool failed;
};

static int roots_add(pid_t tid, void *arg)
{
	struct roots_pass *p = arg;
	int r;

	if (has_root(p->w, p->sorted, tid))
		return 0;
	r = add_root(p->w, &p->cap, tid);
	if (r < 0) {
		p->failed = true;
		return r;
	}
	p->added += r;
	return 0;
}

/*
 * One root per thread alive now.  Called with the thread-creation gate
 * closed (gate.c): no pthread_create() is in flight, so the first pass lists
 * every thread, and a thread created after the gate opens inherits from its
 * creator's root.  The listing is still repeated until a pass adds nothing,
 * for threads the gate does not see (a raw clone(), a library's call bound
 * to libc's pthread_create): for those the old residual races remain, a
 * thread inside clone() during the last pass not covered, or one created
 * after its creator's root and listed later given a second event.
 */
static int __open_all_roots(struct pk_watch *w)
{
	struct roots_pass p = {.w = w};
	int err;

	do {
		p.added = 0;
		err = pki_threads_each(0, roots_add, &p);
		if (err && !p.failed)
			pki_warn("watch %#lx: cannot list threads: /proc/self/task: %s\n",
				 (unsigned long)w->bp.addr, pki_errstr(err));
		if (err)
			return err;
		qsort(w->roots, (size_t)w->nr_roots, sizeof(*w->roots), root_cmp);
		p.sorted = w->nr_roots;
	} while (p.added);
	return 0;
}

static void fork_child(void);
static void fork_prepare(void)
{
	pthread_mutex_lock(&mgr.lock);
	__pki_page_fork_prepare();
}
static void fork_parent(void)
{
	__pki_page_fork_parent();
	pthread_mutex_unlock(&mgr.lock);
}
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* @opts as this library knows them into @o (the defaults if NULL). */
static int opts_get(const void *addr, const struct pk_watch_opts *opts, struct pk_watch_opts *o)
{
	*o = (struct pk_watch_opts){.sz = sizeof(*o)};
	if (!opts)
		return 0;
	if (opts->sz < offsetof(struct pk_watch_opts, disabled) + sizeof(bool)) {
		pki_warn("watch %p: opts->sz %zu is too small (use PK_OPTS): %s\n", addr, opts->sz,
			 pki_errstr(EINVAL));
		return -EINVAL;
	}
	/* a newer caller's fields we do not know must be zero */
	for (size_t i = sizeof(*o); i < opts->sz; i++)
		if (((const char *)opts)[i]) {
			pki_warn("watch %p: opts has fields this library does not know "
				 "(sz %zu > %zu): %s\n",
				 addr, opts->sz, sizeof(*o), pki_errstr(EINVAL));
			return -EINVAL;
		}
	memcpy(o, opts, sizeof(*o) < opts->sz ? sizeof(*o) : opts->sz);
	return 0;
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
 * another word than the one it writes, to test the refusal (README).
 */
static struct {
	int delivered; /* under mgr.lock; a fork child keeps it */
	bool pretend;
} hw = {.delivered = -1};

/* 1 delivered, 0 not, -1 nothing concluded (the check could not open its event). */
static int __delivered(void)
{
	if (hw.delivered < 0) {
		const char *e = getenv("PROBEKIT_HWBP_UNDELIVERED");

		hw.pretend = e && *e && strcmp(e, "0");
		hw.delivered = pki_perf_bp_delivered(hw.pretend);
	}
	return hw.delivered;
}

static int __check_delivered(const void *addr)
{
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
	const char *why;

	if (type == PK_WATCH_X || o->tid)
		return PK_WATCH_MODE_HW;
	if (!pki_hwbp_data_ok((uintptr_t)addr, len))
		why = "longer or less aligned than a debug register takes";
	else if (!__delivered())
		why = "hardware breakpoints are not delivered on this machine";
	else if (mgr.hist.count && !__fits(0) && !(__reap_dead_threads() && __fits(0)))
		why = "every debug register is taken";
	else
		return PK_WATCH_MODE_HW;
	pki_debug("watch %p/%zu: page mode: %s\n", addr, len, why);
	return PK_WATCH_MODE_PAGE;
}

/* The manager ready, and room for one more watchpoint on @tid (0: all threads). */
static int __watch_admit(pid_t tid, const void *addr)
{
	int err;

	if (!mgr.hist.count && pki_hist_init(&mgr.hist, PKI_HWBP_SLOTS))
		return -ENOMEM;
	err = __check_delivered(addr);
	if (!err)
		err = __install_handler();
	if (!err)
		err = __admit(tid, addr);
	if (!err && tid)
		err = __town_reserve(tid);
	return err;
}

/* @c (checked already) into @w, with the value OLD starts from. */
static void watch_cond_set(struct pk_watch *w, const void *addr, size_t len,
			   enum pk_watch_type type, const struct pk_watch_cond *c)
{
	uint64_t v = 0;

	if (!c || !pki_watch_cond_any(c))
		return;
	w->cond = *c;
	w->has_cond = true;
	w->cond_values = type != PK_WATCH_X;
	if (w->cond_values && len <= sizeof(v) && !pki_peek(addr, &v, len))
		atomic_store(&w->shadow, v);
}

/*
 * A new watchpoint in a slot of its own, published to the handler before
 * its first event exists, so that no early hit is lost.
 */
static int __watch_new(const void *addr, size_t len, enum pk_watch_type type,
		       const struct pk_watch_opts *o, struct pk_watch **wp)
{
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
	watch_cond_set(w, addr, len, type, o->cond);
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
	atomic_store(&slot_at(idx)->w, w);
	*wp = w;
	return 0;
}

/* The root events of @w: on its one thread, or on every thread alive now. */
static int __watch_open(struct pk_watch *w)
{
	int cap = 0, err;

	if (!w->tid) {
		pki_gate_close(); /* no thread is being created meanwhile: gate.c */
		err = __open_all_roots(w);
		pki_gate_open();
		return err;
	}
	err = add_root(w, &cap, w->tid);
	if (!err) {
		/* exited between the check and the open */
		pki_warn("watch %#lx: thread %d exited: %s\n", (unsigned long)w->bp.addr,
			 (int)w->tid, pki_errstr(ESRCH));
		err = -ESRCH;
	}
	return err < 0 ? err : 0;
}

/* Free @w, which failed to open: nobody saw it but the handler (R1-R4). */
static void __watch_discard(struct pk_watch *w)
{
	slot_unpublish(w->slot);
	__close_roots(w);
	slot_wait_idle(w->slot);
	__slot_put(w->slot);
	free(w->roots);
	free(w);
}

/* Count @w in the admission and list it. */
static void __watch_account(struct pk_watch *w)
{
	if (w->tid)
		__own_move(w->tid, +1);
	else
		mgr.nr_all++;
	w->next = mgr.list;
	if (mgr.list)
		mgr.list->prev = w;
	mgr.list = w;
}

/* A watchpoint in page mode (page.c); on the list, outside the slot model. */
static int __watch_add_page(const void *addr, size_t len, enum pk_watch_type type,
			    const struct pk_watch_opts *o, struct pk_watch **wp)
{
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
	struct pk_watch_opts o;
	struct pk_watch *w;
	int err;

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
		pthread_mutex_lock(&mgr.lock);
		if (o.mode == PK_WATCH_MODE_AUTO)
			o.mode = __auto_mode(addr, len, type, &o);
		if (o.mode == PK_WATCH_MODE_PAGE) {
			err = page_check(addr, len, type);
			if (!err)
				err = __watch_add_page(addr, len, type, &o, &w);
			pthread_mutex_unlock(&mgr.lock);
			if (err)
				goto out_errno;
			return w;
		}
		pthread_mutex_unlock(&mgr.lock);
	}
	err = watch_check(addr, len, type, &o);
	if (err)
		goto out_errno;

	pthread_mutex_lock(&mgr.lock);
	err = __watch_admit(o.tid, addr);
	if (!err)
		err = __watch_new(addr, len, type, &o, &w);
	if (err)
		goto out_unlock;
	err = __watch_open(w);
	if (err) {
		__watch_discard(w);
		goto out_unlock;
	}
	__watch_account(w);
	pki_debug("watch %p: %s/%zu on %s%d, %d root event(s)\n", addr, type_name[type], len,
		  o.tid ? "thread " : "all threads of ", o.tid ? (int)o.tid : (int)getpid(),
		  w->nr_roots);
	pthread_mutex_unlock(&mgr.lock);
	return w;

out_unlock:
	pthread_mutex_unlock(&mgr.lock);
out_errno:
	errno = -err;
	return NULL;
}

/* ---- the rest of the life cycle ----------------------------------------- */

PK_API void pk_watch_remove(struct pk_watch *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&mgr.lock);
	if (w->prev)
		w->prev->next = w->next;
	else
		mgr.list = w->next;
	if (w->next)
		w->next->prev = w->prev;
	if (w->page) {
		__pki_page_remove(w->page);
		mgr.removals++;
		pthread_mutex_unlock(&mgr.lock);
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
	pthread_mutex_unlock(&mgr.lock);
	free(w->roots); /* R4 */
	free(w);
}

static int __live(struct pk_watch *w)
{
	if (!w->dead && w->tid && !pki_thread_alive(w->tid)) {
		__close_roots(w);
		__unaccount(w);
		w->dead = true;
	}
	return w->dead || !w->nr_roots ? -ESRCH : 0;
}

static int set_enabled(struct pk_watch *w, bool on)
{
	int err;

	if (!w) {
		pki_warn("watch: NULL watchpoint: %s\n", pki_errstr(EINVAL));
		return -EINVAL;
	}
	pthread_mutex_lock(&mgr.lock);
	if (w->page) {
		__pki_page_enable(w->page, on);
		pthread_mutex_unlock(&mgr.lock);
		return 0;
	}
	err = __live(w);
	for (int i = 0; !err && i < w->nr_roots; i++)
		err = pki_perf_bp_enable(w->roots[i].fd, on);
	if (!err)
		w->bp.disabled = !on;
	else if (err != -ESRCH)
		pki_warn("watch %#lx: cannot %s: %s\n", (unsigned long)w->bp.addr,
			 on ? "enable" : "disable", pki_errstr(err));
	pthread_mutex_unlock(&mgr.lock);
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

PK_API int pk_watch_modify(struct pk_watch *w, const void *addr, size_t len,
			   enum pk_watch_type type)
{
	struct pki_bp old, new;
	int err, i;

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
	err = check_target(addr, len, type);
	if (err)
		return err;
	pthread_mutex_lock(&mgr.lock);
	err = __live(w);
	if (err)
		goto out;
	old = new = w->bp;
	new.addr = (uintptr_t)addr;
	new.len = len;
	new.type = type;
	/* x86: one pool for code and data, so the slot count does not change */
	for (i = 0; i < w->nr_roots; i++) {
		err = pki_perf_bp_modify(w->roots[i].fd, &new);
		if (err)
			break;
	}
	if (err) {
		pki_warn("watch %#lx: cannot move to %p %s/%zu (thread %d): %s\n",
			 (unsigned long)old.addr, addr, type_name[type], len, (int)w->roots[i].tid,
			 pki_errstr(err));
		while (i-- > 0)
			pki_perf_bp_modify(w->roots[i].fd, &old);
		goto out;
	}
	w->bp = new;
out:
	pthread_mutex_unlock(&mgr.lock);
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

	if (!w || !st || st->sz < offsetof(struct pk_watch_stats, unseen) + sizeof(st->unseen))
		return -EINVAL;
	pthread_mutex_lock(&mgr.lock);
	if (w->page) {
		__pki_page_stats(w->page, &s);
		pthread_mutex_unlock(&mgr.lock);
		memcpy(st, &s, st->sz < sizeof(s) ? st->sz : sizeof(s));
		st->sz = st->sz < sizeof(s) ? st->sz : sizeof(s);
		return 0;
	}
	s.counted = w->counted_closed;
	for (int i = 0; i < w->nr_roots; i++) {
		uint64_t n;

		if (!pki_perf_bp_count(w->roots[i].fd, &n))
			s.counted += (unsigned long)n;
	}
	/* Read after the kernel's count: a hit is counted before it is delivered. */
	s.hits = atomic_load(&w->hits);
	s.late = atomic_load(&w->late);
	s.self = atomic_load(&w->self);
	s.filtered = atomic_load(&w->filtered);
	pthread_mutex_unlock(&mgr.lock);
	seen = s.hits + s.self + s.filtered;
	s.unseen = s.counted > seen ? s.counted - seen : 0;
	memcpy(st, &s, st->sz < sizeof(s) ? st->sz : sizeof(s));
	st->sz = st->sz < sizeof(s) ? st->sz : sizeof(s);
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
	pthread_mutex_unlock(&mgr.lock);
}

int pki_watch_page_mprotect(void *addr, size_t len, int prot)
{
	int err;

	pthread_mutex_lock(&mgr.lock);
	err = __pki_page_mprotect(addr, len, prot);
	pthread_mutex_unlock(&mgr.lock);
	return err;
}
