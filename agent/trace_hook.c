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
#include "trace/fgraph.h"
#include "trace/fnstats.h"
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
 * -A/-R: @ip's spec in @ops's table (agent_args, args.c), or NULL.  The
 * table is written before the ops is registered and never changes while it
 * is: read without synchronisation.
 */
static inline const struct pki_argspec *args_find(const struct pk_ops *ops, unsigned long ip)
{
	const struct agent_args *a = (const struct agent_args *)ops;
	uint64_t h = agent_args_hash(ip, a->mask);

	while (a->slot[h].ip != ip) {
		if (!a->slot[h].ip)
			return NULL;
		h = (h + 1) & a->mask;
	}
	return a->slot[h].spec;
}

/* An entry event with the arguments -A asked for, and the return hijacked for -R's. */
void agent_on_entry_args(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			 struct pk_regs *regs)
{
	const struct agent_args *a = (const struct agent_args *)ops;
	const struct pki_argspec *spec;
	struct pki_trace_event d[PKI_DATA_MAX];
	unsigned n;

	(void)parent_ip;
	if (__builtin_expect(!agent_hook.active || pki_trace_busy, 0))
		return;
	spec = args_find(ops, ip);
	if (a->exits)
		pki_fgraph_prune((unsigned long *)regs->sp);
	n = spec ? pki_argcap_entry(spec, regs, a->vec, d) : 0;
	pki_trace_record_n(ip, a->exits ? PKI_EV_ENTRY : PKI_EV_CALL, pki_trace_now(), d, n);
	if (a->exits && spec && spec->ret)
		pki_fgraph_enter_args(ip, (unsigned long *)regs->sp, spec);
	else if (a->exits)
		pki_fgraph_enter(ip, (unsigned long *)regs->sp);
	if (__builtin_expect(ip == agent_hook.trigger, 0))
		PKI_SLOWCALL3(agent_trace_trigger, ip, 0, 0);
}
