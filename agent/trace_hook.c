// SPDX-License-Identifier: MIT
/*
 * The trace mode's hook (the hot path of `probekit trace`), alone in its
 * file because it is built with -mgeneral-regs-only -DPKI_NOVEC: it and the
 * inline recorder and fgraph code it uses never touch a vector or x87
 * register, so its ops is registered with PK_OPS_F_NOVEC and the trampoline
 * skips saving xmm0-7.  Slow paths that enter libc (first event of a thread,
 * shadow stack allocation) go through PKI_SLOWCALL*, which saves them.
 *
 * Runs in any context a hooked function runs in, signal handlers included:
 * see src/trace/trace.h and src/trace/fgraph.h for why that is safe.
 */
#include <probekit/hook.h>

#include "agent_int.h"
#include "trace/argcap.h"
#include "trace/argcond.h"
#include "trace/fgraph.h"
#include "trace/fnstats.h"
#include "trace/hold.h"
#include "trace/trace.h"

struct agent_hook agent_hook;

/* Entry event, and the return hijacked so the trampoline records the exit. */
void agent_on_entry_exit(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			 struct pk_regs *regs)
{
	(void)parent_ip;
	(void)ops;
	if (__builtin_expect(!agent_hook.active || pki_trace_busy, 0))
		return;				     /* (busy: probekit's own call, trace.h) */
	pki_fgraph_prune((unsigned long *)regs->sp); /* abandoned frames' exits first */
	pki_trace_enter(ip);
	pki_fgraph_enter(ip, (unsigned long *)regs->sp);
	if (__builtin_expect(ip == agent_hook.trigger, 0))
		PKI_SLOWCALL3(agent_trace_trigger, ip, 0, 0); /* libc: may use xmm */
}

/*
 * Is @addr in PROG's own text (agent_hook.main_lo/hi, set before the hooks
 * are)?  A call that returns there, or a traced function of PROG's tail
 * call, is PROG's library call (libcalls.c).
 */
static inline bool in_prog(unsigned long addr)
{
	return addr - agent_hook.main_lo < agent_hook.main_hi - agent_hook.main_lo;
}

/*
 * LC3: a tail call from a traced function (jmp fflush) returns where that
 * function would have: into the trampoline that hijacked its return slot.
 * The call is that function's: the shadow entry of the same slot names it
 * (the entries above, at lower slots, are frames left without their exits).
 */
static __attribute__((noinline)) unsigned long tail_caller(unsigned long parent_ip,
							   unsigned long slot)
{
	const struct pki_fgraph_tls *t = &pki_fgraph_tls;

	if (!t->cap || t->st == (void *)1) /* none yet, or the thread is gone */
		return parent_ip;
	for (uint32_t i = t->depth; i-- > 0;) {
		if (t->st[i].slot == slot)
			return t->st[i].fn;
		if (t->st[i].slot > slot)
			break;
	}
	return parent_ip;
}

static inline bool from_prog(unsigned long parent_ip, const struct pk_regs *regs)
{
	if (__builtin_expect(pki_fgraph_is_tramp(parent_ip), 0))
		parent_ip = tail_caller(parent_ip, regs->sp);
	return in_prog(parent_ip);
}

/* LC2: a library call of PROG's: as agent_on_entry_exit; a library's own: nothing. */
void agent_on_libcall(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		      struct pk_regs *regs)
{
	if (from_prog(parent_ip, regs))
		agent_on_entry_exit(ip, parent_ip, ops, regs);
}

/* The same for a function whose exit is not taken (lib_entry_only, --entry-only). */
void agent_on_libcall_entry(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			    struct pk_regs *regs)
{
	if (from_prog(parent_ip, regs))
		agent_on_entry(ip, parent_ip, ops, regs);
}

/* top: the entry's time kept, the exit adds the call to fnstats (fgraph.h). */
void agent_on_entry_timed(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			  struct pk_regs *regs)
{
	(void)parent_ip;
	(void)ops;
	if (__builtin_expect(!agent_hook.active || pki_trace_busy, 0))
		return;
	pki_fgraph_prune((unsigned long *)regs->sp);
	pki_fgraph_enter_timed(ip, (unsigned long *)regs->sp, pki_trace_now());
}

/* top --entry-only, and libraries' relocated functions: calls counted, not timed. */
void agent_on_entry_count(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			  struct pk_regs *regs)
{
	(void)parent_ip;
	(void)ops;
	(void)regs;
	if (__builtin_expect(!agent_hook.active || pki_trace_busy, 0))
		return;
	pki_fnstats_count(ip);
}

/* --entry-only. */
void agent_on_entry(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		    struct pk_regs *regs)
{
	(void)parent_ip;
	(void)ops;
	(void)regs;
	if (__builtin_expect(!agent_hook.active || pki_trace_busy, 0))
		return;
	pki_trace_call_only(ip);
	if (__builtin_expect(ip == agent_hook.trigger, 0))
		PKI_SLOWCALL3(agent_trace_trigger, ip, 0, 0);
}

