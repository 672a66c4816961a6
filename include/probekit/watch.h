/* SPDX-License-Identifier: MIT */
/*
 * Watchpoints on live threads of the calling process: hardware ones (debug
 * registers, described first), and page-protection ones (PK_WATCH_MODE_PAGE,
 * doc/design/page-watch.md) where those do not fit or are not delivered.
 *
 * A watchpoint watches a range of bytes for writes, reads-or-writes, or
 * execution (one instruction), on one thread or on ALL threads: those that
 * exist when it is added and every thread created later.  A debug register
 * watches 1, 2, 4 or 8 naturally aligned bytes; a longer or unaligned data
 * range (W, RW) is split into the fewest naturally aligned pieces of those
 * lengths, one register each (3 bytes at an odd address: 1 + 2; 24 bytes
 * aligned to 8: three), doc/design/hw-watch-split.md.  Each register is
 * backed by perf_event_open(PERF_TYPE_BREAKPOINT) with sigtrap (no ptrace): a
 * hit in any piece raises SIGTRAP in the thread that made the access, and
 * probekit's SIGTRAP handler reports it as a hit of the one watchpoint,
 * calling your callback and/or pushing it into a lock-free queue.
 *
 * x86-64 has 4 debug-register slots per thread, shared by code and data
 * watchpoints: a range takes at most 32 bytes, aligned to 8.  An all-threads
 * watchpoint takes one slot per piece in every thread; a single-thread one
 * takes them in its thread only.  A request that does not fit is refused with
 * -ENOSPC before any system call, and the library's message (pk_set_print)
 * names the full thread and what holds its slots.
 *
 * Signal-context contract.  Callbacks run inside the SIGTRAP handler, on the
 * thread that hit, with SIGTRAP not blocked (SA_NODEFER).  A callback may
 * only do what is async-signal-safe: read/write its own memory, atomics,
 * pk_hitq_push(), write(2), and the other functions of signal-safety(7).  It
 * must not call malloc, stdio, locks, or any other pk_watch_* function, and
 * must return promptly: pk_watch_remove() waits for callbacks that are
 * running on the watchpoint it removes.  Accesses to watched memory made
 * while a callback runs on that thread (by the callback itself, or by a
 * signal handler interrupting it) are not reported: they trap at once and
 * are counted as `self` (pk_watch_stats).
 *
 * SIGTRAP chaining.  probekit has one SIGTRAP handler (watchpoints and the
 * hook patcher's INT3s).  Traps that are not its own go to the SIGTRAP
 * action installed before it, run as the kernel would (its sa_mask, SIGTRAP
 * blocked unless SA_NODEFER, SA_RESETHAND; not its SA_ONSTACK).  An
 * application that installs its own SIGTRAP handler AFTER the first
 * pk_watch_add() (or hook) must pass the traps it does not own to the
 * action sigaction() returned to it, or probekit's hits reach its handler
 * instead; under the probekit command the agent does this for the program.
 *
 * Threads that block SIGTRAP: see PK_WATCH_HIT_LATE and pk_watch_stats().
 *
 * Page mode (PK_WATCH_MODE_PAGE) owns SIGSEGV the same way, and SIGBUS and
 * SIGFPE (a fault of the instruction it runs out of line, given back to the
 * program at its own instruction): an application that installs its own
 * handler of one of them after the first page-mode watch must pass the
 * faults it does not own to the action sigaction() returned to it.  A
 * thread that blocks SIGSEGV (sigprocmask, pthread_sigmask, a handler's
 * sa_mask) and then touches a watched page is killed by the kernel, which
 * never delivers a fault it finds blocked; under the probekit command the
 * agent keeps SIGSEGV deliverable while the program believes it blocked
 * (doc/design/signals.md, SO7), a program linking the library directly
 * must not block it.
 * A system call that reads or writes a watched page fails with EFAULT,
 * but under the probekit command, whose agent runs the calls that move a
 * buffer (read, write, pread, readv, recv, send and kin) on a bounce
 * buffer and reports them (PK_WATCH_HIT_SYSCALL; doc/design/page-watch.md
 * PW6).  Likewise the agent keeps the program's mprotect() of a watched
 * page its own (PW8); a program linking the library directly must not
 * change a watched page's protection.
 *
 * Processes: watchpoints are dropped by the kernel on execve (remove_on_exec);
 * a child made by fork() has none (its copies of the handles are inert:
 * enable/disable/modify return -ESRCH, remove only frees them).
 */
