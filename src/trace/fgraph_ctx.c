// SPDX-License-Identifier: MIT
/*
 * Exit tracing where frames do not return in order (fgraph.h): abandoned
 * frames recognised by their slot, and one shadow stack per context.
 * Reached from the return trampoline and the trace hook through
 * PKI_SLOWCALL, so built normally (vector registers are saved by the call).
 *
 * Which stack a slot is on: the thread's alternate signal stack, as
 * sigaltstack() gives it, or the other one it runs on.  Within one context
 * that is all there is (the contexts' switches hand over shadow stacks), so
 * an entry on the stack the thread runs on with its slot below the current
 * frame's, or on the alternate stack while the thread runs off it, is dead.
 *
 * The contexts put aside are in one table for the process (a context may be
 * resumed by another thread), under `lock`, taken with every signal but
 * SIGTRAP blocked (the table's calls, munmap and mmap, may be libc's being
 * patched: base/sigown.c's reason), so that no handler of the holder's
 * thread (a return that looks for its context) spins on it.
 */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/siglock.h"
#include "trace/fgraph.h"
#include "trace/trace.h"

struct alt {
	unsigned long lo, hi; /* hi == 0: none */
	bool got;	      /* read (alt_get): a system call, made only when needed */
};

/*
 * And kept for pki_fgraph_prune()'s test.  One that reads as disabled keeps
 * the last one seen: a handler that runs on it with SS_AUTODISARM reads it
 * so, and its frames must still be told from the others.
 */
static void alt_get(struct pki_fgraph_tls *t, struct alt *a)
{
	stack_t ss;

	pki_trace_busy++; /* (libc's: may be traced) */
	if (!sigaltstack(NULL, &ss) && !(ss.ss_flags & SS_DISABLE)) {
		t->alt_lo = (unsigned long)ss.ss_sp;
		t->alt_size = ss.ss_size;
	}
	pki_trace_busy--;
	a->lo = t->alt_lo;
	a->hi = a->lo + t->alt_size;
	a->got = true;
}

static bool on_alt(const struct alt *a, unsigned long p)
{
	return p >= a->lo && p < a->hi;
}

/*
 * The frame of entry slot @e cannot return, the thread running the frame
 * whose slot is @slot.  Marked entries belong to an unwind: never.  @a is
 * read at the first entry that needs it.
 */
static bool dead(struct alt *a, unsigned long e, unsigned long slot)
{
	if (e & PKI_FGRAPH_MARK)
		return false;
	if (!a->got)
		alt_get(&pki_fgraph_tls, a);
	if (on_alt(a, e) == on_alt(a, slot))
		return e < slot;
	return on_alt(a, e); /* a handler's frame, left by siglongjmp */
}

/* ---- contexts put aside ----------------------------------------------- */

struct ctx {
	const void *key; /* its ucontext_t; NULL: left without one (setcontext) */
	struct pki_fgraph_ent *st;
	uint32_t depth;
};

static struct ctx *ctxs;
static size_t nctx, ctx_cap;
static atomic_size_t nctx_pub; /* nctx, read without the lock */
static atomic_flag lock = ATOMIC_FLAG_INIT;

static void lock_take(sigset_t *saved)
{
	pki_siglock_take(&lock, saved);
}

static void lock_drop(const sigset_t *saved)
{
	atomic_store(&nctx_pub, nctx);
	pki_siglock_drop(&lock, saved);
}

/* fork() in another thread while one holds the lock: the child gets it free. */
static void fork_prepare(void)
{
	pki_siglock_wait(&lock);
}

static void fork_release(void)
{
	pki_siglock_release(&lock);
}

int pki_fgraph_ctx_init(void)
{
	return pthread_atfork(fork_prepare, fork_release, fork_release);
}

static void ctx_remove(size_t i)
{
	ctxs[i] = ctxs[--nctx];
}

