/* SPDX-License-Identifier: MIT */
/*
 * Function-entry hooks.  A site is the 5-byte patchable instruction at the
 * entry of a function built with -fpatchable-function-entry=5 (or -mfentry
 * -mnop-mcount).  Two ways to attach code to sites:
 *
 *  - ops (like the kernel's struct ftrace_ops): a C callback run at entry of
 *    every site in its filter; several ops may share a site.  One ops alone on
 *    a site is called through a trampoline specialised for it; a site with
 *    several goes through one shared list dispatcher.
 *  - direct entries {ip, addr}: the site calls @addr straight away.  All
 *    direct entries belong to ONE internal ops owning an ip->addr hash, so
 *    adding, removing or retargeting any number of them is a hash update and
 *    one batch of text pokes, never a grace-period wait per site.  When a site
 *    has a direct entry and ops, the list dispatcher runs every ops and then
 *    continues into @addr.
 *
 * Every call below is one patch batch, unless made between pk_txn_begin()
 * and pk_txn_commit(), which group any number of them into one batch.
 * Batches write no INT3 and signal no thread for gcc's sleds (sled relays),
 * for relocated sites and INT3 sites of 5 bytes or more (jump relays:
 * byte 0 alone changes; see doc/design/reloc-sites.md, RS2 and RS5a) and
 * for sites inside one cache line, and
 * then never wait for another thread: the patching part of a call is a few
 * system calls (membarrier, and the first time a relay slot's 64 KiB of a
 * stretch of text is needed, mmap, and an alias or /proc/self/mem writes).
 * The remaining sites (a relocated or sled site whose relay slot's place is
 * taken by another mapping, a patchable site no single store covers, an
 * INT3 site the jump relay does not serve: its breakpoint) take the INT3
 * protocol, which waits at most 20 ms (and one more look at the
 * threads) for threads that block SIGTRAP and 2 s for the sled kick, and
 * whose errnos the calls below reflect: -EDEADLK when a thread still blocks
 * SIGTRAP after 20 ms (an INT3 would kill the process; the message names
 * it), -ETIMEDOUT when a thread inside a site's bytes neither answered the
 * kick nor slept in 2 s; the batch then changes nothing.  A call's other
 * wait is its grace period (below).
 *
 * Contexts: none of these functions may be called from a hook callback, a
 * trampoline handler or a signal handler (-EDEADLK from a callback).
 *
 * Recursion: while a thread runs a callback or a pk_tramp_new() handler,
 * the callbacks and handlers of the hooks it reaches are skipped (a user's
 * own direct @addr still runs: the list dispatcher always continues into it).
 *
 * Grace periods (pk_ops_unregister, pk_direct_sync, and the background
 * reclaim behind pk_direct_del): each thread of the process must be seen
 * outside every library trampoline and callback.  No thread is ever
 * signalled for it: one membarrier() orders every running thread, then the
 * library reads each thread's hook-nesting counter, and a thread found
 * inside a hook reports at its next hook exit.  So a blocked thread's
 * nanosleep, epoll_wait, ... never fail with EINTR because of us, and
 * threads that block every signal are no different from others; only a
 * thread that stays inside a callback delays a grace period (until it
 * returns).  A thread's first hooked call registers it (once); calls a
 * thread makes after its thread-specific-data destructors ran (at exit)
 * run unhooked.  Where membarrier() is refused (seccomp, kernels before
 * 4.14), every hooked call pays a locked increment instead. The ip passed to callbacks and
 * handlers is the site's (the function's address, or 4 bytes after it behind an endbr64). Objects
 * loaded later (dlopen): on pk_sites_refresh(), every registered ops whose filter has globs or is
 * empty (all sites) takes the matching sites of the new objects (ops filtered by ips only do not
 * change).  After dlclose, call pk_sites_refresh() before any other hook call: the object's sites
 * are then forgotten (their text is never written again).  A refresh inside a transaction applies
 * when the transaction ends.  Hooking an object while another thread dlcloses it is not supported.
 *
 * fork(): the child has only the calling thread, the committed hooks, and its
 * own private copy of every trampoline (made at fork: the parent freeing or
 * reusing a trampoline never changes what the child runs, nor the other way
 * round).  A transaction another thread had open is dropped in the child; the
 * calling thread's own stays open in parent and child.  Every call, grace
 * periods and deferred reclaims work in the child.  fork() waits for a hook
 * call in flight in another thread (not for an open transaction), at most
 * 2 s; past that, every call in the child fails with -ENOTRECOVERABLE (its
 * inherited hooks keep working).  vfork()/posix_spawn() children share the
 * parent's memory until they exec: nothing to do.  A raw clone() without
 * CLONE_VM skips the atfork handlers: do not hook in such a child.
 */
