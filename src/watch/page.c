// SPDX-License-Identifier: MIT
/*
 * Page-protection watchpoints: the regions, their conversion to an alias
 * (PW2) and back (PW3), the SIGSEGV client that runs a faulting access as a
 * redirected step (PW4) or a windowed one (PW5), the SIGTRAP client that
 * ends the step and reports, and the fork handlers (PW8).  The protocol and
 * its argument are in doc/design/page-watch.md; the labels are its.
 *
 * What runs where:
 *   pk_watch_* (normal context, watch.c's lock held)  everything named __*
 *   SIGSEGV client (page_segv), SIGTRAP client (page_trap): atomics, futex,
 *	memcpy, mprotect (windowed steps only), gettid: async-signal-safe.
 *   pki_page_overlaps, pki_page_transfer (PW6: the agent's wrappers of the
 *	calls that move a buffer, any thread, signal handlers too): the same,
 *	with the step lock taken as a handler takes it, signals blocked.
 *
 * Region slots, their code slots and the `seen` pages are static and never
 * freed: a handler may index them at any time.  What a region points to
 * (its alias, its watches) is reached only between `inflight` up and down,
 * and freed only after removal saw `inflight` at zero with the region
 * unpublished (PW4, "Why a thread cannot be inside a freed region"); a
 * watch also while a hit of it is counted in its `users`, which is how its
 * callbacks run: after the handler left the region (PW4, "Why a removed
 * watch is not used after its record is freed").
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <probekit/watch.h>

#include "arch/arch.h"
#include "base/futex.h"
#include "base/handler_data.h"
#include "base/held.h"
#include "base/log.h"
#include "base/maps.h"
#include "base/siglock.h"
#include "base/sigown.h"
#include "watch/cond.h"
#include "watch/page.h"
#include "watch/watch_int.h"

#define NR_REGIONS     64 /* page runs watched at once */
#define REGION_WATCHES 16 /* watches sharing one run */
#define CODE_SLOT      64 /* bytes of step code per region */
#define NR_SEEN	       4096
#define MAX_STEP_HITS  (2 * REGION_WATCHES)

enum { R_FREE, R_CONVERTING, R_LIVE, R_REVERTING };

struct pki_pwatch {
	struct pk_watch *owner;
	uintptr_t addr;
	size_t len;
	bool rw; /* reads too (PK_WATCH_RW), not only writes */
	pk_watch_cb cb;
	void *ctx;
	struct pk_hitq *queue;
	atomic_bool enabled;
	atomic_ulong hits, self, windowed, filtered;
	atomic_uint users; /* hits of it taken under the step lock, not yet delivered */
	bool has_cond;
	struct pk_watch_cond cond; /* a copy: on this record's own page, as all it holds */
	int reg;		   /* its region, -1 once dead (fork child) */
	bool dead;		   /* under the manager's lock */
};

/* A step in progress on a region (PW4): owned by the thread holding `lock`. */
struct step {
	bool windowed;
	int other; /* the second region the instruction reaches, or -1 */
	uintptr_t ip;
	uintptr_t fault; /* si_addr */
	struct pki_access_insn ai;
	struct pki_access_undo undo;
	uintptr_t lo[2]; /* program addresses the moved accesses start at */
	int reg[2];	 /* region of access i, -1 if not moved */
	sigset_t mask;	 /* the thread's mask at the fault */
};

struct region {
	/* Read by handlers. */
	_Atomic uintptr_t va, end; /* [va, end); va is published last, cleared first */
	_Atomic uint32_t state;	   /* R_*, a futex word */
	atomic_uint inflight;	   /* handlers between region_enter and region_leave */
	_Atomic uint32_t lock;	   /* the step lock: 0 free, 1 held, 2 held with waiters */
	uint8_t *alias;		   /* RW view of [va, end), written before publication */
	uint8_t *before;	   /* bytes before the step, at the same offsets */
	_Atomic(struct pki_pwatch *) w[REGION_WATCHES];
	atomic_int prot_watch; /* PROT_NONE, or PROT_READ for writes only */
	uint8_t *prog;	       /* PW8: the program's protection of each page */
	struct step step;      /* under `lock` */

	/* Under the manager's lock. */
	int nw;
	unsigned long ino;
	unsigned int dev_major, dev_minor;
	uint8_t *snap; /* fork: the pages as they were, for the child */
};

/*
 * What the handlers read, in pages of its own (base/handler_data.h).
 * Region slots, code slots and `seen` are never freed.
 */
static struct PKI_HANDLER_PAGES {
	struct region regions[NR_REGIONS];
	/* Step code: one slot per region, written through code_rw, run at code_rx. */
	uint8_t *code_rw;
	_Atomic uintptr_t code_rx;
	/* Pages ever watched (page numbers), append-only: PW3's late faults. */
	_Atomic uintptr_t seen[NR_SEEN];
	atomic_uint nr_seen;
	atomic_uint live;   /* regions published (va set): 0, no system call is bounced */
	atomic_uint unmade; /* regions unpublished so far (PW3: late faults) */
	/* PW2 1a: the program's mprotect calls that found no region, by phase */
	atomic_uint native[2], native_phase;
	bool shstk; /* the threads have a shadow stack: no call is emulated */
	size_t page_size;
} P;

/* The step this thread is in (region index), -1 if none. */
static __thread int step_region __attribute__((tls_model("initial-exec"))) = -1;
/* Depth of callbacks running on this thread: their accesses are `self`. */
static __thread unsigned int cb_depth __attribute__((tls_model("initial-exec")));
/*
 * PW3: the last address retried with no region to explain its fault, the
 * stack pointer of the code that faulted (which frame: nested handlers of
 * the program's may each hold a fault at the same address), and how many
 * regions had been unpublished then (P.unmade).
 */
static __thread uintptr_t retried __attribute__((tls_model("initial-exec")));
static __thread uintptr_t retried_sp __attribute__((tls_model("initial-exec")));
static __thread unsigned int retried_gen __attribute__((tls_model("initial-exec")));

/*
 * PW8: the thread inside fork(), between the prepare handler and the parent
 * or child one, holds every region's step lock: its own accesses to the
 * pages meanwhile (later prepare handlers, libc's own fork work) run
 * without taking them, and in the child, before its handler, the first one
 * gives the child its private pages.  `fork_pid` is the parent's pid.
 */
static __thread bool fork_holder __attribute__((tls_model("initial-exec")));
static pid_t fork_pid;

static bool clients_added;

static size_t page_size(void)
{
	if (!P.page_size)
		P.page_size = (size_t)sysconf(_SC_PAGESIZE);
	return P.page_size;
}

/* ---- the step lock (a futex mutex; async-signal-safe) -------------------- */

static void step_lock(struct region *r)
{
	uint32_t c = 0;

	if (fork_holder)
		return; /* held since fork's prepare handler */
	if (atomic_compare_exchange_strong(&r->lock, &c, 1))
		return;
	if (c != 2)
		c = atomic_exchange(&r->lock, 2);
	while (c) {
		pki_futex_wait(&r->lock, 2, NULL);
		c = atomic_exchange(&r->lock, 2);
	}
}

static void step_unlock(struct region *r)
{
	if (fork_holder)
		return;
	if (atomic_exchange(&r->lock, 0) == 2)
		pki_futex_wake(&r->lock, 1);
}

/* ---- finding a region from a handler ------------------------------------- */

/*
 * The region containing @a, counted in its `inflight` (H1 of watch.c's
 * protocol: the increment, then the loads, all seq_cst), or -1.
 */
static int region_enter(uintptr_t a)
{
	for (int i = 0; i < NR_REGIONS; i++) {
		struct region *r = &P.regions[i];

		if (!atomic_load_explicit(&r->end, memory_order_relaxed))
			continue;
		atomic_fetch_add(&r->inflight, 1);
		uintptr_t va = atomic_load(&r->va), end = atomic_load(&r->end);

		if (va && va <= a && a < end)
			return i;
		atomic_fetch_sub(&r->inflight, 1);
	}
	return -1;
}

static void region_leave(int i)
{
	atomic_fetch_sub(&P.regions[i].inflight, 1);
}

static bool page_seen(uintptr_t a)
{
	uintptr_t pg = a / page_size();
	unsigned int n = atomic_load(&P.nr_seen);

	for (unsigned int i = 0; i < n && i < NR_SEEN; i++)
		if (atomic_load_explicit(&P.seen[i], memory_order_relaxed) == pg)
			return true;
	return false;
}

