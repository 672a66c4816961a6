// SPDX-License-Identifier: MIT
/*
 * Exit tracing: the shadow return stacks and what the return trampoline
 * calls.  See fgraph.h for the protocol and its limits.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "trace/argcap.h"
#include "trace/argcond.h"
#include "trace/fgraph.h"
#include "trace/fnstats.h"
#include "trace/hold.h"
#include "trace/trace.h"

__thread struct pki_fgraph_tls pki_fgraph_tls __attribute__((tls_model("initial-exec")));

#define GONE	  PKI_FGRAPH_GONE
#define STACK_LEN PKI_FGRAPH_STACK_LEN

static pthread_key_t key;
static bool key_made;

/*
 * Graves: the stacks of threads that ended with hijacked frames left, the
 * frames of the exit path that ran the key destructor.  Some of those never
 * return (start_thread, when libc is traced: it ends the thread with a
 * system call), so the stack cannot wait for its last entry to pop: it is
 * given to a later thread's first entry once its thread is gone (tgkill()
 * finds no such thread: the kernel is done with it).  A fork child's graves
 * are its parent's threads': reused once those are gone in the parent.  Lock-free, for a first
 * entry may be in a signal handler: a slot is claimed by compare-and-swap from NULL to CLAIMED,
 * filled, then published; taken by compare-and-swap back to NULL.
 */
#define GRAVES	64
#define CLAIMED ((struct pki_fgraph_ent *)2)

static struct {
	struct pki_fgraph_ent *st;
	pid_t pid, tid; /* the thread it was (a CLONE_VM child's getpid() is not its parent's) */
} graves[GRAVES];

unsigned long pki_fgraph_graves_full; /* dying stacks no grave took (freed at their last pop) */

