// SPDX-License-Identifier: MIT
/*
 * The stress test's hooks: one ops callback shared by the four ops slots and
 * four direct handlers.  Each adds its own field to the first argument
 * (which the function returns), counts the run in the calling thread's
 * context and checks the ip it was given against the call in progress.
 * And the two hooks of the background sites (--background), which only
 * count their runs, by kind, and note the ip and parent_ip they got.
 * Built with -mgeneral-regs-only so that ops may be registered with
 * PK_OPS_F_NOVEC and trampolines made with PK_TRAMP_F_NOVEC; async-signal-
 * safe, since hooked functions are also called from signal handlers.
 */
#include <probekit/fprobe.h>
#include <probekit/hook.h>

#include "stress.h"

__thread struct pks_ctx *pks_ctx;
atomic_ulong pks_late_runs;
atomic_ulong pks_late_ip;
atomic_int pks_late_slot;

static inline void count(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs, int hook)
{
	struct pks_ctx *c = pks_ctx;

	regs->di += PKS_FIELD(hook);
	if (!c)
		return;
	if (ip != c->cur_ip)
		c->bad_ip = ip;
	c->parent = parent_ip;
	c->runs++;
}

void pks_ops_cb(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops, struct pk_regs *regs)
{
	struct pks_opsdata *d = ops->data;

	if (atomic_load_explicit(&d->retired, memory_order_acquire)) {
		/* pk_ops_unregister() returned (or its txn was aborted). */
		if (atomic_fetch_add(&pks_late_runs, 1) == 0) {
			atomic_store(&pks_late_ip, ip);
			atomic_store(&pks_late_slot, d->slot);
		}
	}
	count(ip, parent_ip, regs, d->slot);
}

#define HANDLER(k)                                                                                 \
	void pks_h##k(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)             \
	{                                                                                          \
		count(ip, parent_ip, regs, PKS_NOPS + k);                                          \
	}
HANDLER(0)
HANDLER(1)
HANDLER(2)
HANDLER(3)

/* The background hooks: count, never touch the arguments. */
atomic_ulong pks_bg_total[2];

static inline void bg_count(unsigned long ip, unsigned long parent_ip, int kind)
{
	struct pks_ctx *c = pks_ctx;

	atomic_fetch_add_explicit(&pks_bg_total[kind], 1, memory_order_relaxed);
	if (!c)
		return;
	c->bg_runs[kind]++;
	c->bg_ip = ip;
	c->bg_parent = parent_ip;
}

void pks_bg_ops_cb(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		   struct pk_regs *regs)
{
	(void)ops;
	(void)regs;
	bg_count(ip, parent_ip, PKS_BG_OPS);
}

void pks_bg_h(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs)
{
	(void)regs;
	bg_count(ip, parent_ip, PKS_BG_DIRECT);
}

atomic_ulong pks_bg_exits[2];

int pks_bg_fp_entry(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		    struct pk_regs *regs, void *data)
{
	unsigned long *w = data;

	(void)regs;
	bg_count(ip, parent_ip, (int)(long)fp->data);
	w[0] = ip;
	w[1] = parent_ip;
	return 0;
}

void pks_bg_fp_exit(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		    struct pk_ret *ret, void *data)
{
	const unsigned long *w = data;
	int kind = (int)(long)fp->data;
	struct pks_ctx *c = pks_ctx;

	atomic_fetch_add_explicit(&pks_bg_exits[kind], 1, memory_order_relaxed);
	if (!c)
		return;
	c->bg_exits[kind]++;
	c->bg_exit_ip = ip;
	c->bg_exit_parent = parent_ip;
	c->bg_exit_ax = ret->ax;
	if (w[0] != ip || w[1] != parent_ip || ret->unwound)
		c->bg_exit_bad++;
}