/* Normal context, under the manager's lock. */
static void __seen_add(uintptr_t lo, uintptr_t hi)
{
	PKI_HELD(pki_watch_mgr_lock);
	for (uintptr_t a = lo; a < hi; a += page_size()) {
		unsigned int n = atomic_load(&P.nr_seen);

		if (page_seen(a) || n >= NR_SEEN)
			continue;
		atomic_store(&P.seen[n], a / page_size());
		atomic_store(&P.nr_seen, n + 1);
	}
}

/* ---- the program's protection (PW8) --------------------------------------- */

/* The protection page @pg of region @r has: the program's, less what the watch takes. */
static int page_prot(const struct region *r, size_t pg)
{
	return r->prog[pg] & (atomic_load(&r->prot_watch) | PROT_EXEC);
}

/* Page @pg's protection: @open (a windowed step), the program's alone; else page_prot. */
static int pages_prot(const struct region *r, size_t pg, bool open)
{
	return open ? r->prog[pg] : page_prot(r, pg);
}

/*
 * Pages [@from, @to) of @r (clamped) at pages_prot, a run of equal ones per
 * mprotect.  Under the step lock or the manager's: async-signal-safe.  0,
 * or the first mprotect's -errno.
 */
static int protect_pages(const struct region *r, size_t from, size_t to, bool open)
{
	uintptr_t va = atomic_load_explicit(&r->va, memory_order_relaxed);
	size_t n = (atomic_load_explicit(&r->end, memory_order_relaxed) - va) / page_size();
	int err = 0;

	if (to > n)
		to = n;
	for (size_t i = from, j; i < to; i = j) {
		for (j = i + 1; j < to && pages_prot(r, j, open) == pages_prot(r, i, open);)
			j++;
		if (mprotect((void *)(va + i * page_size()), (j - i) * page_size(),
			     pages_prot(r, i, open)) &&
		    !err)
			err = -errno;
	}
	return err;
}

/*
 * Does the program's protection of @a's page allow the access (a write, or
 * a read)?  On x86 a page the program can write or execute it can read too
 * (the page tables have no write-only page; an execute-only one needs a
 * protection key, and is taken as readable here).
 */
static bool prog_allows(const struct region *r, uintptr_t a, bool write)
{
	uint8_t p = r->prog[(a - atomic_load(&r->va)) / page_size()];

	return write ? p & PROT_WRITE : p & (PROT_READ | PROT_WRITE | PROT_EXEC);
}

/* ---- reporting ------------------------------------------------------------ */

struct span {
	uintptr_t lo, hi; /* program addresses the access touched */
	bool read, write;
	int reg;
};

/* The bytes access @i of the step touched (all its iterations for a string op). */
static struct span step_span(const struct step *s, int i, unsigned long iters)
{
	const struct pki_access *a = &s->ai.acc[i];
	uintptr_t n = (uintptr_t)a->size * (iters ? iters : 1);
	struct span sp = {.read = a->read, .write = a->write, .reg = s->reg[i]};

	if (a->dir < 0) {
		sp.hi = s->lo[i] + a->size;
		sp.lo = sp.hi - n;
	} else {
		sp.lo = s->lo[i];
		sp.hi = sp.lo + n;
	}
	return sp;
}

/* The bytes of @sp in region @ri, before the step, into its `before` copy. */
static void save_before(int ri, uintptr_t lo, uintptr_t hi)
{
	struct region *r = &P.regions[ri];
	uintptr_t va = atomic_load_explicit(&r->va, memory_order_relaxed);
	uintptr_t end = atomic_load_explicit(&r->end, memory_order_relaxed);

	if (lo < va)
		lo = va;
	if (hi > end)
		hi = end;
	if (lo < hi)
		memcpy(r->before + (lo - va), r->alias + (lo - va), hi - lo);
}

/* A hit of @pw for the bytes [lo, hi) of an access, if it touched its range. */
static bool make_hit(struct pki_pwatch *pw, const struct region *r, uintptr_t lo, uintptr_t hi,
		     unsigned int flags, struct pk_watch_hit *h)
{
	uintptr_t va = atomic_load_explicit(&r->va, memory_order_relaxed);
	uintptr_t a = lo > pw->addr ? lo : pw->addr;
	uintptr_t b = hi < pw->addr + pw->len ? hi : pw->addr + pw->len;
	size_t n;

	if (a >= b || !atomic_load_explicit(&pw->enabled, memory_order_relaxed))
		return false;
	if (!pw->rw && !(flags & PK_WATCH_HIT_WRITE))
		return false;
	memset(h, 0, sizeof(*h));
	h->sz = sizeof(*h);
	h->watch = pw->owner;
	h->ctx = pw->ctx;
	h->addr = a;
	h->off = (uint32_t)(a - pw->addr);
	h->len = (uint32_t)(b - a);
	h->flags = flags | PK_WATCH_HIT_PAGE;
	n = b - a < PK_WATCH_HIT_BYTES ? b - a : PK_WATCH_HIT_BYTES;
	memcpy(h->before, r->before + (a - va), n);
	memcpy(h->after, r->alias + (a - va), n);
	return true;
}

/* The hits of one access span, appended to @hits. */
static int span_hits(const struct span *sp, unsigned int extra, struct pk_watch_hit *hits, int nh,
		     struct pki_pwatch **who)
{
	const struct region *r = &P.regions[sp->reg];
	unsigned int flags = extra;

	if (sp->read)
		flags |= PK_WATCH_HIT_READ;
	if (sp->write)
		flags |= PK_WATCH_HIT_WRITE;
	for (int k = 0; k < REGION_WATCHES && nh < MAX_STEP_HITS; k++) {
		struct pki_pwatch *pw = atomic_load(&r->w[k]);

		if (pw && make_hit(pw, r, sp->lo, sp->hi, flags, &hits[nh])) {
			/* PW3: removal waits for it (pwatch_unpublish) */
			atomic_fetch_add(&pw->users, 1);
			who[nh++] = pw;
		}
	}
	return nh;
}

/* A windowed step's hits: what changed in each watch of the region, else a read. */
static int windowed_hits(const struct step *s, int ri, struct pk_watch_hit *hits,
			 struct pki_pwatch **who)
{
	const struct region *r = &P.regions[ri];
	uintptr_t va = atomic_load_explicit(&r->va, memory_order_relaxed);
	int nh = 0;

	for (int k = 0; k < REGION_WATCHES && nh < MAX_STEP_HITS; k++) {
		struct pki_pwatch *pw = atomic_load(&r->w[k]);
		struct span sp = {.reg = ri};
		uintptr_t a, b;

		if (!pw)
			continue;
		a = pw->addr > va ? pw->addr : va;
		b = pw->addr + pw->len;
		if (b > atomic_load_explicit(&r->end, memory_order_relaxed))
			b = atomic_load_explicit(&r->end, memory_order_relaxed);
		for (uintptr_t x = a; x < b; x++)
			if (r->before[x - va] != r->alias[x - va]) {
				if (!sp.lo)
					sp.lo = x;
				sp.hi = x + 1;
			}
		if (sp.lo) {
			sp.write = true;
		} else {
			sp.lo = s->fault;
			sp.hi = s->fault + 1;
			sp.read = true;
		}
		nh = span_hits(&sp, PK_WATCH_HIT_WINDOWED, hits, nh, who);
	}
	return nh;
}

static void deliver_one(struct pki_pwatch *pw, struct pk_watch_hit *h, ucontext_t *uc)
{
	if (cb_depth) {
		atomic_fetch_add_explicit(&pw->self, 1, memory_order_relaxed);
		return;
	}
	if (pw->has_cond &&
	    !pki_watch_cond_pass(&pw->cond, h->before, h->after, h->len, h->tid, h->ip, uc)) {
		atomic_fetch_add_explicit(&pw->filtered, 1, memory_order_relaxed);
		return;
	}
	atomic_fetch_add_explicit(&pw->hits, 1, memory_order_relaxed);
	cb_depth++;
	if (pw->cb) {
		h->uc = uc;
		pw->cb(h);
	}
	if (pw->queue) {
		h->uc = NULL;
		pk_hitq_push(pw->queue, h);
	}
	cb_depth--;
}

/* The hits span_hits took, reported (or counted) and their watches let go. */
static void deliver(struct pk_watch_hit *hits, struct pki_pwatch **who, int nh, pid_t tid,
		    uintptr_t ip, ucontext_t *uc)
{
	for (int i = 0; i < nh; i++) {
		hits[i].tid = tid;
		hits[i].ip = ip;
		deliver_one(who[i], &hits[i], uc);
		atomic_fetch_sub(&who[i]->users, 1);
	}
}

/* ---- system calls (PW6) ---------------------------------------------------- */

static bool lock_regions(int home, int other);
static void fork_snap_refresh(int home, int other);