/* Under the lock.  False if there is no memory for it. */
static bool ctx_put(const void *key, struct pki_fgraph_ent *st, uint32_t depth)
{
	if (nctx == ctx_cap) {
		size_t ncap = ctx_cap ? 2 * ctx_cap : 64;
		struct ctx *n = mmap(NULL, ncap * sizeof(*n), PROT_READ | PROT_WRITE,
				     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (n == MAP_FAILED)
			return false;
		if (ctxs) {
			memcpy(n, ctxs, nctx * sizeof(*n));
			munmap(ctxs, ctx_cap * sizeof(*n));
		}
		ctxs = n;
		ctx_cap = ncap;
	}
	ctxs[nctx++] = (struct ctx){key, st, depth};
	return true;
}

static void stack_free(struct pki_fgraph_ent *st)
{
	if (st && st != PKI_FGRAPH_GONE)
		munmap(st, PKI_FGRAPH_STACK_LEN);
}

/* The calling thread runs with @st now (its key destructor frees it at exit). */
static void own(struct pki_fgraph_tls *t, struct pki_fgraph_ent *st, uint32_t depth)
{
	t->cap = 0; /* no entry pushed meanwhile by a handler: it counts as lost */
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	t->st = st;
	t->depth = depth;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	t->cap = st ? PKI_FGRAPH_DEPTH : 0;
	pki_fgraph_own(st);
}

/*
 * Under the lock: the thread's stack becomes @next's, and its own is put
 * aside under @key if it has entries, else freed.  Freed after the switch:
 * a handler (an INT3 hook: SIGTRAP stays deliverable) may push meanwhile.
 */
static void put_or_free(struct pki_fgraph_tls *t, const void *key, struct ctx next)
{
	struct pki_fgraph_ent *old = t->st;
	uint32_t depth = t->depth;

	own(t, next.st, next.depth);
	if (!depth || !ctx_put(key, old, depth))
		stack_free(old); /* (no memory: its frames' returns will abort) */
}

/*
 * Under the lock: the context to be saved in @from was saved there before
 * (ctxs[i]) and not resumed through us.  Resumed by libc (uc_link) if the
 * thread's stack is empty: those are its entries, the running context's.
 * Else the ucontext_t was reused: they stay, without a key (ctx_adopt).
 */
static void from_put_back(struct pki_fgraph_tls *t, size_t i)
{
	struct ctx c = ctxs[i];

	if (t->depth) {
		ctxs[i].key = NULL;
		return;
	}
	ctx_remove(i);
	put_or_free(t, NULL, c);
}

void pki_fgraph_ctx_switch(const void *from, const void *to)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;
	struct ctx next = {0};
	sigset_t saved;
	size_t i;

	if (t->st == PKI_FGRAPH_GONE || t->unwinding || t->dying || !to)
		return;
	if (!t->depth && !atomic_load(&nctx_pub))
		return;	  /* nothing to put aside, nothing to take back */
	pki_trace_busy++; /* our calls are not events */
	lock_take(&saved);
	for (i = 0; i < nctx; i++)
		if (ctxs[i].key == to) {
			next = ctxs[i];
			ctx_remove(i);
			break;
		}
	if (from)
		for (i = 0; i < nctx; i++)
			if (ctxs[i].key == from) {
				from_put_back(t, i);
				break;
			}
	if (!t->depth && !next.st) {
		lock_drop(&saved); /* a new context: it starts on this empty stack */
		pki_trace_busy--;
		return;
	}
	put_or_free(t, from, next);
	lock_drop(&saved);
	pki_trace_busy--;
}

/*
 * No entry of the running context holds @slot: take the context put aside
 * that has it (uc_link's resumption, or a setcontext back into a stack
 * left), putting the running one aside without a key if it has entries.
 */
static bool ctx_adopt(struct pki_fgraph_tls *t, unsigned long slot)
{
	struct ctx next = {0};
	sigset_t saved;
	size_t i;
	uint32_t j;

	if (!atomic_load(&nctx_pub) || t->unwinding)
		return false;
	pki_trace_busy++;
	lock_take(&saved);
	for (i = 0; i < nctx && !next.st; i++)
		for (j = ctxs[i].depth; j-- > 0;)
			if (ctxs[i].st[j].slot == slot) {
				next = ctxs[i];
				ctx_remove(i);
				break;
			}
	if (next.st)
		put_or_free(t, NULL, next);
	lock_drop(&saved);
	pki_trace_busy--;
	return next.st != NULL;
}

/* ---- the slow paths --------------------------------------------------- */

/* No shadow entry for a return through the trampoline: cannot continue. */
static __attribute__((noreturn)) void lost_return(void)
{
	static const char msg[] =
	    "probekit: return trampoline reached with no shadow entry for "
	    "this frame (a stack switch not through swapcontext?): aborting\n";

	if (write(2, msg, sizeof(msg) - 1) < 0) {
		/* nothing else to do */
	}
	abort();
}

