/* SPDX-License-Identifier: MIT */
/*
 * Exit tracing ("function graph", after the kernel's fgraph): a hook at a
 * function's entry calls pki_fgraph_enter(), which saves the return address
 * on a per-thread shadow return stack and replaces it with the return
 * trampoline (src/arch/x86_64/rettramp.S).  When the function returns, the
 * trampoline records the exit event into the trace recorder (trace.h), pops
 * the entry and jumps to the saved address.
 *
 * Shadow entries are (return address, address of the stack slot, fn).  At a
 * return the entry is the one whose slot is the returning frame's, searched
 * from the top: normally the top one.  A tail call from a traced function
 * into another one finds the trampoline already in the slot and pushes it
 * again: both exits are recorded, innermost first.
 *
 * Abandoned frames (longjmp, siglongjmp, a setcontext that does not come
 * back) are recognised by their slot (fgraph_ctx.c): an entry on the stack
 * the thread runs on (the thread's, or its alternate signal stack) whose
 * slot lies below the frame that returns (pki_fgraph_exit) or is entered
 * (pki_fgraph_prune), or an entry on the alternate stack when the thread
 * runs on the other, is a frame that can no longer return.  Its exit is
 * recorded then, before the event that revealed it, so no entry of a
 * trace lacks its exit and the shadow stack never fills with the dead.
 * The agent's longjmp() and siglongjmp() close them at the jump itself
 * (pki_fgraph_jump), with the stack pointer they restore.
 *
 * Stack switches (makecontext/swapcontext/setcontext, coroutines): each
 * context has its own shadow stack, as each task has in the kernel.  The
 * agent's swapcontext() and setcontext() call pki_fgraph_ctx_switch(): the
 * running context's entries are put aside under its ucontext_t, and those
 * of the context resumed taken back (a new one starts empty).  A return
 * whose slot is in no entry of the running context (a context resumed from
 * inside libc: uc_link at the end of a makecontext function) finds the
 * context put aside whose entries hold that slot, and takes it
 * (pki_fgraph_exit).  Only a return found nowhere still aborts.
 *
 * Limits (documented in doc/probekit.1):
 *  - depth: a thread has PKI_FGRAPH_DEPTH entries; deeper frames keep their
 *    entry event but are not hijacked: their exits are counted, in
 *    pki_fgraph_deep (and a trace's as lost events).
 *  - table-driven unwinding (C++ exceptions, backtrace()) reads return
 *    addresses from the stack, where it would find the trampoline, which has
 *    no caller.  Whoever starts such an unwind of the calling thread brackets
 *    it with pki_fgraph_unwind_begin/end (the agent wraps the unwinder's
 *    entry points and __cxa_begin_catch, agent/unwind.c, or hooks the
 *    unwinder's when injected, agent/unwind_hook.c): the original return
 *    addresses are put back for the unwinder, the frames it removed get their
 *    exit event at the catch, the frames that stay get the trampoline back.
 *  - stack switches that bypass swapcontext()/setcontext() (hand-written
 *    context switches, as boost.context's) are not told apart from a
 *    longjmp: the frames of the context left may be taken for abandoned.
 *  - a CET shadow stack would see every hijacked return as an attack:
 *    pki_fgraph_shstk() tells, and the caller must not hijack then.
 *
 * Vector registers: fgraph.c is built with -mgeneral-regs-only -DPKI_NOVEC,
 * so the return trampoline saves only rax and rdx (xmm0/xmm1, which hold
 * float results, are never touched); pki_fgraph_enter() is fit for a
 * PK_OPS_F_NOVEC hook when its caller is built the same way.  Slow paths
 * that call libc go through PKI_SLOWCALL* (arch/x86_64/vecsafe.h).
 *
 * Contexts: pki_fgraph_enter() and the trampoline run in any context a hook
 * does (signal handlers included): no lock, no malloc, no stdio; the first
 * call of a thread mmaps its stack (a syscall).  pki_fgraph_init() is normal
 * context, once, before the first pki_fgraph_enter().
 */
#ifndef PK_TRACE_FGRAPH_H
#define PK_TRACE_FGRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "arch/arch.h"
#include "trace/argspec.h"
#include "trace/trace.h"

/*
 * A thread's shadow stack: PKI_FGRAPH_DEPTH entries of address space,
 * reserved at its first entry and touched only as deep as it goes.
 */