#ifndef PROBEKIT_HOOK_H
#define PROBEKIT_HOOK_H

#include <stddef.h>

#include <probekit/probekit.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The registers of the hooked function at its entry.  A callback may change
 * the six argument registers: the function then runs with the new values.
 */
struct pk_regs {
	unsigned long di, si, dx, cx, r8, r9; /* integer arguments 1..6 */
	unsigned long ax; /* number of vector registers used by a varargs call */
	unsigned long sp; /* stack pointer at entry: sp[0] = return address */
};

/* Integer argument @n (0..5) of the hooked function. */
static inline unsigned long pk_regs_arg(const struct pk_regs *regs, unsigned int n)
{
	const unsigned long *a = &regs->di;

	return n < 6 ? a[n] : 0;
}

/*
 * From an ops callback, a pk_tramp_new() handler or a fprobe's entry
 * callback, with the @regs it was given: do not run the function; its
 * caller receives @ret in rax, and regs->dx in rdx (set it first for a
 * function that returns two words).  Only integer and pointer returns: the
 * caller of a function returning in a vector register (float, double)
 * gets whatever xmm0 held at the entry.  The site's other ops and its
 * pk_tramp_new() handler still run; a direct entry to code of your own
 * (pk_direct_add() of another address) does not.  Exits already hijacked
 * at this entry (a fprobe's) run with @ret as the return value.  Vector-
 * free: a PK_OPS_F_NOVEC callback may call it.  Returns 0; -EINVAL outside
 * an entry callback (in an exit callback too), -EOPNOTSUPP where a CET
 * shadow stack is on; then nothing changed.
 */
PK_API int pk_regs_skip(struct pk_regs *regs, unsigned long ret);

struct pk_ops;

/*
 * @ip: address of the site (the function's entry); @parent_ip: the address
 * the function returns to.  Runs on the thread that called the function, in
 * whatever context it was called from (possibly a signal handler): keep it
 * async-signal-safe if hooked functions may run in signal handlers.
 */
typedef void (*pk_ops_fn)(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
			  struct pk_regs *regs);

/*
 * The sites an ops (or a fprobe) takes.  Sized (probekit.h, PK_OPTS): set
 * sz with PK_OPTS_INIT(pk_ops_filter, ...).  A filter left all zero, sz
 * included, is the empty filter; a zero sz with anything else set is
 * refused (-EINVAL).  It is the last member of the structs that hold it:
 * a field added to them later goes after the caller's filter.sz bytes.
 */
struct pk_ops_filter {
	size_t sz;		  /* sizeof(struct pk_ops_filter), PK_OPTS_INIT fills it */
	const unsigned long *ips; /* site addresses */
	size_t nips;
	const char *const *globs; /* function-name globs (fnmatch; C++ names also demangled) */
	size_t nglobs;
};

/*
 * PK_OPS_F_NOVEC: @func and everything it calls never touch vector or x87
 * registers (compile them with -mgeneral-regs-only, and make any call into
 * other code, libc included, through something that saves xmm0-7 itself).
 * The trampoline of a site where this ops is alone then skips saving and
 * restoring xmm0-7, which makes each call a few ns cheaper.  Where the site
 * is shared, the list dispatcher saves them anyway.  A callback that is not
 * vector-free gets xmm0-7 saved, not xmm8-15: at a relocated site
 * (PK_SITE_RELOC) in code built with gcc's -fipa-ra, where a caller may
 * keep a value in them across the call, it must leave them alone.
 */
#define PK_OPS_F_NOVEC 0x1ul

/*
 * Sized (probekit.h): declare it with PK_OPTS(pk_ops, name, .func = ...,
 * .filter = PK_OPTS_INIT(pk_ops_filter, ...)).  The library keeps a
 * pointer to it while it is registered (the callback gets it back: embed
 * it in a struct of yours and find that with container_of), and reads its
 * first-version fields there: do not change them while it is registered.
 */