bool pki_page_overlaps(const void *p, size_t n)
{
	uintptr_t lo = (uintptr_t)p, hi = lo + n < lo ? UINTPTR_MAX : lo + n;

	if (!n || !atomic_load_explicit(&P.live, memory_order_acquire))
		return false;
	for (int i = 0; i < NR_REGIONS; i++) {
		uintptr_t va = atomic_load(&P.regions[i].va), end = atomic_load(&P.regions[i].end);

		if (va && lo < end && va < hi)
			return true;
	}
	return false;
}

/* Where the first region at or after @a begins, before @end; @end if none. */
static uintptr_t next_region(uintptr_t a, uintptr_t end)
{
	for (int i = 0; i < NR_REGIONS; i++) {
		uintptr_t va = atomic_load(&P.regions[i].va);

		if (va && va > a && va < end)
			end = va;
	}
	return end;
}

/*
 * [a, b) of the program's memory outside every region, to or from @bounce:
 * through the kernel, which says EFAULT where the system call would have.
 * The bytes copied.
 */
static size_t copy_unwatched(uintptr_t a, uintptr_t b, uint8_t *bounce, bool into_prog)
{
	struct iovec mine = {bounce, b - a}, prog = {(void *)a, b - a};
	ssize_t k = into_prog ? process_vm_writev(getpid(), &mine, 1, &prog, 1, 0)
			      : process_vm_readv(getpid(), &mine, 1, &prog, 1, 0);

	return k > 0 ? (size_t)k : 0;
}

/*
 * [a, b) of region @ri to or from @bounce through its alias, under its step
 * lock with the signals blocked (a handler of this thread may touch the
 * pages, and would wait for this very lock), and its hits into @hits.  As
 * far as the program's protection allows the access (PW8: the kernel's
 * copy stops with EFAULT at a page the program made read-only or
 * inaccessible).  The bytes moved, or -1 if the region is not LIVE (being
 * made or given back): try again.
 */
static ssize_t copy_watched(int ri, uintptr_t a, uintptr_t b, uint8_t *bounce, bool into_prog,
			    struct pk_watch_hit *hits, struct pki_pwatch **who, int *nh)
{
	struct region *r = &P.regions[ri];
	uint8_t *alias = r->alias + (a - atomic_load(&r->va));
	struct span sp = {.lo = a, .hi = b, .read = !into_prog, .write = into_prog, .reg = ri};
	sigset_t saved;

	pki_siglock_block(&saved);
	if (!lock_regions(ri, -1)) {
		pthread_sigmask(SIG_SETMASK, &saved, NULL);
		return -1;
	}
	for (sp.hi = a; sp.hi < b && prog_allows(r, sp.hi, into_prog);)
		sp.hi = (sp.hi | (page_size() - 1)) + 1;
	if (sp.hi > b)
		sp.hi = b;
	*nh = 0;
	if (sp.hi > a) {
		save_before(ri, a, sp.hi);
		if (into_prog)
			memcpy(alias, bounce, sp.hi - a);
		else
			memcpy(bounce, alias, sp.hi - a);
		*nh = span_hits(&sp, PK_WATCH_HIT_SYSCALL, hits, 0, who);
		if (into_prog && fork_holder) /* a fork handler's call: the child's copy too */
			fork_snap_refresh(ri, -1);
	}
	step_unlock(r);
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	return (ssize_t)(sp.hi - a);
}

size_t pki_page_transfer(void *prog, void *bounce, size_t n, bool into_prog, uintptr_t ip,
			 bool report)
{
	uintptr_t a = (uintptr_t)prog, end = a + n;
	uint8_t *b = bounce;
	pid_t tid = (pid_t)syscall(SYS_gettid);

	while (a < end) {
		struct pk_watch_hit hits[MAX_STEP_HITS];
		struct pki_pwatch *who[MAX_STEP_HITS];
		int ri = region_enter(a), nh = 0;
		uintptr_t hi;
		ssize_t k;

		if (ri < 0) {
			size_t k;

			hi = next_region(a, end);
			k = copy_unwatched(a, hi, b, into_prog);
			if (k < hi - a)
				return a + k - (uintptr_t)prog;
			b += k;
			a = hi;
			continue;
		}
		hi = atomic_load(&P.regions[ri].end);
		if (hi > end)
			hi = end;
		k = copy_watched(ri, a, hi, b, into_prog, hits, who, &nh);
		if (k < 0) {
			region_leave(ri);
			sched_yield();
			continue;
		}
		region_leave(ri); /* before the callbacks (PW3) */
		if (report) {
			deliver(hits, who, nh, tid, ip, NULL);
		} else {
			for (int i = 0; i < nh; i++) {
				atomic_fetch_add_explicit(&who[i]->self, 1, memory_order_relaxed);
				atomic_fetch_sub(&who[i]->users, 1);
			}
		}
		if (a + (size_t)k < hi) /* the program's protection refused the rest */
			return a + (size_t)k - (uintptr_t)prog;
		b += hi - a;
		a = hi;
	}
	return n;
}

size_t pki_page_reach(const void *p, size_t n, bool write)
{
	uintptr_t a = (uintptr_t)p, end = a + n < a ? UINTPTR_MAX : a + n;

	while (a < end) {
		int ri = region_enter(a);
		uintptr_t hi;

		if (ri < 0) {
			a = next_region(a, end);
			continue;
		}
		hi = atomic_load(&P.regions[ri].end);
		if (hi > end)
			hi = end;
		while (a < hi && prog_allows(&P.regions[ri], a, write))
			a = (a | (page_size() - 1)) + 1;
		region_leave(ri);
		if (a < hi)
			return a - (uintptr_t)p;
	}
	return n;
}

/* ---- the program's mprotect (PW8) ----------------------------------------- */

/*
 * The region's part of [@lo, @hi) at the program's @prot, under its step
 * lock.  0, or the kernel's -errno (ENOMEM: too many mappings).
 */
static int __region_mprotect(int ri, uintptr_t lo, uintptr_t hi, int prot)
{
	PKI_HELD(pki_watch_mgr_lock);
	struct region *r = &P.regions[ri];
	uintptr_t va = atomic_load(&r->va);
	size_t from = (lo - va) / page_size(), to = (hi - va) / page_size();
	sigset_t saved;
	int err;

	pki_siglock_block(&saved);
	step_lock(r);
	memset(r->prog + from, prot & (PROT_READ | PROT_WRITE | PROT_EXEC), to - from);
	err = protect_pages(r, from, to, false);
	step_unlock(r);
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	return err;
}

int __pki_page_mprotect(void *addr, size_t len, int prot)
{
	PKI_HELD(pki_watch_mgr_lock);
	uintptr_t a = (uintptr_t)addr, end;
	int err;

	if (a % page_size() || prot & ~(PROT_READ | PROT_WRITE | PROT_EXEC))
		return -EINVAL;
	if (!len)
		return 0;
	/* As the kernel: the length rounded up first (to 0 past the top: ENOMEM) */
	end = a + ((len + page_size() - 1) & ~(size_t)(page_size() - 1));
	if (end <= a)
		return -ENOMEM;
	while (a < end) {
		int ri = region_enter(a);
		uintptr_t hi;

		if (ri < 0) {
			hi = next_region(a, end);
			if (mprotect((void *)a, hi - a, prot))
				return -errno;
		} else {
			hi = atomic_load(&P.regions[ri].end);
			if (hi > end)
				hi = end;
			err = __region_mprotect(ri, a, hi, prot);
			region_leave(ri);
			if (err)
				return err;
		}
		a = hi;
	}
	return 0;
}

/*
 * PW2 1a: count this call in the current phase before it searches, which
 * a region published meanwhile could miss: that region's conversion waits
 * for the call to end.  A phase read before a flip and counted after it
 * would be waited for by no conversion: the phase is read again once
 * counted, and the count moves to the new one.
 */
static unsigned int native_enter(void)
{
	for (;;) {
		unsigned int ph = atomic_load(&P.native_phase) & 1;

		atomic_fetch_add(&P.native[ph], 1);
		atomic_thread_fence(memory_order_seq_cst);
		if ((atomic_load(&P.native_phase) & 1) == ph)
			return ph;
		atomic_fetch_sub(&P.native[ph], 1);
	}
}

int pki_page_prog_mprotect(void *addr, size_t len, int prot, int (*real)(void *, size_t, int))
{
	unsigned int ph = native_enter();
	int err = 0;

	if (!pki_page_overlaps(addr, len)) {
		if (real(addr, len, prot))
			err = -errno;
		atomic_fetch_sub(&P.native[ph], 1);
		return err;
	}
	atomic_fetch_sub(&P.native[ph], 1);
	err = pki_watch_page_mprotect(addr, len, prot);
	if (err == -EINVAL) /* a bit or a form of ours not taken: the kernel's own answer */
		err = real(addr, len, prot) ? -errno : 0;
	return err;
}