#define PKI_FGRAPH_DEPTH     65536
#define PKI_FGRAPH_STACK_LEN (PKI_FGRAPH_DEPTH * sizeof(struct pki_fgraph_ent))
#define PKI_FGRAPH_GONE	     ((struct pki_fgraph_ent *)1)
#define PKI_FGRAPH_MARK	     1ul /* an entry whose frame an unwinder reads (unwind_begin) */
#define PKI_FGRAPH_WORDS     4	 /* per-call words of a probe entry */

/*
 * One hijacked frame.  @probe 0: exit tracing's (the trace recorder, or
 * fnstats when timed), @fn its event value; else a probe's (hook/fprobe.c
 * reads @probe, @fn is the site, @w the words its entry left), whose frame
 * returns through pki_rettramp_regs.  One cache line.
 */
struct pki_fgraph_ent {
	unsigned long ret;  /* the original return address */
	unsigned long slot; /* where it was on the stack */
	uint64_t fn;
	uint64_t probe;
	union {
		struct {
			uint64_t ts,
			    child; /* timed (pki_fgraph_timed): entry time, callees' time */
			/* a traced frame's struct pki_argspec whose return value its exit
			 * records (pki_fgraph_enter_args), or 0 */
			uint64_t args;
			/* a held call's struct pki_cond, decided at its exit (hold.h), or 0 */
			uint64_t cond;
		};
		struct {
			/* a held call's (cond): its entry event's time, its hold mark */
			uint64_t entry_ts, mark;
		};
		uint64_t w[PKI_FGRAPH_WORDS];
	};
};

/*
 * Where a probe entry's exit goes (set by the hook layer before its first
 * probe entry): @e leaves with the return registers @regs (a struct pk_ret),
 * or without returning when @regs is NULL.  Called with the entry still in
 * place; its caller pops it.
 */
extern void (*pki_fgraph_probe_exit)(struct pki_fgraph_ent *e, void *regs);

/* Entries that got no exit because the thread was PKI_FGRAPH_DEPTH deep. */
extern unsigned long pki_fgraph_deep;

/*
 * In-process statistics instead of a trace (`probekit top`, fnstats.h): the
 * exit of an entry pushed by pki_fgraph_enter_timed() adds its duration and
 * self time to fnstats rather than recording an EXIT event.  Set while no
 * hook runs (before the ops are registered, after they are unregistered).
 */
extern bool pki_fgraph_timed;

#define PKI_FGRAPH_UNWIND_MAX 8 /* nested unwinds (a throw inside a cleanup) tracked */

struct pki_fgraph_tls {
	struct pki_fgraph_ent *st; /* NULL until the first entry; (void *)1 after thread exit */
	uint32_t depth;		   /* entries in use */
	uint32_t cap;		   /* 0 until allocated, so the hot path tests one word */
	/* Unwinds in progress (pki_fgraph_unwind_begin without its end yet), and
	 * the depth when each began: entries below base[n - 1] belong to the
	 * enclosing unwinds and are not touched by the inner one. */
	uint32_t unwinding;
	uint32_t base[PKI_FGRAPH_UNWIND_MAX];
	/* Past the thread's key destructor with hijacked frames left (the exit
	 * path's own, when libc is traced): the last one's return frees st. */
	uint32_t dying;
	/* The alternate signal stack as the last slow path saw it (fgraph_ctx.c). */
	unsigned long alt_lo, alt_size;
};

extern __thread struct pki_fgraph_tls pki_fgraph_tls __attribute__((tls_model("initial-exec")));

/* The return trampolines (asm); their address replaces return addresses. */
void pki_rettramp(void);      /* exit tracing's: saves the general registers */
void pki_rettramp_regs(void); /* probes': and xmm0-7, the return registers in a struct pk_ret */

/* The trampoline an entry's frame returns through. */
static inline unsigned long pki_fgraph_tramp(const struct pki_fgraph_ent *e)
{
	return e->probe ? (unsigned long)pki_rettramp_regs : (unsigned long)pki_rettramp;
}

static inline bool pki_fgraph_is_tramp(unsigned long addr)
{
	return addr == (unsigned long)pki_rettramp || addr == (unsigned long)pki_rettramp_regs;
}

/*
 * Called by the trampolines: the exit, pop, where to go.  @regs: pk_ret, or
 * NULL; @ax, @x0: rax and xmm0's low 8 bytes as the function left them.
 */