static bool grave_put(struct pki_fgraph_ent *st)
{
	for (int i = 0; i < GRAVES; i++) {
		struct pki_fgraph_ent *none = NULL;

		if (!__atomic_compare_exchange_n(&graves[i].st, &none, CLAIMED, false,
						 __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			continue;
		graves[i].pid = getpid();
		graves[i].tid = (pid_t)syscall(SYS_gettid);
		__atomic_store_n(&graves[i].st, st, __ATOMIC_RELEASE);
		return true;
	}
	__atomic_add_fetch(&pki_fgraph_graves_full, 1, __ATOMIC_RELAXED);
	return false;
}

/* A stack whose thread is gone, or NULL.  Keeps errno. */
static struct pki_fgraph_ent *grave_take(void)
{
	int saved = errno;

	for (int i = 0; i < GRAVES; i++) {
		struct pki_fgraph_ent *st = __atomic_load_n(&graves[i].st, __ATOMIC_ACQUIRE);

		if (st == NULL || st == CLAIMED)
			continue;
		if (!syscall(SYS_tgkill, graves[i].pid, graves[i].tid, 0) || errno != ESRCH)
			continue; /* its thread runs yet */
		if (__atomic_compare_exchange_n(&graves[i].st, &st, NULL, false, __ATOMIC_ACQ_REL,
						__ATOMIC_RELAXED)) {
			errno = saved;
			return st;
		}
	}
	errno = saved;
	return NULL;
}

/*
 * Thread exit (key destructor).  The frames the thread left (its start
 * routine returned, or pthread_exit() unwound them) get their exits now, as
 * unwound (pki_fgraph_thread_exit).  Hijacked frames of the exit path
 * (libc's, traced with relocation in every object: the one that runs this
 * destructor) still return through the trampoline, so the stack stays, in a
 * grave (above) or, with every grave taken, until the last of them has
 * returned (stack_gone).  Functions hooked later (other destructors) are
 * not hijacked (cap stays 0).
 */
static void stack_release(void *arg)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;

	if (t->depth)
		pki_fgraph_thread_exit((unsigned long)__builtin_frame_address(0));
	t->cap = 0;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	if (t->depth) {
		t->dying = grave_put(arg) ? 2 : 1; /* 2: the grave frees it, not stack_gone */
		return;
	}
	t->st = GONE;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	munmap(arg, STACK_LEN);
}

/* The last hijacked frame of a dying thread returned: free its stack, unless a grave has it. */
static __attribute__((noinline)) void stack_gone(struct pki_fgraph_tls *t)
{
	struct pki_fgraph_ent *st = t->st;
	bool buried = t->dying == 2;

	t->dying = 0;
	t->st = GONE; /* before munmap: never hijacked now */
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	if (buried)
		return;
	pki_trace_busy++;
	munmap(st, STACK_LEN);
	pki_trace_busy--;
}

int pki_fgraph_init(void)
{
	int err;

	if (key_made)
		return 0;
	err = pthread_key_create(&key, stack_release);
	if (!err)
		err = pki_fgraph_ctx_init();
	if (err)
		return -err;
	key_made = true;
	return 0;
}

void (*pki_fgraph_probe_exit)(struct pki_fgraph_ent *e, void *regs);
unsigned long pki_fgraph_deep;

/*
 * First entry of a thread (reserve its stack: address space, touched as it
 * deepens), or the stack is full (count, do not hijack).
 */
__attribute__((noinline)) struct pki_fgraph_ent *pki_fgraph_push_slow(uint64_t fn, uint64_t probe,
								      unsigned long *slot)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;
	struct pki_fgraph_ent *st;

	if (!t->st) {
		pki_trace_busy++; /* mmap and the key are probekit's calls, not events */
		st = grave_take();
		if (!st)
			st = mmap(NULL, STACK_LEN, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (st != MAP_FAILED && !t->st) { /* not made by a signal handler meanwhile */
			t->st = st;
			if (key_made)
				pthread_setspecific(key, st); /* low key: no allocation */
			__atomic_signal_fence(__ATOMIC_SEQ_CST);
			t->cap = PKI_FGRAPH_DEPTH;
			pki_trace_busy--;
			return pki_fgraph_push(fn, probe, slot);
		}
		if (st != MAP_FAILED)
			munmap(st, STACK_LEN);
		pki_trace_busy--;
	} else if (t->st != GONE && t->cap && t->depth >= t->cap) {
		__atomic_add_fetch(&pki_fgraph_deep, 1, __ATOMIC_RELAXED);
	}
	return NULL; /* too deep, out of memory, or the thread is exiting */
}

bool pki_fgraph_timed;

/*
 * The exit at @ts of a frame of @fn entered at @start (0: pushed untimed,
 * by an earlier trace) whose callees took @child: an EXIT event, or with
 * pki_fgraph_timed its duration and self time, the duration added to the
 * child time of @caller (the caller's entry; NULL for none).
 */
static inline void exit_account(uint64_t fn, uint64_t start, uint64_t child, uint64_t ts,
				struct pki_fgraph_ent *caller)
{
	uint64_t dur;

	if (__builtin_expect(!pki_fgraph_timed, 1)) {
		pki_trace_record(fn, PKI_EV_EXIT, ts);
		return;
	}
	if (!start) {
		pki_fnstats_count(fn);
		return;
	}
	dur = ts > start ? ts - start : 0;
	if (caller)
		caller->child += dur;
	pki_fnstats_add(fn, dur, child < dur ? dur - child : 0);
}

/*
 * The entry whose callees' time entry @i's adds to: NULL if none, a
 * probe's (its words are its own) or a held call's (a trace's: the words
 * are its mark).
 */
static inline struct pki_fgraph_ent *caller_of(struct pki_fgraph_tls *t, uint32_t i)
{
	return i && !t->st[i - 1].probe && !t->st[i - 1].cond ? &t->st[i - 1] : NULL;
}

/*
 * A held call's exit (hold.h), as its condition says @keep: whether to
 * record its EXIT event.  Its cond is cleared first: an exit given twice
 * (a handler left the first by siglongjmp) is an ordinary frame's then.
 */
static bool held_end(struct pki_fgraph_ent *e, bool keep)
{
	struct pki_trace_event entry = {e->entry_ts, PKI_EV_WORD(e->fn, PKI_EV_ENTRY)};

	e->cond = 0;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	return PKI_SLOWCALL3(pki_trace_hold_end, e->mark, &entry, keep);
}

void pki_fgraph_ent_exit(struct pki_fgraph_tls *t, uint32_t i, uint64_t ts, void *regs)
{
	struct pki_fgraph_ent *e = &t->st[i];

	if (e->probe) {
		pki_fgraph_probe_exit(e, regs);
	} else if (__builtin_expect(e->cond != 0, 0)) {
		/* unwound: no return value to decide on, kept (under top: an earlier trace's) */
		if (held_end(e, true) && !pki_fgraph_timed)
			pki_trace_record(e->fn, PKI_EV_EXIT, ts);
	} else {
		exit_account(e->fn, e->ts, e->child, ts, caller_of(t, i));
	}
}

/*
 * The EXIT event at @ts of @e, which returns @ax / @x0, with the return
 * value its spec asks for (one item: a string's pieces at most).
 */
static void exit_args(struct pki_fgraph_ent *e, unsigned long ax, unsigned long x0, uint64_t ts)
{
	const struct pki_argspec *spec = (const struct pki_argspec *)(uintptr_t)e->args;
	struct pki_trace_event d[PKI_ARG_STR_MAX / 8];
	unsigned n;

	if (__builtin_expect(e->cond != 0, 0) &&
	    !held_end(e, pki_cond_eval_ret((const struct pki_cond *)(uintptr_t)e->cond, ax)))
		return; /* -F on retval: not this call (its entry voided) */
	if (__builtin_expect(pki_fgraph_timed, 0))
		return; /* (a held call of an earlier trace, returning under top) */
	n = spec->ret ? pki_argcap_ret(spec, ax, x0, d) : 0;
	pki_trace_record_n(e->fn, PKI_EV_EXIT, ts, d, n);
}

void pki_fgraph_ent_return(struct pki_fgraph_tls *t, uint32_t i, const struct pki_fgraph_return *r)
{
	struct pki_fgraph_ent *e = &t->st[i];

	if (!e->probe && ((e->args && !pki_fgraph_timed) || e->cond) && !r->regs)
		exit_args(e, r->ax, r->x0, r->ts);
	else
		pki_fgraph_ent_exit(t, i, r->ts, r->regs);
}

/*
 * The exit of the frame returning to @sp (its slot is sp - 8), with @regs
 * (pki_rettramp_regs') or not, and its entry popped; where to go.  Normally
 * the top entry; else the slow path (fgraph_ctx.c) finds it, below
 * abandoned frames or in another context.  The exit runs before depth
 * shrinks: after that a signal handler may reuse the entry's place.
 */
static inline unsigned long exit_frame(unsigned long sp, void *regs, unsigned long ax,
				       unsigned long x0)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;
	unsigned long slot = sp - 8, ret;
	uint32_t d = t->depth;
	struct pki_fgraph_ent *e = d ? &t->st[d - 1] : NULL;

	/* (a probe's frame, reached by the trampoline that saves no xmm: slow) */
	if (__builtin_expect(e && e->slot == slot && (regs || !e->probe), 1)) {
		ret = e->ret;
		if (e->probe) /* (no clock read: a probe's exit has no use for it) */
			pki_fgraph_probe_exit(e, regs);
		else if (__builtin_expect((e->args && !pki_fgraph_timed) || e->cond, 0))
			exit_args(e, ax, x0, pki_trace_now());
		else
			exit_account(e->fn, e->ts, e->child, pki_trace_now(), caller_of(t, d - 1));
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		t->depth = d - 1;
	} else { /* syscalls: may use xmm */
		struct pki_fgraph_return r = {sp, pki_trace_now(), regs, ax, x0};

		ret = PKI_SLOWCALL1(pki_fgraph_exit_slow, &r);
	}
	if (__builtin_expect(t->dying && !t->depth, 0))
		stack_gone(t);
	return ret;
}

