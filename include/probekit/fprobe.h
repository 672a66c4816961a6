/* SPDX-License-Identifier: MIT */
/*
 * Entry and exit hooks (the kernel's fprobe is the model): one registration
 * gives a callback at the entry of every function its filter names and one
 * at each of their returns, with a few words of per-call data the entry
 * leaves for the exit.  Built on ops (hook.h) and on the return hijack of
 * exit tracing; doc/design/exit-hooks.md holds the protocol (labels X1-X8).
 *
 * The exit callback sees the function's return registers and may change
 * them: the caller then receives the new values.  The entry callback sees
 * and may change the arguments (struct pk_regs, as an ops does), by its
 * return value decline the exit of this call, and skip the function with a
 * return value of its choice (pk_regs_skip(), hook.h): the exit callback,
 * unless declined, then sees that value.
 *
 * Frames that never return (longjmp, siglongjmp, a C++ exception caught
 * above them, a thread that ends inside them): their exit callback runs
 * with ret->unwound = 1 once the thread is seen past them (at the jump, at
 * the catch, at thread exit, or at its next hooked entry or return that
 * shows it), never with a return value, innermost first.
 *
 * Unregistering never waits for pending exits: it returns after one grace
 * period (no thread is inside either callback then), and the frames still
 * on some stack return normally, without their exit callback; they are
 * counted (pk_fprobe_stats.dropped, for the process).
 *
 * Limits: a thread keeps at most PK_FPROBE_DEPTH hijacked frames (of every
 * fprobe, and of `probekit trace`'s exits when the agent is the user); an
 * entry past it runs its entry callback but gets no exit, counted as
 * `deep`.  A CET user shadow stack would see every hijacked return as an
 * attack: registering an exit callback in a thread that runs with one is
 * refused (-EOPNOTSUPP).  Functions whose return cannot be replaced are
 * refused with an exit callback (-EINVAL, the log names them): those that
 * return twice or on another stack (setjmp, sigsetjmp, vfork, the context
 * functions) and those that read their own return address (dlopen,
 * dlmopen, dlsym, dlvsym, dl_iterate_phdr).  C++ exceptions, backtrace(),
 * swapcontext(), pthread_exit() and pthread_cancel() across a pending exit
 * work where
 * libprobekit.so comes before libstdc++ and libc in the lookup order (a
 * program linked with -lprobekit: doc/design/exit-hooks.md, X8); loaded by
 * dlopen(), or with a statically linked unwinder, an exception thrown
 * through a pending exit ends the program in std::terminate.
 *
 * Registers: the exit callback runs with xmm0-7 saved (xmm0 and xmm1 are in
 * struct pk_ret), not xmm8-15, the upper halves of ymm/zmm, nor the x87
 * stack: like an ops callback (hook.h), it must leave xmm8-15 alone, and a
 * function returning a __m256 in ymm0 or a long double in st0 must not be
 * given an exit callback that touches them (libc's AVX string functions
 * clear the upper halves).  errno is kept across both callbacks.
 *
 * Contexts: as hook.h.  The callbacks run on the thread that called the
 * function, in whatever context it runs (signal handlers included); while
 * a thread runs one, the hooks it reaches are skipped.
 */
#ifndef PROBEKIT_FPROBE_H
#define PROBEKIT_FPROBE_H

#include <stddef.h>

#include <probekit/hook.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Per-call data the entry callback leaves for the exit callback, at most. */
#define PK_FPROBE_DATA_MAX 32
/* Hijacked frames a thread keeps at most (deeper calls get no exit). */
#define PK_FPROBE_DEPTH 65536

/*
 * The return registers at a function's return.  Writes to ax, dx, xmm0 and
 * xmm1 are what the caller receives (xmm0/xmm1 as raw bits: a double result
 * is xmm0[0]).  When @unwound is set the frame did not return (see above):
 * the values are 0 and writes go nowhere.
 */
struct pk_ret {
	unsigned long ax, dx;
	unsigned long xmm0[2], xmm1[2];
	unsigned long sp;      /* the stack pointer after the return */
	unsigned int unwound;  /* 1: the frame was left without returning */
	unsigned int reserved; /* 0 */
};

struct pk_fprobe;

/*
 * At entry.  @data: the call's PK_FPROBE_DATA_MAX bytes (data_size of them
 * are meant for it), passed to its exit.  Return 0 for the exit callback to
 * run at this call's return, nonzero to decline it.
 */
typedef int (*pk_fprobe_entry_fn)(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
				  struct pk_regs *regs, void *data);

/* At the return of a call whose entry did not decline (or at its unwinding). */
typedef void (*pk_fprobe_exit_fn)(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
				  struct pk_ret *ret, void *data);

/* PK_FPROBE_F_NOVEC: both callbacks are vector-free (as PK_OPS_F_NOVEC). */
#define PK_FPROBE_F_NOVEC 0x1ul