struct pk_ops {
	size_t sz; /* sizeof(struct pk_ops), PK_OPTS fills it */
	pk_ops_fn func;
	void *data;	     /* for the user */
	unsigned long flags; /* PK_OPS_F_*, or 0 */
#ifdef __cplusplus
	void *private_; /* `private` in C (a C++ keyword): the same field */
#else
	void *private; /* the library's; NULL before registration */
#endif
	/*
	 * Sites to hook, read by pk_ops_register(): the ips need not outlive
	 * the call, the globs (array and strings) are read again by each
	 * pk_sites_refresh() that finds new objects, so they must live while
	 * the ops is registered.  An empty filter means every known site.
	 * Last: see struct pk_ops_filter.
	 */
	struct pk_ops_filter filter;
};

/*
 * Attach @ops to every site its filter names.  Errors: -EINVAL (@ops NULL,
 * no func, unknown flags, @ops->sz or @ops->filter.sz too small, or a
 * field this library does not know set: probekit.h), -EBUSY (already
 * registered; or an ip is someone else's code, not a site: a relocated
 * site's copy, a trampoline), -ENOENT (an ip is not a site, or a glob
 * matches none), -EPERM (a function taken for prologue relocation whose
 * first instructions do not relocate: the log says why), -ERANGE (no
 * trampoline memory within reach of a site), -ENOMEM, -EDEADLK (called
 * from a callback), -ENOTRECOVERABLE (a fork child: see fork() above), or
 * an errno of the patch batch (-EILSEQ: a site did not hold the expected
 * bytes; -ECANCELED: patching was latched off earlier; -EDEADLK,
 * -ETIMEDOUT: the INT3 protocol, above).  On error nothing changed.
 *
 * Inside a transaction, the calls on one ops stage in order: register then
 * unregister of the same ops stage nothing (ops->private is NULL again at
 * once); unregister then register of a registered ops keeps it registered,
 * with its filter read again; a second register is -EBUSY and a second
 * unregister -ENOENT, as outside.
 */
PK_API int pk_ops_register(struct pk_ops *ops);

/*
 * Detach @ops from all its sites.  When it returns 0 the callback is not
 * running on any thread and will not run again: @ops may be freed.  Waits
 * for a grace period (at commit, inside a transaction).  Errors: -ENOENT (not
 * registered), -EDEADLK, or an errno of the patch batch (then @ops is still
 * registered).
 */
PK_API int pk_ops_unregister(struct pk_ops *ops);

/* Site @ip calls @addr directly. */
struct pk_direct_entry {
	unsigned long ip;
	unsigned long addr;
};

/*
 * @addr is entered as if the function had called it at its very first
 * instruction: [rsp] = ip + 5 (where to continue the function), [rsp + 8] =
 * the caller's return address, every argument register live.  It must
 * preserve all of them (a trampoline from pk_tramp_new() does).  At a
 * relocated site (PK_SITE_RELOC) [rsp] is instead the out-of-line copy of
 * the function's first instructions, which continues the function: return
 * to it the same way.  Code built without a patchable entry may also be
 * built with gcc's -fipa-ra (its -O2 default), where a caller keeps values
 * in the caller-saved registers its callee leaves alone: @addr there must
 * preserve every register, vector ones included.  The ops path does (r11
 * and the rest), and so does a pk_tramp_new() trampoline there (its
 * handler is run through the site's own entry, like an ops, never through
 * the trampoline's address, whose entry takes r11), except xmm8-15, which
 * only xmm0-7 being saved leaves to the handler: it must not touch them.
 *
 * pk_direct_add(): -EINVAL (addr 0, duplicate ip in @e, @e NULL with @n > 0
 * here and in pk_direct_del() and pk_direct_mod()), -EEXIST (a site
 * already has a direct entry), -ENOENT (not a site), -ERANGE (@addr out of
 * rel32 reach and no stub memory near the site), -ENOMEM, -EDEADLK, or a
 * patch batch errno.  All or nothing.
 */
PK_API int pk_direct_add(const struct pk_direct_entry *e, size_t n);