#ifndef PROBEKIT_WATCH_H
#define PROBEKIT_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <ucontext.h>

#include <probekit/probekit.h>

#ifdef __cplusplus
extern "C" {
#endif

struct pk_watch;
struct pk_hitq;

enum pk_watch_type {
	PK_WATCH_W = 1,	 /* writes */
	PK_WATCH_RW = 2, /* reads or writes (x86 has no read-only watchpoints) */
	PK_WATCH_X = 3,	 /* execution of the instruction at the address (len 1) */
};

/*
 * One hit.  For data watchpoints (W, RW) x86 traps AFTER the access: @ip is
 * the address of the instruction that FOLLOWS the one that made the access,
 * and the memory already holds the new value.  For X watchpoints @ip is the
 * watched instruction itself, before it runs.  With debug registers, @addr,
 * @off and @len are the piece of the register that trapped (the whole range
 * if one register takes it; 1 byte for X): its address, its offset from the
 * watch's start, its length.  One access over several pieces traps in each:
 * the kernel counts every one, and reports one or more of them (one SIGTRAP
 * may be pending per thread: see pk_watch_stats.unseen).
 *
 * Sized (probekit.h).  A hit given to a callback holds in @sz the bytes
 * the library filled (its own sizeof): a field added after this first
 * version is there only where PK_HAS(hit, field) says so.  A hit popped from
 * a queue is filled up to the caller's @sz (PK_OPTS(pk_watch_hit, h)), as
 * any output.  A hit pushed (pk_hitq_push) is an input: one received by a
 * callback, or one of yours made with PK_OPTS.
 */
#define PK_WATCH_HIT_BYTES 16

struct pk_watch_hit {
	size_t sz;		/* bytes of it filled in (above) */
	struct pk_watch *watch; /* in a queued hit it may since have been removed:
				   compare it, do not dereference it then */
	void *ctx;		/* the ctx given at add time */
	pid_t tid;		/* thread that made the access */
	uintptr_t addr;		/* watched address when the hit happened (see above) */
	uintptr_t ip;		/* RIP at the trap (see above) */
	ucontext_t *uc;		/* the interrupted context; NULL in queued hits */
	unsigned int flags;	/* PK_WATCH_HIT_* */
	/*
	 * Page mode (PK_WATCH_HIT_PAGE): the access touched @len watched bytes
	 * from @off (from the watch's start), whose values before and after it
	 * are the first min(@len, 16) bytes of @before and @after (equal for a
	 * read).  @ip is then the accessing instruction itself, and @addr the
	 * first watched byte it touched.  Debug registers: @off and @len are
	 * the trapping register's piece (above), @before and @after zero.
	 */
	uint32_t off, len;
	uint8_t before[PK_WATCH_HIT_BYTES], after[PK_WATCH_HIT_BYTES];
};

/*
 * The thread blocked SIGTRAP when it made the access: the hit is delivered
 * when it unblocks, and @ip and @uc are those of that moment, not of the
 * access.  Further hits while it was blocked were merged into this one by
 * the kernel (pk_watch_stats() counts them as unseen).
 */
#define PK_WATCH_HIT_LATE 0x1u

/* Page mode (PK_WATCH_MODE_PAGE): how the access went. */
#define PK_WATCH_HIT_PAGE  0x2u /* a page-mode hit: off, len, old, new are set */
#define PK_WATCH_HIT_READ  0x4u /* the access read the watched bytes */
#define PK_WATCH_HIT_WRITE 0x8u /* it wrote them (with READ: read-modify-write) */
/*
 * The instruction could not be redirected and ran with the pages open
 * (doc/design/page-watch.md, PW5): READ/WRITE are guessed from the values
 * (WRITE if a watched byte changed), and another thread's access during
 * that one instruction may have gone unseen (pk_watch_stats.windowed).
 */
#define PK_WATCH_HIT_WINDOWED 0x10u
/*
 * A system call moved the bytes (read(2) into the watched buffer, write(2)
 * from it), through the agent's wrappers of the calls that take a buffer
 * (doc/design/page-watch.md, PW6): @ip is the return address of the
 * program's call to the libc function, and a callback's @uc is NULL.
 */
#define PK_WATCH_HIT_SYSCALL 0x20u

/*
 * Called in signal context: see the contract at the top of this file.
 * @hit->sz is the library's size of the hit (struct pk_watch_hit above).
 */
typedef void (*pk_watch_cb)(const struct pk_watch_hit *hit);

/*
 * How a watchpoint is made.
 *   HW    debug registers: up to 32 bytes in as many naturally aligned
 *         pieces of 1, 2, 4 or 8 bytes as there are free registers (4 per
 *         thread), hits delivered by the CPU after the access; refused where
 *         the machine does not deliver them (EOPNOTSUPP).
 *   PAGE  page protection (doc/design/page-watch.md): any length, any
 *         number, W or RW, in a private writable mapping that is not a
 *         stack; every access to a byte of the watched pages costs two
 *         signals (about 5 us), reported or not; hits carry the values
 *         before and after and the accessing instruction itself.  Single-
 *         thread watches (opts->tid) are not offered (ENOTSUP).
 *   AUTO  HW where hits are delivered and the range's pieces fit the free
 *         debug registers; PAGE otherwise (for W and RW, on all threads).
 *         pk_watch_mode_of() says which was taken.
 */
enum pk_watch_mode {
	PK_WATCH_MODE_AUTO = 0,
	PK_WATCH_MODE_HW = 1,
	PK_WATCH_MODE_PAGE = 2,
};

/*
 * A condition on hits, evaluated in the signal handler that sees the hit
 * (no allocation, no lock, no system call): a hit that fails it is neither
 * called back nor queued, only counted (pk_watch_stats.filtered).  All of
 * its parts must hold:
 *   changed   the access changed the watched bytes it touched (a read, or
 *             a write of the same value, fails);
 *   term[i]   @a CMP @b, where OLD and NEW are the touched bytes before and
 *             after the access (up to 8, little-endian, sign-extended from
 *             their length), TID the accessing thread, CONST the term's @k;
 *   in_lo/hi  the accessing instruction lies in [@in_lo, @in_hi) (a
 *             function's range: "accesses made by FUNC"); 0, 0: anywhere;
 *   in_stack  ... or a return address of the thread's call chain does
 *             ("FUNC on the stack": FUNC or a function it called made
 *             it): the word on top of the stack (a frameless leaf's return
 *             address) and the frame-pointer chain, at most 64 frames, read
 *             through the kernel (one process_vm_readv each); a caller built
 *             without frame pointers ends the chain there.  A page-mode hit
 *             of a system call (PK_WATCH_HIT_SYSCALL) has no chain: its
 *             call site only.
 * With debug registers, the touched bytes are the trapping register's piece
 * (struct pk_watch_hit): NEW is read from memory when the hit is handled and
 * OLD is the value the previous hit of that piece left (the value at the add,
 * or at the last pk_watch_modify, for the first): a concurrent writer may
 * have moved them; the instruction is the
 * one after the access (x86 traps after it), in the same function but for
 * an access that is a function's last instruction.  In page mode both are
 * exact and the instruction is the access itself.
 */
enum pk_watch_val {
	PK_WATCH_VAL_CONST = 0,
	PK_WATCH_VAL_OLD,
	PK_WATCH_VAL_NEW,
	PK_WATCH_VAL_TID,
};

enum pk_watch_cmp {
	PK_WATCH_CMP_EQ = 1,
	PK_WATCH_CMP_NE,
	PK_WATCH_CMP_LT,
	PK_WATCH_CMP_LE,
	PK_WATCH_CMP_GT,
	PK_WATCH_CMP_GE,
};

#define PK_WATCH_TERMS 4

struct pk_watch_term {
	enum pk_watch_val a;
	enum pk_watch_cmp cmp; /* 0: the term is unused */
	enum pk_watch_val b;
	int64_t k; /* the constant, where a or b is PK_WATCH_VAL_CONST */
};

struct pk_watch_cond {
	bool changed;
	struct pk_watch_term term[PK_WATCH_TERMS];
	uintptr_t in_lo, in_hi;
	bool in_stack;
};

struct pk_watch_opts {
	size_t sz;			  /* sizeof(struct pk_watch_opts), PK_OPTS fills it */
	pid_t tid;			  /* 0: all threads, now and later; else one thread */
	pk_watch_cb callback;		  /* may be NULL */
	void *ctx;			  /* passed back in every hit */
	struct pk_hitq *queue;		  /* if set, every hit is pushed there too */
	bool disabled;			  /* create disabled; pk_watch_enable() arms it */
	enum pk_watch_mode mode;	  /* PK_WATCH_MODE_AUTO (0) unless set */
	const struct pk_watch_cond *cond; /* copied at the add; NULL: every hit */
};

/*
 * "new > old && tid == 1234" into @c: terms joined by "&&", each
 * OPERAND CMP OPERAND with operands old, new, tid or an integer (C syntax:
 * decimal, 0x hex, negative) and CMP one of == != < <= > >=; "changed"
 * is a term of its own.  0, or -EINVAL with the reason in @why.
 */
PK_API int pk_watch_cond_parse(const char *s, struct pk_watch_cond *c, char *why, size_t n);

/*
 * Watch @len bytes at @addr for accesses of @type; @opts may be NULL (all
 * threads, no callback, no queue, enabled).  Returns a handle, or NULL with
 * errno set:
 *   EINVAL  @len 0, or more naturally aligned 1/2/4/8-byte pieces needed to
 *           cover [@addr, @addr + @len) than a thread has debug registers
 *           (4: more than 32 bytes, or 32 not aligned to 8, 16 at an odd
 *           address), unknown @type, X with @len != 1, NULL @addr,
 *           @opts->sz too small or a field this library does not know set
 *           (probekit.h), an unknown @opts->mode, an @opts->cond that does
 *           not hold together (the message says why); in page mode also X,
 *           and memory it cannot watch (not a private readable and writable
 *           mapping, a thread's stack, a mapping that grows down, pages
 *           with a protection key, a page of probekit's own state: the
 *           message says which)
 *   ESRCH   @opts->tid is not a live thread of this process
 *   ENOSPC  some thread has fewer free debug-register slots than the range
 *           has pieces (message says which thread, and what holds them);
 *           in page mode, 64 runs of pages are watched already, or 16
 *           watches share the range's pages
 *   EBUSY   page mode: the range's pages overlap those of another
 *           page-mode watch in part
 *   EOPNOTSUPP  this machine accepts hardware breakpoints but does not
 *           deliver them (some hypervisors): checked once per process, at
 *           its first pk_watch_add(), by arming one on a private word and
 *           writing it; the message says so.  Every later add fails alike.
 *           PROBEKIT_HWBP_UNDELIVERED=1 in the environment pretends the
 *           hardware never delivers, to test this path where it does.
 *           Also (ENOTSUP, the same value): PK_WATCH_MODE_PAGE with
 *           @opts->tid (AUTO takes the hardware for one thread).
 *   ENODEV, ENOENT  no hardware breakpoints here (perf_event_open's error)
 *   EACCES / EPERM  perf_event_open refused: the message says whether a
 *           seccomp filter or perf_event_paranoid (needs <= 2) is the cause
 *   ENOMEM, EMFILE  out of memory or file descriptors (one per piece and
 *           root thread; page mode's first watch: memfd_create's errno)
 * Nothing is left installed when it fails.  Must not be called from a
 * callback.  A thread inside clone() while the roots are opened may be
 * missed, or get two events (its hits are reported once, counted twice).
 * Costs one perf_event_open per piece and thread alive at the call (all
 * threads) or per piece (single thread), plus, at the first add of a
 * process, the delivery check (one event opened, written and read on the
 * calling thread); threads created later cost the library nothing.
 */
PK_API struct pk_watch *pk_watch_add(const void *addr, size_t len, enum pk_watch_type type,
				     const struct pk_watch_opts *opts);

/*
 * Remove @w from every thread and free it.  When it returns, no callback of
 * @w is running or will run; a SIGTRAP of @w still pending somewhere is
 * swallowed.  NULL is ignored.  Must not be called from a callback.
 */
PK_API void pk_watch_remove(struct pk_watch *w);

/* The mode @w was made in (PK_WATCH_MODE_HW or _PAGE); -EINVAL for NULL. */
PK_API int pk_watch_mode_of(const struct pk_watch *w);

/*
 * Arm / disarm @w on every thread (one ioctl per piece and root thread).
 * Idempotent.  Returns 0, -EINVAL if @w is NULL, -ESRCH if @w no longer
 * watches anything (it was on a single thread that exited, or we are a fork
 * child), or the ioctl's -errno (then every piece is as before).
 */
PK_API int pk_watch_enable(struct pk_watch *w);
PK_API int pk_watch_disable(struct pk_watch *w);

/*
 * Retarget @w to @len bytes at @addr for @type, on every thread at once (one
 * ioctl per piece kept and root thread, reaching the threads created since).
 * A new target of more pieces takes more slots (admitted as by pk_watch_add,
 * the new pieces opened on every thread alive), one of fewer gives the rest
 * back.  Keeps @w's enabled state.  Returns 0, -EINVAL (NULL @w, or bad
 * arguments as for pk_watch_add), -ENOSPC (the pieces added do not fit),
 * -ESRCH (as above), -EOPNOTSUPP (a page-mode @w) or the ioctl's or
 * perf_event_open's -errno; on failure @w keeps its old target.  A hit
 * handled while it runs may be reported with either target's piece.
 */
PK_API int pk_watch_modify(struct pk_watch *w, const void *addr, size_t len,
			   enum pk_watch_type type);

/* Number of hits of @w so far, on all threads (relaxed count); 0 for NULL. */
PK_API unsigned long pk_watch_hits(const struct pk_watch *w);

/*
 * What became of the accesses to @w's memory.  The kernel counts every one;
 * a thread that blocks SIGTRAP gets at most one SIGTRAP pending, delivered
 * when it unblocks (PK_WATCH_HIT_LATE), and the others are merged into it;
 * a thread that exits with SIGTRAP still blocked never sees its pending one.
 */
struct pk_watch_stats {
	size_t sz;		/* sizeof(struct pk_watch_stats), PK_OPTS fills it */
	unsigned long hits;	/* reported (callback, queue): pk_watch_hits() */
	unsigned long late;	/* of those, delivered late (PK_WATCH_HIT_LATE) */
	unsigned long self;	/* accesses made while a callback ran on the thread
				   (the callback's own): not reported */
	unsigned long counted;	/* accesses the kernel counted, all threads (one per
				   register an access trapped: see the hit) */
	unsigned long unseen;	/* counted - hits - self: never delivered, because
				   the thread blocked SIGTRAP */
	unsigned long windowed; /* page mode: accesses run with the pages open
				   (PK_WATCH_HIT_WINDOWED), reported or not */
	unsigned long filtered; /* hits that failed opts->cond: not reported */
};

/*
 * Fill @st for @w (read(2) of the count of each root event).  0, or -EINVAL
 * (@w or @st NULL, @st->sz too small).  Must not be called from a callback.
 * The count of a thread's events is only complete once it has returned to
 * user space after the access; a thread that made two events for one
 * watchpoint (see pk_watch_add) counts twice.
 */
PK_API int pk_watch_stats(struct pk_watch *w, struct pk_watch_stats *st);

/*
 * Hit queue: bounded, lock-free, many producers (signal handlers on any
 * thread) and ONE consumer.  A full queue drops the new hit and counts it.
 *
 * pk_hitq_new: @capacity is rounded up to a power of two (>= 2).  NULL + errno
 *   EINVAL (0 or above 2^24) or ENOMEM.
 * pk_hitq_free: the queue must no longer be referenced by any watchpoint.
 *   NULL is ignored.
 * pk_hitq_push: async-signal-safe and lock-free; 0, -ENOBUFS when full
 *   (the hit is dropped and counted), or -EINVAL (@q or @hit NULL, @hit->sz
 *   too small, or a field this library does not know set: nothing is said,
 *   in signal context).  Queued hits have @uc NULL.
 * pk_hitq_pop: consumer only (one thread at a time); 0 with *@out filled up
 *   to its sz (set it first: PK_OPTS(pk_watch_hit, h); the pop sets it to
 *   the bytes filled, so @out may be popped into again as it is), -EAGAIN
 *   when nothing is ready, or -EINVAL (@q or @out NULL, @out->sz too small;
 *   the queue is left as it was).
 * pk_hitq_dropped: hits dropped so far because the queue was full; 0 for NULL.
 */
PK_API struct pk_hitq *pk_hitq_new(size_t capacity);
PK_API void pk_hitq_free(struct pk_hitq *q);
PK_API int pk_hitq_push(struct pk_hitq *q, const struct pk_watch_hit *hit);
PK_API int pk_hitq_pop(struct pk_hitq *q, struct pk_watch_hit *out);
PK_API unsigned long pk_hitq_dropped(const struct pk_hitq *q);

#ifdef __cplusplus
}
#endif

#endif /* PROBEKIT_WATCH_H */