unsigned long pki_fgraph_exit(unsigned long sp, unsigned long ax, unsigned long x0);
unsigned long pki_fgraph_exit_regs(unsigned long sp, void *regs);

/*
 * Entry @i of @t leaves at @ts: with its return registers @regs (a return
 * through pki_rettramp_regs), or without returning (NULL: unwound,
 * abandoned).  Its exit as a return would give it (an EXIT event,
 * in-process statistics, or the probe's exit), its duration counted in its
 * caller's.  Does not pop.
 */
void pki_fgraph_ent_exit(struct pki_fgraph_tls *t, uint32_t i, uint64_t ts, void *regs);

/* pki_fgraph_push(): the stack is full or not yet allocated. */
struct pki_fgraph_ent *pki_fgraph_push_slow(uint64_t fn, uint64_t probe, unsigned long *slot);

/* A return that pki_fgraph_exit() could not take on its fast path. */
struct pki_fgraph_return {
	unsigned long sp; /* as the function's ret left it */
	uint64_t ts;
	void *regs;	      /* a struct pk_ret (pki_rettramp_regs), or NULL */
	unsigned long ax, x0; /* rax and xmm0's low bytes (pki_rettramp) */
};

/* fgraph_ctx.c, behind the trampoline (PKI_SLOWCALL): the top entry is not @r->sp's. */
unsigned long pki_fgraph_exit_slow(const struct pki_fgraph_return *r);

/*
 * pki_fgraph_ent_exit() of the entry a return reached, returning @r's
 * values: a traced frame with a return value to record records it.
 */
void pki_fgraph_ent_return(struct pki_fgraph_tls *t, uint32_t i, const struct pki_fgraph_return *r);

/* fgraph_ctx.c: a frame is entered at @slot, at or above the top entry's, at @ts. */
void pki_fgraph_prune_slow(unsigned long *slot, uint64_t ts);

/* fgraph_ctx.c's part of pki_fgraph_init(): 0 or an errno (pthread_atfork). */
int pki_fgraph_ctx_init(void);

/* The calling thread's shadow stack is now @st (fgraph_ctx.c's switches). */
void pki_fgraph_own(struct pki_fgraph_ent *st);

/*
 * The calling thread leaves its context for @to (a ucontext_t): swapcontext
 * saves the one left in @from, setcontext passes NULL.  Before the real
 * call.  Normal context (or a signal handler that switches contexts).
 */
void pki_fgraph_ctx_switch(const void *from, const void *to);

/*
 * The calling thread jumps (longjmp, siglongjmp) to the frame whose stack
 * pointer will be @sp: the frames below it on that stack (and on the
 * alternate signal stack, when it leaves it) get their exit now.  Any
 * context.
 */
void pki_fgraph_jump(unsigned long sp);

/*
 * The calling thread's key destructor at @here (its frame): the entries of
 * frames it left get their exit, as unwound; those of the exit path that
 * called the destructor stay.  Normal context.
 */
void pki_fgraph_thread_exit(unsigned long here);

/* 0 or -errno (pthread key). */
int pki_fgraph_init(void);

/*
 * An unwinder is about to read the calling thread's stack from the frame
 * whose CFA is @cfa upwards (a throw, a rethrow, a backtrace): every
 * hijacked return slot at or above @cfa gets its original return address
 * back, and its entry is marked.  Entries stay: the frames are still there.
 */
void pki_fgraph_unwind_begin(unsigned long cfa);

/*
 * The unwind that began last is over, and the calling frame's CFA is @cfa
 * (a catch handler's __cxa_begin_catch, or the end of a backtrace).  Marked
 * entries whose slot is below @cfa belong to frames the unwinder removed:
 * their exits are recorded now, innermost first, and they are dropped.
 * Marked entries at or above @cfa are frames that stay: the trampoline goes
 * back into their slot, if the slot still holds the address that was put
 * back (else the entry is dropped: the frame was rewritten).  Entries that
 * were not marked are left to pki_fgraph_exit(), as before.
 */
void pki_fgraph_unwind_end(unsigned long cfa);

/* True if the calling thread runs with a CET user shadow stack. */
bool pki_fgraph_shstk(void);

/*
 * A frame is entered at @slot (struct pk_regs.sp), before its entry event:
 * if it is not below the top entry's frame, or the top one is on the
 * alternate signal stack and it is not, the entries it reveals as abandoned
 * get their exit first (pki_fgraph_prune_slow).  Not while an
 * unwinder reads the stack (unwind_begin/end own the entries then).
 */