/*
 * PW2 1a: the program's mprotect calls that did not find the region just
 * published, because they searched before it was, have ended.  The phase
 * flips first: calls that begin after it count in the other phase and
 * find the region, so the wait ends however often the program calls.
 */
static void __native_wait(void)
{
	PKI_HELD(pki_watch_mgr_lock);
	unsigned int ph = atomic_fetch_add(&P.native_phase, 1) & 1;

	while (atomic_load(&P.native[ph]))
		sched_yield();
}

/* ---- the SIGSEGV client: starting a step (PW4, PW5) ----------------------- */

static uintptr_t slot_rx(int ri)
{
	return atomic_load_explicit(&P.code_rx, memory_order_relaxed) + (uintptr_t)ri * CODE_SLOT;
}

/* The region of access @a, entered, or -1: not in any (not moved). */
static int access_region(const struct pki_access *a, int home)
{
	struct region *h = &P.regions[home];

	if (a->addr >= atomic_load(&h->va) && a->addr < atomic_load(&h->end)) {
		atomic_fetch_add(&h->inflight, 1);
		return home;
	}
	return region_enter(a->addr);
}

/*
 * Lock @home and the other region the instruction reaches, in index order
 * (no two threads wait for each other), and check both are still LIVE.
 */
static bool lock_regions(int home, int other)
{
	int first = other >= 0 && other < home ? other : home;
	int second = first == home ? other : home;

	step_lock(&P.regions[first]);
	if (second >= 0)
		step_lock(&P.regions[second]);
	if (atomic_load(&P.regions[home].state) == R_LIVE &&
	    (other < 0 || atomic_load(&P.regions[other].state) == R_LIVE))
		return true;
	if (second >= 0)
		step_unlock(&P.regions[second]);
	step_unlock(&P.regions[first]);
	return false;
}

/* Does the program's protection of page @pg of @r allow access @a's kind? */
static bool access_allowed(const struct region *r, uintptr_t pg, const struct pki_access *a)
{
	return (!a->write || prog_allows(r, pg, true)) && (!a->read || prog_allows(r, pg, false));
}

/* Decide, for each access, whether it is moved into an alias and within which bounds. */
static int plan_redirect(struct step *s, int home, intptr_t delta[2], uintptr_t lo[2],
			 uintptr_t hi[2])
{
	s->other = -1;
	for (int i = 0; i < s->ai.nacc; i++) {
		const struct pki_access *a = &s->ai.acc[i];
		int ri = access_region(a, home);

		s->reg[i] = ri;
		s->lo[i] = a->addr;
		if (ri < 0) {
			/* Not moved: it must stay out of every region, so within its page. */
			delta[i] = 0;
			lo[i] = a->addr & ~(uintptr_t)(page_size() - 1);
			hi[i] = lo[i] + page_size();
			continue;
		}
		if (ri != home) {
			if (s->other >= 0 && s->other != ri) {
				region_leave(ri);
				s->reg[i] = -1;
				return -EOPNOTSUPP;
			}
			s->other = ri;
		}
		struct region *r = &P.regions[ri];
		uintptr_t va = atomic_load(&r->va), end = atomic_load(&r->end);
		uintptr_t from = a->addr & ~(uintptr_t)(page_size() - 1), to = from;

		/*
		 * PW8: within the pages the program's protection lets it
		 * reach (a store running into a page it made read-only
		 * faults there, as unwatched): past them, the real pages.
		 */
		while (from > va && access_allowed(r, from - page_size(), a))
			from -= page_size();
		while (to < end && access_allowed(r, to, a))
			to += page_size();
		delta[i] = (intptr_t)((uintptr_t)r->alias - va);
		lo[i] = (uintptr_t)r->alias + (from - va);
		hi[i] = (uintptr_t)r->alias + (to - va);
	}
	return 0;
}

static void leave_access_regions(const struct step *s)
{
	for (int i = 0; i < s->ai.nacc; i++)
		if (s->reg[i] >= 0)
			region_leave(s->reg[i]);
}

/*
 * The mask the signal frame @uc returns to.  The kernel's is 64 bits, and
 * what lies past them in libc's larger sigset_t is the frame's siginfo:
 * written whole, it overwrote the siginfo of a fault passed on to the
 * program (step_abort) with the bytes of the fault that began the step.
 */
static void uc_mask_set(ucontext_t *uc, const sigset_t *m)
{
	memcpy(&uc->uc_sigmask, m, sizeof(uint64_t));
}

/* Every signal but the synchronous ones, which a fault or a trap raises. */
static void async_set(sigset_t *all)
{
	static const int sync[] = {SIGSEGV, SIGBUS, SIGTRAP, SIGILL, SIGFPE};

	sigfillset(all);
	for (size_t i = 0; i < sizeof(sync) / sizeof(sync[0]); i++)
		sigdelset(all, sync[i]);
}

/* Block every signal but the synchronous ones until the step ends. */
static void step_mask(ucontext_t *uc, struct step *s)
{
	sigset_t all;

	s->mask = uc->uc_sigmask;
	async_set(&all);
	uc_mask_set(uc, &all);
}

/*
 * PW5: a step that ran with region @ri open, counted by each of its watches
 * (pk_watch_stats.windowed) whether it hit that watch or not: another
 * thread's access to it during that instruction went unseen.
 */
static void count_windowed(int ri)
{
	for (int k = 0; k < REGION_WATCHES; k++) {
		struct pki_pwatch *pw = atomic_load(&P.regions[ri].w[k]);

		if (pw)
			atomic_fetch_add_explicit(&pw->windowed, 1, memory_order_relaxed);
	}
}

/* PW5: the region open for one single-stepped instruction. */
static void begin_windowed(ucontext_t *uc, int home, struct step *s)
{
	struct region *r = &P.regions[home];
	uintptr_t va = atomic_load(&r->va), end = atomic_load(&r->end);

	s->windowed = true;
	memcpy(r->before, r->alias, end - va);
	/* PW8: at the program's protection, which the instruction meets as unwatched */
	protect_pages(r, 0, SIZE_MAX, true);
	pki_uc_set_step(uc, true);
}

/*
 * An indirect jmp or call through a pointer on a watched page (a PLT's jump
 * through its GOT slot, on the page of a program's globals): done in the
 * handler (pki_access_branch), reported as a read of the pointer, and no
 * step.  False when it cannot be (the pointer crosses the region's edge, a
 * shadow stack): the caller runs it windowed.  Ends the step begun.
 */
static bool emulate_branch(ucontext_t *uc, int home, struct step *s)
{
	struct region *r = &P.regions[home];
	const struct pki_access *a = &s->ai.acc[0];
	uintptr_t va = atomic_load(&r->va), end = atomic_load(&r->end), ip = s->ip;
	struct pk_watch_hit hits[MAX_STEP_HITS];
	struct pki_pwatch *who[MAX_STEP_HITS];
	struct span sp = {.lo = a->addr, .hi = a->addr + a->size, .read = true, .reg = home};
	int nh;

	if (a->addr < va || a->addr + a->size > end)
		return false;
	save_before(home, sp.lo, sp.hi);
	if (pki_access_branch(uc, &s->ai, r->alias + (a->addr - va), P.shstk))
		return false;
	nh = span_hits(&sp, 0, hits, 0, who);
	step_unlock(r);
	region_leave(home); /* before the callbacks (PW3) */
	deliver(hits, who, nh, (pid_t)syscall(SYS_gettid), ip, uc);
	return true;
}

/*
 * The program's SIGFPE handler, into @act, if a divide error at @uc's
 * instruction would run it; false when the kernel would end the process
 * instead (SIG_DFL, SIG_IGN, or SIGFPE blocked at the fault: a fault's
 * signal is forced).
 */
static bool fpe_handler(const ucontext_t *uc, struct sigaction *act)
{
	/*
	 * The program's action: the kernel's, unless it is the library's
	 * handler, which chains to the program's (a program linking the
	 * library may have installed its own over it).
	 */
	if (sigaction(SIGFPE, NULL, act) || sigismember(&uc->uc_sigmask, SIGFPE) ||
	    (pki_sigown_is_handler(act) && pki_sigown_app_action(SIGFPE, NULL, act)))
		return false;
	return (act->sa_flags & SA_SIGINFO) ||
	       (act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN);
}

/*
 * @act run for a divide error at @uc's instruction, as the kernel would run
 * it: its sa_mask, SIGFPE blocked unless SA_NODEFER, SA_RESETHAND, with
 * siginfo or not.  The handler sees the original instruction in @uc, as
 * without the watch, and may change @uc or leave by siglongjmp.
 */