/*
 * Remove the direct entries of @ips.  Does not wait: a thread may still be
 * running an old @addr when it returns.  Trampolines from pk_tramp_new() may
 * be freed with pk_tramp_free() right away (reclaimed after a grace period in
 * the background); for your own code, call pk_direct_sync() before reusing
 * it.  Errors: -EINVAL (@ips NULL with @n > 0), -ENOENT (no direct entry on
 * an ip), -EDEADLK, patch errnos.
 */
PK_API int pk_direct_del(const unsigned long *ips, size_t n);

/*
 * Retarget existing entries.  Each call of the site runs either the old or
 * the new @addr, never neither.  Errors as pk_direct_add(), -ENOENT if an ip
 * has no direct entry.
 */
PK_API int pk_direct_mod(const struct pk_direct_entry *e, size_t n);

/*
 * Wait until no thread can still be entering or running a library
 * trampoline or callback removed before the call (a grace period).  The
 * library cannot see inside code it did not make: before reusing your own
 * trampoline after pk_direct_del(), make sure yourself that no thread is
 * still in it (e.g. count entries in it).  Returns 0 or -EDEADLK.
 */
PK_API int pk_direct_sync(void);

/*
 * Trampolines for C handlers, to use as a direct @addr.  The handler runs at
 * function entry with the argument registers in @regs (changes are passed on
 * to the function), then the function runs.  Every register the function
 * may read (arguments, vector arguments, rax, r10) is preserved.  @ip is
 * the site's address, at a relocated site (PK_SITE_RELOC) too.
 */
typedef void (*pk_tramp_fn)(unsigned long ip, unsigned long parent_ip, struct pk_regs *regs);

struct pk_tramp;

/*
 * PK_TRAMP_F_NOVEC: as PK_OPS_F_NOVEC, for a pk_tramp_new() handler: it
 * never touches vector or x87 registers (-mgeneral-regs-only), so the
 * trampoline does not save xmm0-7 around it.
 */
#define PK_TRAMP_F_NOVEC 0x1u

/*
 * New trampoline for @handler; @flags: PK_TRAMP_F_* or 0.  Returns NULL and
 * sets errno: EINVAL (no handler, unknown flag), ENOMEM, ERANGE (no
 * trampoline memory could be mapped within rel32 reach of the program), or
 * the errno of making that memory (ftruncate, mmap: the message says).
 */
PK_API struct pk_tramp *pk_tramp_new(pk_tramp_fn handler, unsigned int flags);

/* Address to put in pk_direct_entry.addr; 0 with errno EINVAL if @t is NULL. */
PK_API unsigned long pk_tramp_addr(const struct pk_tramp *t);

/*
 * Free @t; its memory is reused only after a grace period, so this may
 * follow pk_direct_del() at once.  -EBUSY if a direct entry still uses it
 * (committed, or staged in the caller's transaction); -EINVAL if it was
 * freed already.  Its address stays
 * valid code (a call there runs the function without the handler) and may
 * be given again by a later pk_tramp_new() of the same handler and flags.
 */
PK_API int pk_tramp_free(struct pk_tramp *t);

/*
 * Group changes into one patch batch.  The calling thread owns the hook
 * registry until commit or abort (other threads' calls, and their
 * pk_txn_begin(), wait for it; no lock is held between calls, so fork() never
 * waits for a transaction).  Calls inside stage their change, in order, and
 * return its validation errors (see pk_ops_register() for the same ops
 * registered and unregistered in one transaction); pk_txn_commit() applies
 * all of them (0, or a patch errno with nothing changed: the staged changes
 * are dropped), pk_txn_abort() drops them.  A thread that exits
 * (pthread_exit(), or a return from its start function) with its
 * transaction open has it dropped at its exit, as by pk_txn_abort(), and
 * said; a thread that ends by a raw exit system call cannot be seen.
 * -EBUSY: begin inside a transaction; -EINVAL: commit/abort outside one;
 * -EDEADLK from a callback; -ENOMEM; -ENOTRECOVERABLE: see fork() above.
 */
PK_API int pk_txn_begin(void);
PK_API int pk_txn_commit(void);
PK_API int pk_txn_abort(void);

#ifdef __cplusplus
}
#endif

#endif /* PROBEKIT_HOOK_H */