static inline void pki_fgraph_prune(unsigned long *slot)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;
	unsigned long s = (unsigned long)slot, top;
	uint32_t d = t->depth;

	if (__builtin_expect(!d || t->unwinding, 1))
		return;
	top = t->st[d - 1].slot;
	/* Not below the top frame, or off the alternate stack the top frame is on. */
	if (__builtin_expect(
		s >= top || (top - t->alt_lo < t->alt_size && s - t->alt_lo >= t->alt_size), 0))
		PKI_SLOWCALL2(pki_fgraph_prune_slow, slot, pki_trace_now()); /* syscall: xmm */
}

/*
 * The next entry of the calling thread, for the frame whose return address
 * is at @slot (struct pk_regs.sp): filled, not armed (the frame still
 * returns to its caller).  NULL: the thread is PKI_FGRAPH_DEPTH deep (counted
 * in pki_fgraph_deep), out of memory or exiting.  Signal safety: the entry
 * is reserved (depth++) before it is filled, so a signal handler that hooks
 * functions meanwhile pushes above it and pops back to it.
 */
static inline struct pki_fgraph_ent *pki_fgraph_push(uint64_t fn, uint64_t probe,
						     unsigned long *slot)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;
	struct pki_fgraph_ent *e;
	uint32_t d = t->depth;

	if (__builtin_expect(d >= t->cap, 0)) /* mmap: may use xmm */
		return (struct pki_fgraph_ent *)PKI_SLOWCALL3(pki_fgraph_push_slow, fn, probe,
							      slot);
	t->depth = d + 1;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	e = &t->st[d];
	e->ret = *slot;
	e->slot = (unsigned long)slot;
	e->fn = fn;
	e->probe = probe;
	e->ts = 0; /* untimed: a timed exit only counts it (a trace's frame returning under top) */
	e->child = 0;
	e->args = 0;
	e->cond = 0;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	return e;
}

/* The frame of @e, just pushed, returns through its trampoline: the slot is written last. */
static inline void pki_fgraph_arm(const struct pki_fgraph_ent *e)
{
	*(unsigned long *)e->slot = pki_fgraph_tramp(e);
}

/* @e, the calling thread's top entry, is dropped unarmed. */
static inline void pki_fgraph_cancel(const struct pki_fgraph_ent *e)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;

	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	t->depth = (uint32_t)(e - t->st);
}

/* Hijack the return of the function whose entry is being hooked, for exit tracing. */
static inline void pki_fgraph_enter(uint64_t fn, unsigned long *slot)
{
	struct pki_fgraph_ent *e = pki_fgraph_push(fn, 0, slot);

	if (__builtin_expect(e != NULL, 1))
		pki_fgraph_arm(e);
	else if (pki_fgraph_tls.cap || !pki_fgraph_tls.st)
		pki_trace_count_lost(); /* this exit is not seen (past the thread's end: not asked)
					 */
}

/*
 * pki_fgraph_enter() for a function whose return value the trace records,
 * as @spec's last item says (trace/argcap.h): @spec must live until no
 * frame can return through it (the session's end).
 */
static inline void pki_fgraph_enter_args(uint64_t fn, unsigned long *slot,
					 const struct pki_argspec *spec)
{
	struct pki_fgraph_ent *e = pki_fgraph_push(fn, 0, slot);

	if (__builtin_expect(e != NULL, 1)) {
		e->args = (uint64_t)(uintptr_t)spec;
		pki_fgraph_arm(e);
	} else if (pki_fgraph_tls.cap || !pki_fgraph_tls.st) {
		pki_trace_count_lost();
	}
}

/*
 * pki_fgraph_enter() for pki_fgraph_timed: the entry keeps @ts, its entry
 * time, and the time of its callees, added as they return.
 */
static inline void pki_fgraph_enter_timed(uint64_t fn, unsigned long *slot, uint64_t ts)
{
	struct pki_fgraph_tls *t = &pki_fgraph_tls;
	uint32_t d = t->depth;

	pki_fgraph_enter(fn, slot);
	if (__builtin_expect(t->depth == d + 1, 1)) {
		t->st[d].ts = ts;
		t->st[d].child = 0;
	}
}

#endif /* PK_TRACE_FGRAPH_H */