static void run_fpe_handler(const struct sigaction *act, ucontext_t *uc)
{
	sigset_t add = act->sa_mask, saved, m;
	siginfo_t si;

	if (act->sa_flags & SA_RESETHAND) {
		struct sigaction dfl = {.sa_handler = SIG_DFL};

		sigemptyset(&dfl.sa_mask);
		sigaction(SIGFPE, &dfl, NULL);
	}
	if (!(act->sa_flags & SA_NODEFER))
		sigaddset(&add, SIGFPE);
	memset(&si, 0, sizeof(si));
	si.si_signo = SIGFPE;
	si.si_code = FPE_INTDIV;
	si.si_addr = (void *)pki_uc_ip(uc);
	/* The mask at the fault (page_segv blocked more since), and the handler's */
	sigemptyset(&m);
	memcpy(&m, &uc->uc_sigmask, sizeof(uint64_t));
	sigorset(&m, &m, &add);
	pthread_sigmask(SIG_SETMASK, &m, &saved);
	if (act->sa_flags & SA_SIGINFO)
		act->sa_sigaction(SIGFPE, &si, uc);
	else
		act->sa_handler(SIGFPE);
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
}

/*
 * A div or idiv by watched memory that raises a divide error (#DE) is not
 * run out of line when the program handles SIGFPE: its handler would run
 * inside the step, the copy's address in its context, and one that leaves
 * by siglongjmp would leave the region locked and this thread's step
 * pending.  The read is reported, the step ended, then the program's
 * handler runs at the original instruction.  False if the division goes
 * through, the divisor is not all in @home (it runs windowed), or the
 * process is to die of it (the copy raises it: the kernel kills alike).
 */
static bool divide_error(ucontext_t *uc, int home, struct step *s)
{
	struct region *r = &P.regions[home];
	const struct pki_access *a = &s->ai.acc[0];
	uintptr_t va = atomic_load(&r->va), end = atomic_load(&r->end);
	struct pk_watch_hit hits[MAX_STEP_HITS];
	struct pki_pwatch *who[MAX_STEP_HITS];
	struct span sp = {.lo = a->addr, .hi = a->addr + a->size, .read = true, .reg = home};
	struct sigaction act;
	uintptr_t ip = s->ip; /* the record is the next step's once unlocked */
	int nh;

	if (a->addr < va || a->addr + a->size > end ||
	    !pki_access_div_faults(uc, &s->ai, r->alias + (a->addr - va)) || !fpe_handler(uc, &act))
		return false;
	save_before(home, sp.lo, sp.hi);
	nh = span_hits(&sp, 0, hits, 0, who);
	step_unlock(r);
	region_leave(home); /* before the callbacks (PW3) */
	deliver(hits, who, nh, (pid_t)syscall(SYS_gettid), ip, uc);
	run_fpe_handler(&act, uc);
	return true;
}

static bool fault(ucontext_t *uc, uintptr_t a)
{
	int home;
	struct region *r;
	struct step *s;
	intptr_t delta[2] = {0, 0};
	uintptr_t lo[2] = {0, 0}, hi[2] = {0, 0};
	uint32_t st;
	int err;

	if (fork_holder && (pid_t)syscall(SYS_getpid) != fork_pid) {
		/* A fork child before its handler: its private pages now, then again. */
		__pki_page_fork_child();
		return true;
	}
	home = region_enter(a);

	if (home < 0) {
		/*
		 * PW3: a fault from before a removal retries, once per
		 * removal and frame: read after region_enter, the count
		 * includes the one that unpublished the region this fault
		 * met; the stack pointer tells a nested fault at the same
		 * address (a signal handler's, raised before ours ran) from
		 * this one faulting again.
		 */
		unsigned int gen = atomic_load(&P.unmade);
		uintptr_t sp = pki_uc_sp(uc);

		if (!page_seen(a) || (retried == a && retried_sp == sp && retried_gen == gen))
			return false;
		retried = a;
		retried_sp = sp;
		retried_gen = gen;
		return true;
	}
	r = &P.regions[home];
	st = atomic_load(&r->state);
	if (st != R_LIVE || !lock_regions(home, -1)) {
		region_leave(home);
		if (st != R_LIVE)
			pki_futex_wait(&r->state, st, NULL);
		return true; /* again, once the region settled */
	}
	retried = 0;
	if (!prog_allows(r, a, pki_uc_fault_write(uc))) {
		/* PW8: the program's own protection refuses it: its fault */
		step_unlock(r);
		region_leave(home);
		return false;
	}
	s = &r->step;
	s->windowed = false;
	s->other = -1;
	s->ip = pki_uc_ip(uc);
	s->fault = a;
	s->ai.nacc = 0;
	err = pki_access_decode(uc, &s->ai);
	if (!err && s->ai.div && divide_error(uc, home, s))
		return true;
	if (!err && s->ai.branch) {
		if (emulate_branch(uc, home, s))
			return true;
		err = -EOPNOTSUPP;
		s->ai.nacc = 0;
	}
	if (!err) {
		err = plan_redirect(s, home, delta, lo, hi);
		if (!err && s->other >= 0) {
			/* Both regions, in index order: let go of home and take them again. */
			step_unlock(r);
			if (!lock_regions(home, s->other)) {
				leave_access_regions(s);
				region_leave(home);
				return true;
			}
		}
	}
	if (!err) {
		for (int i = 0; i < s->ai.nacc; i++)
			if (s->reg[i] >= 0) {
				/* A string op may touch its whole region; others, their operand. */
				const struct pki_access *ac = &s->ai.acc[i];

				if (s->ai.rep)
					save_before(s->reg[i], lo[i] - (uintptr_t)delta[i],
						    hi[i] - (uintptr_t)delta[i]);
				else
					save_before(s->reg[i], ac->addr, ac->addr + ac->size);
			}
		err =
		    pki_access_begin(uc, &s->ai, delta, lo, hi,
				     P.code_rw + (size_t)home * CODE_SLOT, slot_rx(home), &s->undo);
	}
	if (err) {
		if (s->other >= 0)
			step_unlock(&P.regions[s->other]);
		leave_access_regions(s);
		s->ai.nacc = 0;
		s->other = -1;
		begin_windowed(uc, home, s);
	}
	step_mask(uc, s);
	step_region = home;
	return true; /* home stays entered and locked until the step ends */
}

/*
 * The copy or the windowed instruction faulted for real (SIGSEGV, SIGBUS,
 * SIGFPE): undo, pass the fault on.
 */
static bool step_abort(ucontext_t *uc)
{
	int home = step_region;
	struct region *r = &P.regions[home];
	struct step *s = &r->step;
	sigset_t mask;

	step_region = -1;
	if (s->windowed) {
		pki_uc_set_step(uc, false);
		protect_pages(r, 0, SIZE_MAX, false);
		count_windowed(home);
	} else {
		pki_access_abort(uc, &s->undo);
		leave_access_regions(s);
		if (s->other >= 0)
			step_unlock(&P.regions[s->other]);
	}
	uc_mask_set(uc, &s->mask);
	/* the program's handler runs with the mask of the fault, as unwatched */
	mask = s->mask;
	step_unlock(r);
	region_leave(home);
	pthread_sigmask(SIG_SETMASK, &mask, NULL);
	return false;
}

static bool page_segv(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;
	int saved = errno;
	bool mine;

	sigset_t async, mask;

	(void)sig;
	if (step_region >= 0)
		return step_abort(uc);
	if (si->si_code != SEGV_ACCERR)
		return false;
	/*
	 * PW4: no handler of the program's runs on this thread while it holds
	 * a step lock: one that touched the region would wait for it for ever.
	 * The mask at the fault comes back from @uc when the handler returns
	 * (the step's own, if one began), and here when the fault is passed on.
	 */
	async_set(&async);
	pthread_sigmask(SIG_BLOCK, &async, &mask);
	mine = fault(uc, (uintptr_t)si->si_addr);
	if (!mine)
		pthread_sigmask(SIG_SETMASK, &mask, NULL);
	errno = saved;
	return mine;
}

/*
 * The SIGBUS and SIGFPE client (PW4): the step's copy of the instruction
 * (or the windowed instruction) faulted on its other operand (a file's
 * page past its end) or with an unmasked floating-point exception.  Put
 * back at the program's instruction, the step ended, and passed on: the
 * program's handler sees the fault as unwatched (a SIGFPE's address is the
 * instruction's), and may leave by siglongjmp.
 */
