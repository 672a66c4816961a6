// SPDX-License-Identifier: MIT
/*
 * The hot path of entry and exit hooks (doc/design/exit-hooks.md, X1-X5):
 * the ops callback that calls a fprobe's entry and hijacks the return, and
 * the exit that pki_rettramp_regs reaches.  Built vector-free
 * (-mgeneral-regs-only), so a PK_FPROBE_F_NOVEC fprobe's trampoline need
 * not save xmm0-7; its slow paths go through PKI_SLOWCALL (fgraph.h).
 * Runs in any context a hooked function does: no lock, no allocation.
 */
#include <errno.h>
#include <stddef.h>

#include "hook/fprobe_int.h"
#include "arch/arch.h"
#include "hook/gp.h"

struct pki_fprobe *pki_fprobe_table[PKI_FPROBE_MAX];
unsigned long pki_fprobe_dropped;

#define ADD(v) __atomic_add_fetch(&(v), 1, __ATOMIC_RELAXED)

/*
 * X1.  Counted (an ops body called us), at the outermost level.  Frames the
 * thread has left without returning get their exit first (fgraph.h's
 * prune), then the entry is pushed and filled, the entry callback writes
 * its words in place, and the return is hijacked last, unless declined.
 */
/* The entry callback, errno kept (the function may read it: perror). */
static inline int entry_call(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
			     struct pk_regs *regs, uint64_t *w)
{
	int saved = errno, ret = fp->entry(fp, ip, parent_ip, regs, w);

	errno = saved;
	return ret;
}

/* Entries without an exit: only an entry callback, or too deep (words of their own). */
static __attribute__((noinline)) void entry_alone(struct pk_fprobe *fp, unsigned long ip,
						  unsigned long parent_ip, struct pk_regs *regs)
{
	uint64_t scratch[PKI_FGRAPH_WORDS] = {0};

	if (fp->entry)
		entry_call(fp, ip, parent_ip, regs, scratch);
}

static inline void entry_of(struct pki_fprobe *p, unsigned long ip, unsigned long parent_ip,
			    struct pk_regs *regs)
{
	struct pk_fprobe *fp = p->fp;
	unsigned long *slot = (unsigned long *)regs->sp;
	struct pki_fgraph_ent *e;

	if (!fp->exit) {
		entry_alone(fp, ip, parent_ip, regs);
		return;
	}
	pki_fgraph_prune(slot);
	e = pki_fgraph_push(ip, p->handle, slot);
	if (__builtin_expect(!e, 0)) {
		ADD(p->deep);
		entry_alone(fp, ip, parent_ip, regs);
		return;
	}
	e->w[2] = e->w[3] = 0; /* push zeroed w[0..1] (ts, child) */
	if (fp->entry && entry_call(fp, ip, parent_ip, regs, e->w)) {
		pki_fgraph_cancel(e);
		return;
	}
	pki_fgraph_arm(e);
}

void pki_fprobe_entry(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		      struct pk_regs *regs)
{
	entry_of(ops->data, ip, parent_ip, regs);
}

void pki_fprobe_tramp_entry(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs,
			    void *arg)
{
	entry_of(arg, ip, parent_ip, regs);
}

/* X4: the fprobe's exit callback, counted; @r the return registers. */
static void call_exit(struct pki_fgraph_ent *e, struct pk_ret *r)
{
	struct pki_fprobe *p =
	    __atomic_load_n(&pki_fprobe_table[PKI_FPROBE_IDX(e->probe)], __ATOMIC_ACQUIRE);

	if (!p || p->handle != e->probe) {
		ADD(pki_fprobe_dropped); /* X5: unregistered since the entry */
		return;
	}
	int saved = errno; /* the function's, which its caller may read next */

	if (r->unwound)
		ADD(p->unwound);
	p->fp->exit(p->fp, e->fn, e->ret, r, e->w);
	errno = saved;
}

/*
 * X3.  From pki_rettramp_regs (uncounted: a counted section of our own), or
 * from a slow path that finds frames left without returning (@regs NULL):
 * inside an entry's body (counted already) or behind a trampoline.  At a
 * level above 0 the thread is inside a callback: skipped, as hooks are.
 */
static __attribute__((noinline)) void call_unwound(struct pki_fgraph_ent *e)
{
	struct pk_ret unwound = {.unwound = 1};

	call_exit(e, &unwound);
}

/* The exit at a level other than the outermost one: not run (X3). */
static __attribute__((noinline)) void not_run(const struct pki_fgraph_ent *e, int level)
{
	struct pki_fprobe *p =
	    __atomic_load_n(&pki_fprobe_table[PKI_FPROBE_IDX(e->probe)], __ATOMIC_ACQUIRE);

	if (level > 0 && p && p->handle == e->probe)
		ADD(p->skipped);
	else
		ADD(pki_fprobe_dropped); /* not counted: cannot look (X5) */
}

void pki_fprobe_exit(struct pki_fgraph_ent *e, void *regs)
{
	int level = pki_tramp_nest;
	bool mine = level < 0;

	if (mine)
		level = pki_gp_read_begin();
	if (__builtin_expect(level != 0, 0))
		not_run(e, level);
	else if (__builtin_expect(regs != NULL, 1))
		call_exit(e, regs);
	else
		call_unwound(e);
	if (mine && level >= 0)
		pki_gp_read_end();
}