unsigned long pki_fgraph_exit(unsigned long sp, unsigned long ax, unsigned long x0)
{
	return exit_frame(sp, NULL, ax, x0);
}

unsigned long pki_fgraph_exit_regs(unsigned long sp, void *regs)
{
	return exit_frame(sp, regs, 0, 0);
}

void pki_fgraph_own(struct pki_fgraph_ent *st)
{
	if (key_made)
		pthread_setspecific(key, st); /* low key: no allocation */
}

/*
 * Table-driven unwinding (fgraph.h).  A marked entry has bit 0 of its slot
 * set (slots are 8-byte aligned): pki_fgraph_exit() never matches it, which
 * is right, since its frame holds its real return address and cannot come
 * back through the trampoline until unwind_end re-arms it.
 *
 * Both run in normal context on the calling thread, which owns its stack
 * and its shadow entries.  A signal handler that traces functions meanwhile
 * pushes above `depth` and pops back to it before we resume (its frames are
 * nested in ours), so reading depth once and storing it last is enough, as
 * in pki_fgraph_exit().
 */
#define MARK PKI_FGRAPH_MARK

void pki_fgraph_unwind_begin(unsigned long cfa)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;
	uint32_t n = t->unwinding, lo, i;
	unsigned long *p;

	t->unwinding = n + 1;
	if (n >= PKI_FGRAPH_UNWIND_MAX || t->st == NULL || t->st == GONE)
		return;
	/*
	 * Only entries newer than the enclosing unwind: the older ones were put
	 * back by it, and the slots of the frames it already removed may now
	 * lie inside live frames (the cleanup that threw).  Top down, and only
	 * where the trampoline is: a tail call pushes two entries for one slot,
	 * the upper one saved the trampoline, the lower one the real address,
	 * which must be what stays.  An entry whose slot is below @cfa is a
	 * frame that was abandoned (longjmp) or lives on another stack: never
	 * written.
	 */
	lo = n ? t->base[n - 1] : 0;
	t->base[n] = t->depth;
	for (i = t->depth; i-- > lo;) {
		if (t->st[i].slot & MARK || t->st[i].slot < cfa)
			continue;
		p = (unsigned long *)t->st[i].slot;
		if (!pki_fgraph_is_tramp(*p))
			continue;
		*p = t->st[i].ret;
		t->st[i].slot |= MARK;
	}
}