static bool page_step_fault(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;
	int home = step_region;
	const struct step *s;
	uintptr_t ip = pki_uc_ip(uc);

	if (home < 0 || si->si_code <= 0) /* not in a step, or sent (kill) */
		return false;
	s = &P.regions[home].step;
	if (s->windowed ? ip != s->ip : ip - slot_rx(home) >= CODE_SLOT)
		return false;
	if (sig == SIGFPE)
		si->si_addr = (void *)s->ip;
	return step_abort(uc);
}

/* ---- the SIGTRAP client: ending a step ------------------------------------ */

static int end_step(ucontext_t *uc, int home, struct pk_watch_hit *hits, struct pki_pwatch **who)
{
	struct region *r = &P.regions[home];
	struct step *s = &r->step;
	int nh = 0;

	if (s->windowed) {
		pki_uc_set_step(uc, false);
		protect_pages(r, 0, SIZE_MAX, false);
		nh = windowed_hits(s, home, hits, who);
		count_windowed(home);
	} else {
		unsigned long iters = s->ai.rep ? (unsigned long)s->undo.iters : 1;

		pki_access_end(uc, &s->undo);

		for (int i = 0; i < s->ai.nacc; i++)
			if (s->reg[i] >= 0) {
				struct span sp = step_span(s, i, iters);

				nh = span_hits(&sp, 0, hits, nh, who);
			}
	}
	uc_mask_set(uc, &s->mask);
	return nh;
}

/* PW8: the forking thread wrote the pages during fork: the child's copy gets it too. */
static void fork_snap_refresh(int home, int other)
{
	int ri[2] = {home, other};

	for (int i = 0; i < 2; i++) {
		struct region *r = ri[i] >= 0 ? &P.regions[ri[i]] : NULL;

		if (r && r->snap)
			memcpy(r->snap, r->alias, atomic_load(&r->end) - atomic_load(&r->va));
	}
}

static bool page_trap(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;
	struct pk_watch_hit hits[MAX_STEP_HITS];
	struct pki_pwatch *who[MAX_STEP_HITS];
	int home = step_region, saved = errno, nh;
	struct step *s;
	uintptr_t ip;

	(void)sig;
	if (home < 0)
		return false;
	s = &P.regions[home].step;
	if (s->windowed ? !pki_si_single_step(si) : !pki_access_at_end(uc, &s->undo))
		return false;
	step_region = -1;
	ip = s->ip;
	nh = end_step(uc, home, hits, who);
	if (fork_holder)
		fork_snap_refresh(home, s->other);
	/*
	 * The step's record is the next step's once unlocked: what is left
	 * to do with it is copied out.  Unlocked and left before the
	 * callbacks (PW3): one may touch the region, nested (`self`), while
	 * its last watch is being removed, whose removal waits for the
	 * handlers in the region and then for the watch's `users`, which
	 * keep the watches they run for.
	 */
	int other = s->other, reg[2] = {-1, -1};

	for (int i = 0; i < s->ai.nacc; i++)
		reg[i] = s->reg[i];
	if (other >= 0)
		step_unlock(&P.regions[other]);
	step_unlock(&P.regions[home]);
	for (int i = 0; i < 2; i++)
		if (reg[i] >= 0)
			region_leave(reg[i]);
	region_leave(home);
	deliver(hits, who, nh, (pid_t)syscall(SYS_gettid), ip, uc);
	errno = saved;
	return true;
}

/* ---- making and unmaking regions (normal context, the manager's lock) ----- */

/* The step code area: a memfd mapped twice, RW for us and RX to run. */
static int __code_init(void)
{
	PKI_HELD(pki_watch_mgr_lock);
	size_t len = (size_t)NR_REGIONS * CODE_SLOT;
	void *rw, *rx;
	int fd;

	if (P.code_rw)
		return 0;
	fd = memfd_create("probekit-step", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)len)) {
		close(fd);
		return -errno;
	}
	rw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	rx = mmap(NULL, len, PROT_READ | PROT_EXEC, MAP_SHARED, fd, 0);
	close(fd);
	if (rw == MAP_FAILED || rx == MAP_FAILED) {
		if (rw != MAP_FAILED)
			munmap(rw, len);
		if (rx != MAP_FAILED)
			munmap(rx, len);
		return -ENOMEM;
	}
	P.code_rw = rw;
	atomic_store(&P.code_rx, (uintptr_t)rx);
	return 0;
}

static int __clients_add(void)
{
	PKI_HELD(pki_watch_mgr_lock);
	int err;

	if (clients_added)
		return 0;
	err = pki_sigown_client_add(SIGSEGV, PKI_SIGSEGV_PAGEWATCH, page_segv, 0);
	if (!err)
		err = pki_sigown_client_add(SIGTRAP, PKI_SIGTRAP_PAGESTEP, page_trap, 0);
	if (!err)
		err = pki_sigown_client_add(SIGBUS, PKI_SIGBUS_PAGESTEP, page_step_fault, 0);
	if (!err)
		err = pki_sigown_client_add(SIGFPE, PKI_SIGFPE_PAGESTEP, page_step_fault, 0);
	if (err) {
		pki_warn("watch: cannot install the signal handlers of page mode: %s\n",
			 pki_errstr(err));
		return err;
	}
	P.shstk = pki_arch_shstk();
	clients_added = true;
	return 0;
}

/* Is @lo in the stack the calling thread runs on, or the main thread's? */
static bool on_a_stack(const struct pki_maps *m, uintptr_t lo)
{
	extern void *__libc_stack_end; /* the loader's: the main thread's stack */
	int here;
	const struct pki_map *mine = pki_maps_find(m, (unsigned long)(uintptr_t)&here);
	const struct pki_map *main_stack =
	    pki_maps_find(m, (unsigned long)(uintptr_t)__libc_stack_end);
	const struct pki_map *at = pki_maps_find(m, lo);

	return at && (at == mine || at == main_stack);
}

/*
 * PW1: what the maps do not show of the mapping at @start: a mapping that
 * grows down, whose pages our own mapping would stop it growing over and
 * would give back without the flag (nor could the program's
 * mprotect(PROT_GROWSDOWN) apply to ours); a protection key, which our
 * mapping would not carry (the program's key checks on those pages gone)
 * and which the program's pkey_mprotect() would replace ours with.  NULL,
 * or why it is refused.  Unreadable flags refuse nothing.
 */
static const char *__check_flags(unsigned long start)
{
	PKI_HELD(pki_watch_mgr_lock);
	struct pki_map_flags fl;

	if (pki_maps_flags(start, &fl))
		return NULL;
	if (fl.growsdown)
		return "a mapping that grows down (MAP_GROWSDOWN: a stack)";
	if (fl.pkey)
		return "pages with a protection key (pkey_mprotect)";
	return NULL;
}

/* PW1: what [lo, hi) (pages) lies in, refused with the reason said. */
static int __check_mapping(const void *addr, size_t len, uintptr_t lo, uintptr_t hi)
{
	PKI_HELD(pki_watch_mgr_lock);
	struct pki_maps m = {0};
	const struct pki_map *at;
	const char *why = NULL;
	int err = pki_maps_read(&m);

	if (err) {
		pki_warn("watch %p: cannot read /proc/self/maps: %s\n", addr, pki_errstr(err));
		return err;
	}
	at = pki_maps_find(&m, lo);
	if (!at)
		why = "nothing is mapped there";
	else if (at->end < hi)
		why = "the range spans two mappings";
	else if (at->shared)
		why = "a shared mapping (another process may write it unseen)";
	else if (at->prot & PROT_EXEC)
		why = "an executable mapping";
	else if ((at->prot & (PROT_READ | PROT_WRITE)) != (PROT_READ | PROT_WRITE))
		why = "not a readable and writable mapping";
	else if (on_a_stack(&m, lo))
		why = "a thread's stack (the kernel writes signal frames there)";
	else if (pki_sigown_data_overlaps(lo, hi) ||
		 (lo < (uintptr_t)(&P + 1) && (uintptr_t)&P < hi))
		why = "its page holds probekit's own state, which the fault handler uses (the "
		      "library is linked into this program)";
	if (!why)
		why = __check_flags(at->start);
	pki_maps_free(&m);
	if (!why)
		return 0;
	pki_warn("watch %p/%zu: page mode cannot watch it: %s: %s\n", addr, len, why,
		 pki_errstr(EINVAL));
	return -EINVAL;
}

static int __region_free_slot(void)
{
	PKI_HELD(pki_watch_mgr_lock);
	for (int i = 0; i < NR_REGIONS; i++)
		if (!atomic_load(&P.regions[i].end) && atomic_load(&P.regions[i].state) == R_FREE &&
		    !atomic_load(&P.regions[i].inflight))
			return i;
	return -1;
}