static uint32_t find(const struct pki_fgraph_tls *t, unsigned long slot)
{
	uint32_t i;

	for (i = t->depth; i-- > 0;)
		if (t->st[i].slot == slot)
			return i;
	return UINT32_MAX;
}

/*
 * The entry of the frame returning to @sp, below the top: the entries above
 * it that are dead get their exit first (innermost first, at @ts), the
 * others (another stack's) stay, moved down.
 */
unsigned long pki_fgraph_exit_slow(const struct pki_fgraph_return *r)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;
	unsigned long sp = r->sp, slot = sp - 8, ret;
	uint64_t ts = r->ts;
	uint32_t d, i, j;
	struct alt a = {0};

	i = find(t, slot);
	if (i == UINT32_MAX) {
		if (!ctx_adopt(t, slot))
			lost_return();
		i = find(t, slot);
	}
	d = t->depth;
	for (j = d; j-- > i + 1;)
		if (dead(&a, t->st[j].slot, slot))
			pki_fgraph_ent_exit(t, j, ts, NULL);
	ret = t->st[i].ret;
	pki_fgraph_ent_return(t, i, r);
	for (j = i + 1; j < d; j++)
		if (!dead(&a, t->st[j].slot, slot))
			t->st[i++] = t->st[j];
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	t->depth = i;
	return ret;
}

/*
 * A frame entered at @slot, not below the top entry's: pop the entries it
 * shows dead, from the top, recording their exits.  An entry of the same
 * slot is a tail call (the trampoline is in the slot: it stays) or a frame
 * the new one replaces (a call wrote its return address there).
 */
void pki_fgraph_prune_slow(unsigned long *at, uint64_t ts)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;
	unsigned long slot = (unsigned long)at;
	uint32_t d = t->depth;
	struct pki_fgraph_ent *e;
	struct alt a = {0}; /* (a tail call, the common case, needs none) */

	while (d) {
		e = &t->st[d - 1];
		if (e->slot == slot) {
			if (pki_fgraph_is_tramp(*at))
				break;
		} else if (!dead(&a, e->slot, slot)) {
			break;
		}
		pki_fgraph_ent_exit(t, d - 1, ts, NULL);
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		t->depth = --d;
	}
}

/*
 * A jump to the frame whose stack pointer will be @sp: the entries it
 * abandons get their exit now, from the top.  @sp comes from a jump buffer
 * decoded by the caller: taken only if it is plausible (aligned, and above
 * the caller's frame when both are on the same stack), else the next entry
 * or return finds the dead entries, a little later.
 */
void pki_fgraph_jump(unsigned long sp)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;
	unsigned long here = (unsigned long)__builtin_frame_address(0);
	uint32_t d = t->depth;
	struct pki_fgraph_ent *e;
	uint64_t ts;
	struct alt a = {0};

	if (!d || t->unwinding || t->st == PKI_FGRAPH_GONE || sp & 7)
		return;
	ts = pki_trace_now();
	alt_get(t, &a);
	if (on_alt(&a, here) == on_alt(&a, sp) && sp <= here)
		return;
	while (d) {
		e = &t->st[d - 1];
		if (!dead(&a, e->slot, sp))
			break;
		pki_fgraph_ent_exit(t, d - 1, ts, NULL);
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		t->depth = --d;
	}
}

/*
 * The calling thread ends (its key destructor runs at @here): every entry is
 * a frame the thread left (returned from its start routine, pthread_exit()
 * or a cancellation unwound it), except those of the exit path itself, the
 * callers of the destructor that hooks hijacked after the unwinding: above
 * @here, their slot still holding their trampoline, unmarked.  The others'
 * exits now, innermost first; those stay, moved down.
 */
void pki_fgraph_thread_exit(unsigned long here)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;
	uint32_t d = t->depth, i, j;
	uint64_t ts = pki_trace_now();
	struct pki_fgraph_ent *e;

	for (i = d; i-- > 0;) {
		e = &t->st[i];
		if (e->slot & PKI_FGRAPH_MARK || e->slot < here ||
		    *(unsigned long *)e->slot != pki_fgraph_tramp(e)) {
			pki_fgraph_ent_exit(t, i, ts, NULL);
			e->slot = 0; /* gone */
		}
	}
	for (i = j = 0; i < d; i++)
		if (t->st[i].slot)
			t->st[j++] = t->st[i];
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	t->depth = j;
	t->unwinding = 0;
}