/*
 * Sized (probekit.h): declare it with PK_OPTS(pk_fprobe, name, .exit = ...,
 * .filter = PK_OPTS_INIT(pk_ops_filter, ...)).  As an ops (hook.h), the
 * library keeps a pointer to it while it is registered (the callbacks get
 * it back), and reads its first-version fields there: do not change them
 * while it is registered.
 */
struct pk_fprobe {
	size_t sz;		  /* sizeof(struct pk_fprobe), PK_OPTS fills it */
	pk_fprobe_entry_fn entry; /* or NULL: every call's exit runs */
	pk_fprobe_exit_fn exit;	  /* or NULL: entries only */
	void *data;		  /* for the user */
	unsigned long flags;	  /* PK_FPROBE_F_*, or 0 */
	size_t data_size;	  /* 0..PK_FPROBE_DATA_MAX */
#ifdef __cplusplus
	void *private_;
#else
	void *private; /* the library's; NULL before registration */
#endif
	/* As an ops' (hook.h: PK_OPTS_INIT(pk_ops_filter, ...)), and last. */
	struct pk_ops_filter filter;
};

/*
 * Hook every function @fp's filter names (as pk_ops_register()).  Errors:
 * those of pk_ops_register(), and -EINVAL (@fp NULL, no callback, data_size
 * too large, unknown flags, @fp->sz or @fp->filter.sz too small, a filter
 * that runs past @fp->sz, or a field of either this library does not know
 * set: probekit.h; an exit callback on a function that returns twice: the
 * log names it), -EBUSY (registered already, or inside a transaction),
 * -EOPNOTSUPP (an exit callback on a thread with a CET shadow stack),
 * -ENOSPC (too many fprobes registered at once: 65,536), -ENOMEM.  On
 * error nothing changed.
 */
PK_API int pk_fprobe_register(struct pk_fprobe *fp);

/*
 * Unhook @fp.  When it returns 0 neither callback runs on any thread nor
 * will run again: @fp may be freed.  Pending exits are dropped (above).
 * Errors: -ENOENT (not registered), -EDEADLK (from a callback), -EBUSY
 * (inside a transaction), a patch errno (still registered).
 */
PK_API int pk_fprobe_unregister(struct pk_fprobe *fp);

/*
 * A trampoline (hook.h, pk_tramp_new()) that runs @fp's entry and exit
 * callbacks, for pk_direct_add(): direct entries with exit hooks.  @fp is
 * as for pk_fprobe_register() but its filter must be empty (its sites are
 * those whose direct address the trampoline becomes; pk_direct_add()
 * refuses it, -EINVAL, on a function that cannot have an exit).  Everything
 * above holds for its calls: per-call words, declined exits, frames left
 * without returning, pk_regs_skip(), pk_fprobe_stats(@fp).  pk_tramp_free()
 * ends it after a grace period (neither callback is running then: @fp may
 * be freed; pending exits are dropped), and refuses from a callback
 * (-EDEADLK).  pk_fprobe_unregister() refuses @fp (-EINVAL).  NULL and
 * errno on error: EINVAL (@fp NULL, no callback, data_size too large,
 * unknown flags, @fp->sz or @fp->filter.sz too small, a filter that runs
 * past @fp->sz, a field this library does not know set, a filter that is
 * not empty), EBUSY (@fp registered or a trampoline's already), EOPNOTSUPP
 * (as pk_fprobe_register()), ENOSPC (65,536 fprobes already), or
 * pk_tramp_new()'s: ENOMEM, ERANGE, a mapping's errno.
 */
PK_API struct pk_tramp *pk_fprobe_tramp_new(struct pk_fprobe *fp);

/* Sized (probekit.h): declare it with PK_OPTS(pk_fprobe_stats, st). */
struct pk_fprobe_stats {
	size_t sz;	       /* sizeof(struct pk_fprobe_stats), PK_OPTS fills it */
	unsigned long unwound; /* exit callbacks run for frames left without returning */
	unsigned long deep;    /* entries that got no exit: the thread was PK_FPROBE_DEPTH deep */
	unsigned long skipped; /* exits not run: the thread was inside a callback */
	unsigned long
	    dropped; /* process-wide: frames that returned after their fprobe's unregister */
};

/*
 * Counters of @fp since it was registered; @fp NULL: `dropped` alone.
 * @st is filled up to its sz (probekit.h), which becomes the bytes filled.
 * Errors: -EINVAL (@st NULL, or @st->sz too small: nothing is written),
 * -ENOENT (@fp is not registered: `dropped` is still filled in).
 */
PK_API int pk_fprobe_stats(const struct pk_fprobe *fp, struct pk_fprobe_stats *st);

#ifdef __cplusplus
}
#endif

#endif /* PROBEKIT_FPROBE_H */
