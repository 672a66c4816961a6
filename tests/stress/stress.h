/* SPDX-License-Identifier: MIT */
/*
 * What the stress test's three parts share: the hookable functions
 * (generated), the hooks (stress_cb.c, vector-free), and the per-thread
 * context through which a hook tells the calling thread that it ran.
 * Functions 0..199 are the checked sites; those after them (if any) the
 * background sites, which the background hooks only count.
 *
 * Result encoding: every hookable function returns its first argument x
 * (or x | PKS_BAD when another argument reached it corrupted).  Callers
 * pass x = 0, and each hook adds PKS_FIELD(h) to regs->di: field h (7 bits)
 * of the result counts the runs of hook h in that call.  Hooks 0..3 are the
 * ops slots, 4..7 the direct handlers pks_h0..pks_h3.
 */
#ifndef PKS_STRESS_H
#define PKS_STRESS_H

#include <stdatomic.h>

typedef unsigned long pks_fn(unsigned long x, unsigned long a, unsigned long b, unsigned long c,
			     unsigned long d, unsigned long e, double g);

#define PKS_KEY(i)	   (0x9e3779b97f4a7c15ul * ((unsigned long)(i) + 1))
#define PKS_BAD		   (1ul << 60)
#define PKS_NOPS	   4 /* ops slots: hooks 0..3 */
#define PKS_NDIRECT	   4 /* direct handlers: hooks 4..7 */
#define PKS_NHOOKS	   (PKS_NOPS + PKS_NDIRECT)
#define PKS_FIELD(h)	   (1ul << (7 * (h)))
#define PKS_FIELD_OF(r, h) (((r) >> (7 * (h))) & 0x7f)

extern const unsigned int pks_nfuncs;
extern pks_fn *const pks_funcs[];

/*
 * One per thread and one per thread's signal handler: the handler swaps
 * pks_ctx, so hooks that run inside it count apart from the call it
 * interrupted.  Written by hooks on the same thread only.
 */
struct pks_ctx {
	volatile unsigned long cur_ip; /* site of the call in progress */
	volatile unsigned long runs;   /* hook runs in that call */
	volatile unsigned long bad_ip; /* a hook saw an ip other than cur_ip */
	volatile int in_call;	       /* between setting cur_ip and the return */
	volatile unsigned long parent; /* parent_ip a hook got (the last one) */
	volatile unsigned long ret;    /* return address the function saw */
	/* The background hooks (--background): runs by kind, last ip and parent_ip. */
	volatile unsigned long bg_runs[2];
	volatile unsigned long bg_ip, bg_parent;
	/* Their exits (--background-exits): by kind, the last one's values. */
	volatile unsigned long bg_exits[2];
	volatile unsigned long bg_exit_ip, bg_exit_parent, bg_exit_ax, bg_exit_bad;
};

extern __thread struct pks_ctx *pks_ctx;

/* The data of every registered pk_ops (ops->data points to it). */
struct pks_opsdata {
	int slot;	    /* hook number 0..3 */
	atomic_int retired; /* set once the callback must never run again */
};

/* Callbacks that ran while their ops was retired (a broken promise). */
extern atomic_ulong pks_late_runs;
extern atomic_ulong pks_late_ip;
extern atomic_int pks_late_slot;

/*
 * The background hooks: kind 0 (PKS_BG_OPS) one ops, kind 1 (PKS_BG_DIRECT)
 * one trampoline's handler.  They only count (here and in the calling
 * thread's context): the function's result stays its own.
 */
#define PKS_BG_OPS    0
#define PKS_BG_DIRECT 1
extern atomic_ulong pks_bg_total[2];

struct pk_ops;
struct pk_regs;
void pks_ops_cb(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		struct pk_regs *regs);
void pks_h0(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs);
void pks_h1(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs);
void pks_h2(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs);
void pks_h3(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs);
void pks_bg_ops_cb(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		   struct pk_regs *regs);
void pks_bg_h(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs);

/*
 * The background hooks with exits (--background-exits): fprobes whose data
 * is the kind.  The entry counts as above and leaves ip and parent_ip in the
 * call's words; the exit counts in pks_bg_exits and the context, with what
 * it saw (bg_exit_bad: words that did not come from this call's entry, or
 * a frame reported as unwound).
 */
extern atomic_ulong pks_bg_exits[2];
struct pk_fprobe;
struct pk_ret;
int pks_bg_fp_entry(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		    struct pk_regs *regs, void *data);
void pks_bg_fp_exit(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		    struct pk_ret *ret, void *data);

#endif