/* The region of exactly... or containing [lo, hi); -EBUSY on a partial overlap. */
static int __region_find(uintptr_t lo, uintptr_t hi, int *out)
{
	PKI_HELD(pki_watch_mgr_lock);
	*out = -1;
	for (int i = 0; i < NR_REGIONS; i++) {
		uintptr_t va = atomic_load(&P.regions[i].va), end = atomic_load(&P.regions[i].end);

		if (!va || hi <= va || lo >= end)
			continue;
		if (lo < va || hi > end)
			return -EBUSY;
		*out = i;
	}
	return 0;
}

/*
 * The memfd gets the pages' bytes by a write the kernel makes: whole pages
 * hold the program's objects and whatever lies between them (a sanitizer's
 * red zones), which no C copy of ours may read.
 */
static int fill_from(int fd, uintptr_t lo, size_t n)
{
	for (size_t done = 0; done < n;) {
		long k = syscall(SYS_pwrite64, fd, lo + done, n - done, (off_t)done);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EIO;
		done += (size_t)k;
	}
	return 0;
}

/* PW2 step 3: the memfd filled from the pages, mapped as alias and over them. */
static int __region_alias(struct region *r, uintptr_t lo, size_t n, int prot)
{
	PKI_HELD(pki_watch_mgr_lock);
	struct stat st;
	void *alias;
	int fd = memfd_create("probekit-watch", MFD_CLOEXEC), err = 0;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)n) || fstat(fd, &st)) {
		err = -errno;
		goto out;
	}
	if ((err = fill_from(fd, lo, n)) < 0)
		goto out;
	alias = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (alias == MAP_FAILED) {
		err = -errno;
		goto out;
	}
	if (mmap((void *)lo, n, prot, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
		err = -errno;
		munmap(alias, n);
		goto out;
	}
	r->alias = alias;
	r->ino = (unsigned long)st.st_ino;
	r->dev_major = major(st.st_dev);
	r->dev_minor = minor(st.st_dev);
out:
	close(fd);
	return err;
}

/* PW2: a new region for the pages [lo, hi). */
static int __region_make(uintptr_t lo, uintptr_t hi, int prot, int *out)
{
	PKI_HELD(pki_watch_mgr_lock);
	int i = __region_free_slot(), err;
	struct region *r;
	size_t n = hi - lo;

	if (i < 0) {
		pki_warn("watch: page mode watches at most %d page runs at once: %s\n", NR_REGIONS,
			 pki_errstr(ENOSPC));
		return -ENOSPC;
	}
	r = &P.regions[i];
	r->before = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r->before == MAP_FAILED) {
		r->before = NULL;
		return -ENOMEM;
	}
	r->prog =
	    mmap(NULL, n / page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r->prog == MAP_FAILED) {
		munmap(r->before, n);
		r->before = r->prog = NULL;
		return -ENOMEM;
	}
	memset(r->prog, PROT_READ | PROT_WRITE, n / page_size());
	atomic_store(&r->prot_watch, prot);
	atomic_store(&r->state, R_CONVERTING);
	atomic_store(&r->end, hi);
	atomic_fetch_add(&P.live, 1);
	atomic_store(&r->va, lo); /* 1: published, faults wait */
	__native_wait();	  /* 1a */
	__seen_add(lo, hi);
	err = mprotect((void *)lo, n, PROT_READ) ? -errno : 0; /* 2 */
	if (!err)
		err = __region_alias(r, lo, n, prot); /* 3 */
	if (err) {
		mprotect((void *)lo, n, PROT_READ | PROT_WRITE);
		atomic_fetch_add(&P.unmade, 1);
		atomic_store(&r->va, 0);
		atomic_fetch_sub(&P.live, 1);
		atomic_store(&r->end, 0);
		while (atomic_load(&r->inflight))
			sched_yield();
		munmap(r->before, n);
		munmap(r->prog, n / page_size());
		r->before = r->prog = NULL;
		atomic_store(&r->state, R_FREE);
		pki_futex_wake(&r->state, INT_MAX);
		pki_warn("watch %#lx: cannot make the watched pages an alias: %s\n",
			 (unsigned long)lo, pki_errstr(err));
		return err;
	}
	atomic_store(&r->state, R_LIVE); /* 4 */
	pki_futex_wake(&r->state, INT_MAX);
	*out = i;
	return 0;
}

/* PW3: is our memfd still what is mapped at the region, and with what protection? */
static bool __region_still_ours(const struct region *r, uintptr_t va, int *prot)
{
	PKI_HELD(pki_watch_mgr_lock);
	struct pki_maps m = {0};
	const struct pki_map *at;
	bool ours = false;

	/*
	 * Unreadable, it is taken as ours (what it is unless the program
	 * unmapped it): the maps' buffer comes from the heap, which may be the
	 * watched pages themselves, and the kernel's read into them fails
	 * (PW6).  Leaving the pages would leave them inaccessible for good.
	 */
	if (pki_maps_read(&m))
		return true;
	at = pki_maps_find(&m, va);
	if (at && at->ino == r->ino && at->dev_major == r->dev_major &&
	    at->dev_minor == r->dev_minor && at->shared) {
		ours = true;
		*prot = at->prot;
	}
	pki_maps_free(&m);
	return ours;
}

/* PW3, PW8: the program's protection on the pages given back (see __region_unmake). */
static void restore_prot(const struct region *r, uintptr_t va, size_t n, bool as_left, int prot)
{
	if (!as_left) {
		mprotect((void *)va, n, prot);
		return;
	}
	for (size_t i = 0, j, np = n / page_size(); i < np; i = j) {
		for (j = i + 1; j < np && r->prog[j] == r->prog[i];)
			j++;
		mprotect((void *)(va + i * page_size()), (j - i) * page_size(), r->prog[i]);
	}
}

/* PW3: the pages private again with what the alias holds, at the program's protection. */
static void __region_unmake(int i)
{
	PKI_HELD(pki_watch_mgr_lock);
	struct region *r = &P.regions[i];
	uintptr_t va = atomic_load(&r->va), end = atomic_load(&r->end);
	size_t n = end - va;
	int prot = PROT_READ | PROT_WRITE;
	/*
	 * Read before the region stops serving faults: reading the maps
	 * allocates, and the heap may be the watched pages (a watched heap
	 * object), whose fault would wait for this very removal.
	 */
	bool ours = __region_still_ours(r, va, &prot);
	bool nomem = false;

	atomic_store(&r->state, R_REVERTING);
	step_lock(r); /* no step running on it */
	if (ours) {
		void *tmp =
		    mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		/*
		 * Ours as we left it: each page gets the program's protection
		 * back (PW8); changed behind our back (a program linking the
		 * library without the agent): the one it set, everywhere.
		 */
		bool as_left = prot == page_prot(r, 0);

		if (tmp != MAP_FAILED) {
			memcpy(tmp, r->alias, n);
			if (mremap(tmp, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)va) ==
			    MAP_FAILED)
				munmap(tmp, n);
			else
				restore_prot(r, va, n, as_left, prot);
		} else {
			nomem = true;
			restore_prot(r, va, n, as_left, prot);
		}
	}
	step_unlock(r);
	atomic_fetch_add(&P.unmade, 1); /* before: a fault that finds no region sees it */
	atomic_store(&r->va, 0);	/* R1: no new handler finds it */
	atomic_fetch_sub(&P.live, 1);
	atomic_store(&r->end, 0);
	while (atomic_load(&r->inflight)) /* R3 */
		sched_yield();
	munmap(r->alias, n);
	munmap(r->before, n);
	munmap(r->prog, n / page_size());
	r->alias = r->before = r->prog = NULL;
	r->nw = 0;
	atomic_store(&r->state, R_FREE);
	pki_futex_wake(&r->state, INT_MAX);
	if (nomem) /* said once the pages serve again (printing may allocate) */
		pki_warn("watch %#lx: no memory to give the pages back: left in a memfd: %s\n",
			 (unsigned long)va, pki_errstr(ENOMEM));
}