void pki_fgraph_unwind_end(unsigned long cfa)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;
	uint32_t n = t->unwinding, lo, d, i, j;
	uint64_t ts;
	unsigned long slot, *p;

	if (n == 0)
		return; /* no unwind began here (one we do not wrap): nothing is marked */
	t->unwinding = --n;
	if (n >= PKI_FGRAPH_UNWIND_MAX || t->st == NULL || t->st == GONE)
		return;
	lo = n ? t->base[n - 1] : 0;
	d = t->depth;
	/* The removed frames' exits, innermost first. */
	ts = pki_trace_now();
	for (i = d; i-- > lo;) {
		slot = t->st[i].slot;
		if (slot & MARK && (slot & ~MARK) < cfa)
			pki_fgraph_ent_exit(t, i, ts, NULL);
	}
	/*
	 * Bottom up: the lower of two entries sharing a slot (a tail call)
	 * re-arms it first, and the upper one, which saved the trampoline,
	 * then finds what it saved.
	 */
	for (i = j = lo; i < d; i++) {
		slot = t->st[i].slot;
		if (slot & MARK) {
			slot &= ~MARK;
			if (slot < cfa)
				continue; /* removed: its exit is recorded */
			p = (unsigned long *)slot;
			if (*p != t->st[i].ret && *p != pki_fgraph_tramp(&t->st[i])) {
				if (t->st[i].cond && !t->st[i].probe)
					held_end(&t->st[i], true); /* (its hold released) */
				continue; /* the frame was rewritten: let it return untraced */
			}
			*p = pki_fgraph_tramp(&t->st[i]);
			t->st[i].slot = slot;
		}
		t->st[j++] = t->st[i];
	}
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	t->depth = j;
}

bool pki_fgraph_shstk(void)
{
	return PKI_SLOWCALL0(pki_arch_shstk); /* libc's open and read: not vector-free */
}