/*
 * -A/-R: @ip's slot in @ops's table (agent_args, args.c), or NULL.  The
 * table is written before the ops is registered and never changes while it
 * is: read without synchronisation.
 */
static inline const struct agent_args_slot *args_find(const struct pk_ops *ops, unsigned long ip)
{
	const struct agent_args *a = (const struct agent_args *)ops;
	uint64_t h = agent_args_hash(ip, a->mask);

	while (a->slot[h].ip != ip) {
		if (!a->slot[h].ip)
			return NULL;
		h = (h + 1) & a->mask;
	}
	return &a->slot[h];
}

/* An entry whose spec reads memory (strings, stack words): the general capture. */
static __attribute__((noinline)) void args_entry_slow(unsigned long ip, unsigned kind, uint64_t ts,
						      const struct pki_argspec *spec,
						      const struct pk_regs *regs, bool vec)
{
	struct pki_trace_event d[PKI_DATA_MAX];
	unsigned n = pki_argcap_entry(spec, regs, vec, d);

	pki_trace_record_n(ip, kind, ts, d, n);
}

/*
 * The event of @ip's call at @ts with the arguments @sl's spec asks for.
 * Register values only (the slot's plan): a few loads into the DATA
 * events, recorded with the event as one.
 */
static inline __attribute__((always_inline)) void args_entry(unsigned long ip, unsigned kind,
							     uint64_t ts,
							     const struct agent_args_slot *sl,
							     const struct pk_regs *regs, bool vec)
{
	if (__builtin_expect(sl && sl->nreg != AGENT_ARGS_SLOW, 1)) {
		struct pki_trace_event d[AGENT_ARGS_REGS];

		for (unsigned i = 0; i < sl->nreg; i++) {
			d[i].ts = *(const uint64_t *)((const char *)regs + sl->off[i]);
			d[i].word = PKI_EV_DATA_WORD(sl->item[i], 8, 0);
		}
		pki_trace_record_n(ip, kind, ts, d, sl->nreg);
	} else if (sl) {
		args_entry_slow(ip, kind, ts, sl->spec, regs, vec);
	} else {
		pki_trace_record(ip, kind, ts);
	}
}

/*
 * A call whose -F condition has terms on retval: held (trace/hold.h H1)
 * from its entry event to its return, which decides (src/trace/fgraph.c).
 * Its shadow entry is pushed first, so that from the hold's start on the
 * hold ends with the frame, whichever way it ends.  A call whose return
 * cannot be seen (too deep) is not held: recorded, its exit counted lost.
 */
static __attribute__((noinline)) void args_entry_held(unsigned long ip,
						      const struct agent_args_slot *sl,
						      const struct pk_regs *regs, bool vec)
{
	struct pki_fgraph_ent *e = pki_fgraph_push(ip, 0, (unsigned long *)regs->sp);
	uint64_t ts;

	if (__builtin_expect(!e, 0)) {
		args_entry(ip, PKI_EV_ENTRY, pki_trace_now(), sl, regs, vec);
		if (pki_fgraph_tls.cap || !pki_fgraph_tls.st)
			pki_trace_count_lost(); /* (as pki_fgraph_enter()) */
		return;
	}
	e->args = (uint64_t)(uintptr_t)sl->spec;
	e->mark = PKI_SLOWCALL0(pki_trace_hold_begin);
	e->entry_ts = ts = pki_trace_now();
	if (e->mark) /* (else not held: an ordinary frame, its entry recorded as any) */
		e->cond = (uint64_t)(uintptr_t)sl->cond;
	args_entry(ip, PKI_EV_ENTRY, ts, sl, regs, vec);
	pki_fgraph_arm(e);
}

/*
 * An entry event with the arguments -A asked for, and the return hijacked
 * for -R's; -F's condition first.
 */
void agent_on_entry_args(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			 struct pk_regs *regs)
{
	const struct agent_args *a = (const struct agent_args *)ops;
	const struct agent_args_slot *sl;
	unsigned kind = a->exits ? PKI_EV_ENTRY : PKI_EV_CALL;

	(void)parent_ip;
	if (__builtin_expect(!agent_hook.active || pki_trace_busy, 0))
		return;
	sl = a->one ? a->one : args_find(ops, ip);
	if (sl && sl->cond && !pki_cond_eval(sl->cond, regs))
		return; /* -F: not this call; nothing recorded, its exit not hijacked */
	if (a->exits)
		pki_fgraph_prune((unsigned long *)regs->sp);
	if (__builtin_expect(sl && sl->cond && sl->cond->ret && a->exits, 0)) {
		args_entry_held(ip, sl, regs, a->vec);
	} else {
		args_entry(ip, kind, pki_trace_now(), sl, regs, a->vec);
		if (a->exits && sl && sl->spec->ret)
			pki_fgraph_enter_args(ip, (unsigned long *)regs->sp, sl->spec);
		else if (a->exits)
			pki_fgraph_enter(ip, (unsigned long *)regs->sp);
	}
	if (__builtin_expect(ip == agent_hook.trigger, 0))
		PKI_SLOWCALL3(agent_trace_trigger, ip, 0, 0);
}