static int __region_join(int i, struct pki_pwatch *pw, int prot)
{
	PKI_HELD(pki_watch_mgr_lock);
	struct region *r = &P.regions[i];

	if (r->nw >= REGION_WATCHES) {
		pki_warn("watch %#lx: at most %d page-mode watches share pages: %s\n",
			 (unsigned long)pw->addr, REGION_WATCHES, pki_errstr(ENOSPC));
		return -ENOSPC;
	}
	if (prot == PROT_NONE && atomic_load(&r->prot_watch) != PROT_NONE) {
		/*
		 * Under the step lock: a windowed step ending meanwhile would
		 * put the old protection back.  Page by page: the program's
		 * PROT_EXEC stays (PW8).
		 */
		int old = atomic_load(&r->prot_watch), err;
		sigset_t saved;

		pki_siglock_block(&saved);
		step_lock(r);
		atomic_store(&r->prot_watch, PROT_NONE);
		err = protect_pages(r, 0, SIZE_MAX, false);
		if (err) {
			atomic_store(&r->prot_watch, old);
			protect_pages(r, 0, SIZE_MAX, false);
		}
		step_unlock(r);
		pthread_sigmask(SIG_SETMASK, &saved, NULL);
		if (err)
			return err;
	}
	for (int k = 0; k < REGION_WATCHES; k++)
		if (!atomic_load(&r->w[k])) {
			atomic_store(&r->w[k], pw);
			break;
		}
	r->nw++;
	pw->reg = i;
	return 0;
}

/*
 * A watch's record is read by the handlers with the step lock held
 * (make_hit): it must never lie on a watched page, where that read would
 * fault and wait for the lock its own thread holds.  A heap object's record
 * from malloc would share its page (the next chunk): each has a page of its
 * own instead.
 */
static struct pki_pwatch *pwatch_alloc(void)
{
	void *p = mmap(NULL, sizeof(struct pki_pwatch), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : memset(p, 0, sizeof(struct pki_pwatch));
}

static void pwatch_free(struct pki_pwatch *pw)
{
	munmap(pw, sizeof(*pw));
}

int __pki_page_add(struct pk_watch *owner, const void *addr, size_t len, enum pk_watch_type type,
		   const struct pk_watch_opts *o, const struct pk_watch_cond *cond,
		   struct pki_pwatch **out)
{
	PKI_HELD(pki_watch_mgr_lock);
	uintptr_t lo = (uintptr_t)addr & ~(uintptr_t)(page_size() - 1);
	uintptr_t hi = ((uintptr_t)addr + len + page_size() - 1) & ~(uintptr_t)(page_size() - 1);
	int prot = type == PK_WATCH_W ? PROT_READ : PROT_NONE, ri, err;
	struct pki_pwatch *pw;

	if (type != PK_WATCH_W && type != PK_WATCH_RW) {
		pki_warn("watch %p: page mode watches reads and writes, not execution: %s\n", addr,
			 pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (o->tid) {
		pki_warn("watch %p: page mode watches every thread; a single thread (%d) needs "
			 "a hardware watchpoint: %s\n",
			 addr, (int)o->tid, pki_errstr(ENOTSUP));
		return -ENOTSUP;
	}
	err = __region_find(lo, hi, &ri);
	if (err) {
		pki_warn("watch %p/%zu: its pages overlap those of another page-mode watch in "
			 "part: %s\n",
			 addr, len, pki_errstr(EBUSY));
		return err;
	}
	if (ri < 0 && (err = __check_mapping(addr, len, lo, hi)))
		return err;
	if ((err = __code_init()) || (err = __clients_add()))
		return err;
	pw = pwatch_alloc();
	if (!pw)
		return -ENOMEM;
	*pw = (struct pki_pwatch){
	    .owner = owner,
	    .addr = (uintptr_t)addr,
	    .len = len,
	    .rw = type == PK_WATCH_RW,
	    .cb = o->callback,
	    .ctx = o->ctx,
	    .queue = o->queue,
	    .enabled = !o->disabled,
	    .has_cond = cond != NULL,
	    .cond = cond ? *cond : (struct pk_watch_cond){0},
	    .reg = -1,
	};
	if (ri < 0 && (err = __region_make(lo, hi, prot, &ri)) == 0 &&
	    (err = __region_join(ri, pw, prot)))
		__region_unmake(ri);
	else if (!err && pw->reg < 0)
		err = __region_join(ri, pw, prot);
	if (err) {
		pwatch_free(pw);
		return err;
	}
	*out = pw;
	return 0;
}

/*
 * PW3: @pw out of its region's list, under the step lock: the handlers take
 * a watch's hits from the list under that lock (span_hits, count_windowed),
 * counting each in `users` until delivered, so that once the lock was
 * taken here no handler can newly find it, and those that did are counted.
 * Not the region's `inflight`: while the region serves other watches,
 * new faults keep it above zero for as long as the program's threads keep
 * touching the pages.
 */
static void __pwatch_unpublish(struct region *r, struct pki_pwatch *pw)
{
	PKI_HELD(pki_watch_mgr_lock);
	sigset_t saved;

	pki_siglock_block(&saved);
	step_lock(r);
	for (int k = 0; k < REGION_WATCHES; k++)
		if (atomic_load(&r->w[k]) == pw)
			atomic_store(&r->w[k], NULL);
	step_unlock(r);
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
}

void __pki_page_remove(struct pki_pwatch *pw)
{
	PKI_HELD(pki_watch_mgr_lock);
	struct region *r;

	if (pw->dead || pw->reg < 0) {
		pwatch_free(pw);
		return;
	}
	r = &P.regions[pw->reg];
	__pwatch_unpublish(r, pw);
	if (--r->nw == 0)
		__region_unmake(pw->reg);
	/* R3 for this watch alone: no handler still holds it. */
	while (atomic_load(&pw->users))
		sched_yield();
	pwatch_free(pw);
}

void __pki_page_enable(struct pki_pwatch *pw, bool on)
{
	PKI_HELD(pki_watch_mgr_lock);
	atomic_store(&pw->enabled, on);
}

unsigned long pki_page_hits(const struct pki_pwatch *pw)
{
	return atomic_load_explicit(&((struct pki_pwatch *)pw)->hits, memory_order_relaxed);
}

void __pki_page_stats(const struct pki_pwatch *pw, struct pk_watch_stats *st)
{
	PKI_HELD(pki_watch_mgr_lock);
	struct pki_pwatch *p = (struct pki_pwatch *)pw;

	st->hits = atomic_load(&p->hits);
	st->self = atomic_load(&p->self);
	st->windowed = atomic_load(&p->windowed);
	st->filtered = atomic_load(&p->filtered);
	st->counted = st->hits + st->self + st->filtered;
	st->late = st->unseen = 0;
}

/* ---- fork (PW8) ------------------------------------------------------------ */

void __pki_page_fork_prepare(void)
{
	PKI_HELD(pki_watch_mgr_lock);
	for (int i = 0; i < NR_REGIONS; i++) {
		struct region *r = &P.regions[i];
		uintptr_t va = atomic_load(&r->va);
		size_t n = atomic_load(&r->end) - va;

		r->snap = NULL;
		if (!va || atomic_load(&r->state) != R_LIVE)
			continue;
		step_lock(r);
		r->snap = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (r->snap == MAP_FAILED)
			r->snap = NULL;
		else
			memcpy(r->snap, r->alias, n);
	}
	fork_pid = (pid_t)syscall(SYS_getpid);
	fork_holder = true;
}

void __pki_page_fork_parent(void)
{
	PKI_HELD(pki_watch_mgr_lock);
	fork_holder = false;
	for (int i = 0; i < NR_REGIONS; i++) {
		struct region *r = &P.regions[i];
		uintptr_t va = atomic_load(&r->va);

		if (!va || atomic_load(&r->state) != R_LIVE)
			continue;
		if (r->snap)
			munmap(r->snap, atomic_load(&r->end) - va);
		r->snap = NULL;
		step_unlock(r);
	}
}

/* The child's only thread: its own private pages back, no watch (PW8). */
void __pki_page_fork_child(void)
{
	PKI_HELD(pki_watch_mgr_lock);
	fork_holder = false;
	for (int i = 0; i < NR_REGIONS; i++) {
		struct region *r = &P.regions[i];
		uintptr_t va = atomic_load(&r->va), end = atomic_load(&r->end);

		if (!va)
			continue;
		if (r->snap && mremap(r->snap, end - va, end - va, MREMAP_MAYMOVE | MREMAP_FIXED,
				      (void *)va) != MAP_FAILED)
			restore_prot(r, va, end - va, true, 0);
		for (int k = 0; k < REGION_WATCHES; k++) {
			struct pki_pwatch *pw = atomic_load(&r->w[k]);

			if (pw)
				pw->dead = true;
			atomic_store(&r->w[k], NULL);
		}
		munmap(r->alias, end - va);
		munmap(r->before, end - va);
		munmap(r->prog, (end - va) / page_size());
		r->alias = r->before = r->snap = r->prog = NULL;
		r->nw = 0;
		atomic_store(&r->va, 0);
		atomic_fetch_sub(&P.live, 1);
		atomic_store(&r->end, 0);
		atomic_store(&r->inflight, 0);
		atomic_store(&r->lock, 0);
		atomic_store(&r->state, R_FREE);
	}
}
