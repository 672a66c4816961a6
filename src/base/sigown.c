// SPDX-License-Identifier: MIT
/*
 * The owned signals (sigown.h; doc/design/signals.md, labels SO1-SO7):
 * one handler of the library's for SIGTRAP, one for SIGSEGV, and one each
 * for SIGBUS and SIGFPE while a page watch's step may raise them.  Clients
 * register per signal; the handler offers each signal to them and passes
 * what none claims to the application's action, running it as the kernel
 * would have (SO3): with its sa_mask and the signal blocked (unless it
 * asked SA_NODEFER), SA_RESETHAND honoured, SA_SIGINFO or a plain handler;
 * SIG_IGN ignored and SIG_DFL the default action (SO4).
 *
 * What differs between the two signals is data, not code (`owners`):
 *
 *  - SIGTRAP (SO6): the patcher's client is offered each trap before
 *    anything that may call libc, errno's __errno_location() included
 *    (its INT3s can stand in libc's own functions while they are patched).
 *    Once the patcher is a client INT3 sites may exist, and the handler may
 *    call a function hooked through one; a trap met with SIGTRAP blocked
 *    kills the process, so SIGTRAP is then never blocked in the
 *    application's handler (sa_mask or not), and a SIGTRAP raised while it
 *    runs (its own kill or INT3) runs it again, nested.  A trap's SIG_IGN
 *    ignores it, as this file always did.
 *
 *  - SIGSEGV (SO4, SO7): a fault the kernel sends (si_code > 0) is forced
 *    on the process: with SIGSEGV ignored or blocked the kernel resets it
 *    to SIG_DFL and the process dies (force_sig_fault).  So an unclaimed
 *    fault gets the default action when the application's action is
 *    SIG_IGN, when the thread blocks SIGSEGV in the program's own view
 *    (agent/sigmask.c keeps it deliverable for real while a client is
 *    there; pki_sigown_set_view), and when the application's SIGSEGV
 *    handler is running and did not ask SA_NODEFER.  That last block is
 *    ours only, "virtual", while a client is there: a handler of the
 *    program's that touches a watched page must reach our client, so the
 *    kernel's mask for it keeps SIGSEGV deliverable; a SIGSEGV sent
 *    (kill) meanwhile waits until the handler returns.  The handler
 *    left by siglongjmp ends the virtual block too (the stack pointer
 *    tells).  The default action for a fault: SIG_DFL given back and the
 *    handler returns, so the instruction faults again and the kernel ends
 *    the process the classic way (status, core dump as without us).
 *
 *  - SIGBUS, SIGFPE: forced as SIGSEGV is, and nothing more: their one
 *    client (a page watch's step whose copy of the program's instruction
 *    faulted, PW4 of doc/design/page-watch.md) puts the instruction back
 *    and passes them on; never kept deliverable, never virtual.
 *
 * Why one handler: two handlers that each chained to whatever was installed
 * before them made the order depend on who came first, and a program that
 * installed its own handler later took every signal, ours included.  The
 * agent routes the program's sigaction()/signal() calls for an owned
 * signal to pki_sigown_app_action() (SO2): its handler becomes the one we
 * chain to.
 *
 * The fatal-signal catchers (base/signals.c: the tracer's and the watch
 * mode's last flush, for signals the program leaves at SIG_DFL) and the
 * owner (SO5): for a signal the owner holds, a catcher is not a second
 * handler but the owner's fallback, run first when the owner gives the
 * signal its default action (it flushes; its pki_fatal_die() leaves the
 * dying to the owner).  Either may come first: a catcher that comes later
 * registers as the fallback (pki_sigown_fallback_take); an owner that
 * comes later finds the catcher's handler installed, takes it as its
 * fallback and the action the catcher replaced (SIG_DFL) as the
 * application's; an owner that leaves gives the catcher's handler back to
 * the kernel if the application's action is still SIG_DFL.  The fallback
 * runs once per process, and for every death by the default action, also
 * after the program installed a handler of its own and later SIG_DFL.
 *
 * Flags: SA_NODEFER, so that a handler interrupting ours (a SIGALRM handler
 * that calls a hooked function, a callback that touches watched memory) can
 * meet the signal again and be handled instead of meeting a blocked
 * synchronous signal, which the kernel answers by killing the process; the
 * clients are re-entrant for it.  SA_SIGINFO for si_code, si_addr and
 * si_perf_data; SA_RESTART so that a trap never makes a blocking call fail
 * with EINTR; SA_ONSTACK so that a signal on a nearly full stack uses the
 * alternate stack if the thread has one.  The signals the clients ask for
 * (the sled kick) stay blocked in it and in the application's handler it
 * runs.  Not honoured from the application's action: SA_ONSTACK and the
 * absence of SA_RESTART (ours apply).
 *
 * The application's action is read in signal context and written by any
 * thread, also from signal handlers: a sequence count makes reads lock-free,
 * and writers hold `lock` (one for both owners) with every signal blocked
 * but the owned ones, so that no handler can interrupt a writer on its own
 * thread and spin on its half-written copy.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/ucontext.h>
#include <unistd.h>

#include "base/handler_data.h"
#include "base/siglock.h"
#include "base/signals.h"
#include "base/sigown.h"
#include "base/threads.h"

#define ACT_WORDS ((sizeof(struct sigaction) + sizeof(long) - 1) / sizeof(long))

typedef void (*fallback_fn)(int, siginfo_t *, void *);

struct owner {
	int sig;
	int nclients;
	bool patch_first; /* SO6: client 0 before errno is saved (the patcher) */
	bool forced;	  /* SO4: a signal the kernel sends is forced, and re-executes */
	int keep_client;  /* which client's presence keeps sig unblocked: -1 any (SO3) */
	bool virtual;	  /* SO7: sig blocked in the app's handler in our view only */

	struct {
		atomic_uint seq; /* odd while a writer is copying */
		_Atomic unsigned long w[ACT_WORDS];
	} app;
	struct sigaction app_prev; /* under `lock`: the action before the one being stored */

	/*
	 * A client's function, once registered, stays: a signal already
	 * dequeued for our handler when its client left must still find it (a
	 * late watchpoint hit is swallowed, not passed on to a default action
	 * that kills).  `wanted` (under `lock`) says who is still there, and
	 * `nwanted` counts them for readers without the lock; with nobody, the
	 * signal goes back to the application.
	 */
	_Atomic(pki_sigown_fn) clients[PKI_SIGOWN_CLIENTS];
	bool wanted[PKI_SIGOWN_CLIENTS];
	atomic_int nwanted;
	sigset_t handler_block; /* under `lock`: the signals the clients keep blocked */
	atomic_bool installed;
	_Atomic(fallback_fn) fallback; /* SO5 */
};

#define KEEP_NEVER (-2) /* keep_client: no client keeps sig deliverable */

enum { OWN_TRAP, OWN_SEGV, OWN_BUS, OWN_FPE, OWN_NR };

/*
 * What the handler reads, in pages of its own (base/handler_data.h): linked
 * into a program, a page watch on a neighbour variable could otherwise
 * protect it.
 */
static struct PKI_HANDLER_PAGES {
	struct owner owners[OWN_NR];
	_Atomic(pki_sigaction_fn) sys_fn;
	_Atomic(pki_sigown_view_fn) view_fn;
	atomic_flag lock;
} own = {
    .owners =
	{
	    [OWN_TRAP] = {.sig = SIGTRAP,
			  .nclients = PKI_SIGTRAP_NR,
			  .patch_first = true,
			  .keep_client = PKI_SIGTRAP_PATCH},
	    [OWN_SEGV] = {.sig = SIGSEGV,
			  .nclients = PKI_SIGSEGV_NR,
			  .forced = true,
			  .keep_client = -1,
			  .virtual = true},
	    [OWN_BUS] = {.sig = SIGBUS,
			 .nclients = PKI_SIGBUS_NR,
			 .forced = true,
			 .keep_client = KEEP_NEVER},
	    [OWN_FPE] = {.sig = SIGFPE,
			 .nclients = PKI_SIGFPE_NR,
			 .forced = true,
			 .keep_client = KEEP_NEVER},
	},
    .lock = ATOMIC_FLAG_INIT,
};

_Static_assert(PKI_SIGTRAP_NR <= PKI_SIGOWN_CLIENTS && PKI_SIGSEGV_NR <= PKI_SIGOWN_CLIENTS &&
		   PKI_SIGBUS_NR <= PKI_SIGOWN_CLIENTS && PKI_SIGFPE_NR <= PKI_SIGOWN_CLIENTS,
	       "PKI_SIGOWN_CLIENTS");

/* No libc: the patcher's INT3s may stand in it (SO6). */
static struct owner *owner_of(int sig)
{
	return sig == SIGTRAP	? &own.owners[OWN_TRAP]
	       : sig == SIGSEGV ? &own.owners[OWN_SEGV]
	       : sig == SIGBUS	? &own.owners[OWN_BUS]
	       : sig == SIGFPE	? &own.owners[OWN_FPE]
				: NULL;
}

static int idx_of(const struct owner *o)
{
	return (int)(o - own.owners);
}

bool pki_sigown_owned(int sig)
{
	return owner_of(sig) != NULL;
}

static int sys_sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	pki_sigaction_fn fn = atomic_load_explicit(&own.sys_fn, memory_order_acquire);

	return (fn ? fn : sigaction)(sig, act, old);
}

void pki_sigown_set_sys(pki_sigaction_fn fn)
{
	atomic_store_explicit(&own.sys_fn, fn, memory_order_release);
}

void pki_sigown_set_view(pki_sigown_view_fn fn)
{
	atomic_store_explicit(&own.view_fn, fn, memory_order_release);
}

bool pki_sigown_installed(int sig)
{
	struct owner *o = owner_of(sig);

	return o && atomic_load(&o->installed);
}

bool pki_sigown_has_client(int sig)
{
	struct owner *o = owner_of(sig);

	return o && atomic_load_explicit(&o->nwanted, memory_order_acquire) > 0;
}

/*
 * Every signal but the owned ones blocked first: the holder cannot be
 * interrupted by a handler that wants the lock on its own thread.  SIGTRAP
 * and SIGSEGV stay deliverable: the calls made under the lock (sigaction,
 * the mask's restore) may be libc functions that are being patched
 * (relocation in every object), or read a watched page, and a synchronous
 * signal met blocked kills the process.  Our own handler, interrupting the
 * holder, takes no lock and reads the action the holder is writing as it
 * was before (lock_mine, app_writing).  Held for a few stores or one
 * sigaction call.
 */
static __thread bool lock_mine;		   /* this thread holds (or waits for) `lock` */
static __thread unsigned char app_writing; /* bit per owner: inside __app_store's stores */
static __thread uintptr_t virt_sp[OWN_NR]; /* SO7: the app's handler's frame, 0 if none */
static __thread uintptr_t virt_alt_lo[OWN_NR], virt_alt_hi[OWN_NR]; /* its alternate stack */
static __thread bool deferred[OWN_NR]; /* SO7: a sent signal waits for it to return */
static __thread siginfo_t deferred_si[OWN_NR];

static void lock_take(sigset_t *saved)
{
	sigset_t all;

	sigfillset(&all);
	sigdelset(&all, SIGTRAP);
	sigdelset(&all, SIGSEGV);
	pthread_sigmask(SIG_SETMASK, &all, saved);
	lock_mine = true; /* before the flag is ours, and after it is not: no window */
	atomic_signal_fence(memory_order_seq_cst);
	pki_siglock_wait(&own.lock);
}

static void lock_drop(const sigset_t *saved)
{
	pki_siglock_release(&own.lock);
	atomic_signal_fence(memory_order_seq_cst);
	lock_mine = false;
	pthread_sigmask(SIG_SETMASK, saved, NULL);
}

/*
 * fork() in another thread while one holds the lock: the child gets it free.
 * The lock is the innermost of all: clients take it under their own locks
 * (client_add and _drop are called holding the watchpoint manager's or the
 * patch lock), so fork's prepare must take it after theirs.  Prepare
 * handlers run in the reverse order of registration: registered at load,
 * before any client's, ours runs last.  Code whose own constructors may make
 * a client register first (the agent's, which run before the library's)
 * calls pki_sigown_init() before anything else.
 */
static void fork_prepare(void)
{
	pki_siglock_wait(&own.lock);
}

static void fork_release(void)
{
	pki_siglock_release(&own.lock);
}

static void register_atfork(void)
{
	pthread_atfork(fork_prepare, fork_release, fork_release);
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

void pki_sigown_init(void)
{
	pthread_once(&atfork_once, register_atfork);
}

__attribute__((constructor)) static void sigown_load(void)
{
	pki_sigown_init();
}

static void app_words(struct owner *o, unsigned long buf[ACT_WORDS])
{
	for (size_t i = 0; i < ACT_WORDS; i++)
		buf[i] = atomic_load_explicit(&o->app.w[i], memory_order_relaxed);
}

/* Under `lock`. */
static void __app_store(struct owner *o, const struct sigaction *act)
{
	unsigned long buf[ACT_WORDS] = {0}, cur[ACT_WORDS];
	unsigned int s = atomic_load_explicit(&o->app.seq, memory_order_relaxed);
	unsigned char bit = (unsigned char)(1u << idx_of(o));

	memcpy(buf, act, sizeof(*act));
	app_words(o, cur); /* complete: only lock holders write */
	memcpy(&o->app_prev, cur, sizeof(o->app_prev));
	atomic_signal_fence(memory_order_seq_cst);
	app_writing |= bit;
	atomic_signal_fence(memory_order_seq_cst);
	atomic_store_explicit(&o->app.seq, s + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	for (size_t i = 0; i < ACT_WORDS; i++)
		atomic_store_explicit(&o->app.w[i], buf[i], memory_order_relaxed);
	atomic_store_explicit(&o->app.seq, s + 2, memory_order_release);
	atomic_signal_fence(memory_order_seq_cst);
	app_writing &= (unsigned char)~bit;
}

/*
 * Any context.  A writer on ANOTHER thread finishes soon; one on this
 * thread (our handler interrupted it: the owned signals stay deliverable
 * under the lock) never will before we return, so we take the action it
 * replaces.
 */
static unsigned int app_load(struct owner *o, struct sigaction *act)
{
	unsigned long buf[ACT_WORDS];
	unsigned int s1, s2;

	for (;;) {
		s1 = atomic_load_explicit(&o->app.seq, memory_order_acquire);
		if ((s1 & 1) && (app_writing & (1u << idx_of(o)))) {
			*act = o->app_prev;
			return s1;
		}
		if (!(s1 & 1)) {
			for (size_t i = 0; i < ACT_WORDS; i++)
				buf[i] = atomic_load_explicit(&o->app.w[i], memory_order_relaxed);
			atomic_thread_fence(memory_order_acquire);
			s2 = atomic_load_explicit(&o->app.seq, memory_order_relaxed);
			if (s1 == s2)
				break;
		}
		sched_yield();
	}
	memcpy(act, buf, sizeof(*act));
	return s1;
}

static bool is_dfl(const struct sigaction *act)
{
	return !(act->sa_flags & SA_SIGINFO) && act->sa_handler == SIG_DFL;
}

/* ---- the handler -------------------------------------------------------- */

/* SO4: sent by the kernel for the instruction (a fault), not by kill/raise/sigqueue. */
static bool forced(const struct owner *o, const siginfo_t *si)
{
	return o->forced && si->si_code > 0;
}

/*
 * SO4, SO5: the default action (terminate, with a core dump for both
 * signals): the fallback's last flush first (once), then SIG_DFL given
 * back to the kernel.  A forced fault returns, so that the instruction
 * runs again and faults with SIG_DFL; anything else is sent again, and
 * delivered on the way out of tgkill (the signal is not blocked in our
 * handler).
 */
static void default_action(struct owner *o, siginfo_t *si, void *uc)
{
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	fallback_fn fb = atomic_exchange_explicit(&o->fallback, NULL, memory_order_acq_rel);

	if (fb)
		fb(o->sig, si, uc);
	sigemptyset(&dfl.sa_mask);
	sys_sigaction(o->sig, &dfl, NULL);
	if (!forced(o, si))
		syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), o->sig);
}

/* Does a client's presence keep o->sig deliverable in the application's handler (SO3)? */
static bool keeps(struct owner *o)
{
	if (o->keep_client == KEEP_NEVER)
		return false;
	if (o->keep_client < 0)
		return atomic_load_explicit(&o->nwanted, memory_order_relaxed) > 0;
	return atomic_load_explicit(&o->clients[o->keep_client], memory_order_relaxed) != NULL;
}

/* The stack pointer of the code @uc interrupted. */
static uintptr_t interrupted_sp(const void *uc)
{
#if defined(__x86_64__)
	return (uintptr_t)((const ucontext_t *)uc)->uc_mcontext.gregs[REG_RSP];
#else
	(void)uc;
	return (uintptr_t)__builtin_frame_address(0);
#endif
}

/*
 * SO7: is this thread inside the application's handler, which blocks
 * o->sig in our view?  Code running in it (what a nested signal
 * interrupted) runs below its frame, or on the alternate stack it runs
 * on; code above it, or off that stack, left it by siglongjmp (glibc
 * restores the mask by a system call of its own, which nobody sees), and
 * the block ended with it, as the mask sigsetjmp saved had no o->sig.
 */
static bool virtually_blocked(struct owner *o, const void *uc)
{
	int i = idx_of(o);
	uintptr_t sp = interrupted_sp(uc);
	bool inside;

	if (!virt_sp[i])
		return false;
	if (virt_alt_lo[i])
		inside = sp >= virt_alt_lo[i] && sp < virt_alt_hi[i];
	else
		inside = sp < virt_sp[i];
	if (!inside) {
		virt_sp[i] = 0;
		deferred[i] = false;
	}
	return inside;
}

static void deliver(struct owner *o, int sig, siginfo_t *si, void *uc);

static void run_app(struct owner *o, const struct sigaction *act, int sig, siginfo_t *si, void *uc)
{
	int i = idx_of(o);
	sigset_t add = act->sa_mask, saved;
	bool masked = false, virt = false;

	if (keeps(o)) {
		virt = o->virtual && (sigismember(&add, sig) || !(act->sa_flags & SA_NODEFER));
		sigdelset(&add, sig); /* SO3: never blocked for real while a client may need it */
	} else if (!(act->sa_flags & SA_NODEFER)) {
		sigaddset(&add, sig);
	}
	if (!sigisemptyset(&add)) {
		pthread_sigmask(SIG_BLOCK, &add, &saved);
		masked = true;
	}
	if (virt) {
		stack_t ss;

		virt_alt_lo[i] = virt_alt_hi[i] = 0;
		if (!sigaltstack(NULL, &ss) && (ss.ss_flags & SS_ONSTACK)) {
			virt_alt_lo[i] = (uintptr_t)ss.ss_sp;
			virt_alt_hi[i] = (uintptr_t)ss.ss_sp + ss.ss_size;
		}
		virt_sp[i] = (uintptr_t)__builtin_frame_address(0);
		atomic_signal_fence(memory_order_seq_cst);
	}
	if (act->sa_flags & SA_SIGINFO)
		act->sa_sigaction(sig, si, uc);
	else
		act->sa_handler(sig);
	if (virt) {
		atomic_signal_fence(memory_order_seq_cst);
		virt_sp[i] = 0;
	}
	/* (the kernel restores the interrupted mask from uc when we return) */
	if (masked)
		pthread_sigmask(SIG_SETMASK, &saved, NULL);
	/* SO7: what was sent meanwhile is delivered now, as on the handler's return */
	if (virt && deferred[i]) {
		siginfo_t again = deferred_si[i];

		deferred[i] = false;
		deliver(o, sig, &again, uc);
	}
}

/* An unclaimed signal: the application's action, as the kernel would run it (SO3, SO4). */
static void deliver(struct owner *o, int sig, siginfo_t *si, void *uc)
{
	pki_sigown_view_fn view = atomic_load_explicit(&own.view_fn, memory_order_acquire);
	struct sigaction act;
	unsigned int seq;

	if (o->virtual && virtually_blocked(o, uc)) {
		if (forced(o, si)) {
			default_action(o, si, uc);
			return;
		}
		deferred_si[idx_of(o)] = *si; /* one pending, as the kernel merges them */
		deferred[idx_of(o)] = true;
		return;
	}
	if (forced(o, si) && view && view(sig)) { /* blocked in the program's view */
		default_action(o, si, uc);
		return;
	}
	seq = app_load(o, &act);
	if (!(act.sa_flags & SA_SIGINFO) && act.sa_handler == SIG_IGN) {
		if (forced(o, si))
			default_action(o, si, uc);
		return;
	}
	if (is_dfl(&act)) {
		default_action(o, si, uc);
		return;
	}
	if (act.sa_flags & SA_RESETHAND) {
		/* one-shot: the next signal gets the default action, as with the kernel */
		struct sigaction dfl = {.sa_handler = SIG_DFL};
		sigset_t s;

		sigemptyset(&dfl.sa_mask);
		if (!lock_mine) { /* else we interrupted this thread's own store: leave it be */
			lock_take(&s);
			if (atomic_load_explicit(&o->app.seq, memory_order_relaxed) == seq)
				__app_store(o, &dfl);
			lock_drop(&s);
		}
	}
	run_app(o, &act, sig, si, uc);
}

/*
 * SO6: the patcher's client first, before anything that may call libc:
 * its INT3s can stand in libc's own functions while they are patched
 * (with relocation in every object), errno's own __errno_location()
 * included, so the path that claims them calls none and leaves errno
 * alone.  Saving errno first would trap again, in every nested handler,
 * without end.
 */
static void owner_handler(int sig, siginfo_t *si, void *uc)
{
	struct owner *o = owner_of(sig);
	int saved_errno;

	if (!o)
		return;
	if (o->patch_first) {
		pki_sigown_fn first = atomic_load_explicit(&o->clients[0], memory_order_acquire);

		if (first && first(sig, si, uc))
			return;
	}
	saved_errno = errno;
	for (int i = o->patch_first ? 1 : 0; i < o->nclients; i++) {
		pki_sigown_fn fn = atomic_load_explicit(&o->clients[i], memory_order_acquire);

		if (fn && fn(sig, si, uc))
			goto out;
	}
	deliver(o, sig, si, uc);
out:
	errno = saved_errno;
}

/* Is @cur (the kernel's action) our handler? */
static bool ours(const struct sigaction *cur)
{
	return (cur->sa_flags & SA_SIGINFO) && cur->sa_sigaction == owner_handler;
}

bool pki_sigown_is_handler(const struct sigaction *act)
{
	return ours(act);
}

/* ---- installing --------------------------------------------------------- */

/* Under `lock`.  (Re)install ours with the current handler_block. */
static int __install(struct owner *o)
{
	struct sigaction sa = {
	    .sa_sigaction = owner_handler,
	    .sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK | SA_NODEFER,
	};

	sa.sa_mask = o->handler_block;
	if (!atomic_load(&o->installed)) {
		struct sigaction prev, hidden;

		/* Read first: once ours is in, a signal may chain at any moment. */
		if (sys_sigaction(o->sig, NULL, &prev))
			return -errno;
		/* SO5: a catcher's handler: it becomes our fallback, what it replaced the app's */
		if (pki_fatal_ours(o->sig, &prev) && pki_fatal_hides(o->sig, &hidden, false)) {
			atomic_store(&o->fallback, prev.sa_sigaction);
			prev = hidden;
		}
		__app_store(o, &prev);
	}
	if (sys_sigaction(o->sig, &sa, NULL))
		return -errno;
	atomic_store(&o->installed, true);
	return 0;
}

int pki_sigown_client_add(int sig, int client, pki_sigown_fn fn, int block)
{
	struct owner *o = owner_of(sig);
	sigset_t saved;
	bool more = false;
	int err = 0;

	if (!o || client < 0 || client >= o->nclients || !fn)
		return -EINVAL;
	lock_take(&saved);
	if (!atomic_load(&o->installed))
		sigemptyset(&o->handler_block);
	/* Published before the handler can run: the first signal finds it. */
	atomic_store_explicit(&o->clients[client], fn, memory_order_release);
	if (!o->wanted[client]) {
		o->wanted[client] = true;
		atomic_fetch_add_explicit(&o->nwanted, 1, memory_order_release);
	}
	if (block > 0 && !sigismember(&o->handler_block, block)) {
		sigaddset(&o->handler_block, block);
		more = true;
	}
	if (!atomic_load(&o->installed) || more)
		err = __install(o);
	lock_drop(&saved);
	return err;
}

bool pki_sigown_client_drop(int sig, int client)
{
	struct owner *o = owner_of(sig);
	struct sigaction act;
	sigset_t saved;
	bool others = false;

	if (!o || client < 0 || client >= o->nclients)
		return false;
	if (pki_threads_pending(1ull << (sig - 1), 1000))
		return false;
	lock_take(&saved);
	if (o->wanted[client]) {
		o->wanted[client] = false;
		atomic_fetch_sub_explicit(&o->nwanted, 1, memory_order_release);
	}
	for (int i = 0; i < o->nclients; i++)
		others |= o->wanted[i];
	if (atomic_load(&o->installed) && !others) {
		struct sigaction cur;
		fallback_fn fb = atomic_load(&o->fallback);

		/*
		 * The application's action as we last saw it, unless it set its
		 * own since without us seeing it (an attached agent interposes
		 * no sigaction()): then that one stays.  SO5: SIG_DFL with a
		 * fallback gives the catcher its handler back; anything else
		 * is the program's, and the catcher lets go.
		 */
		app_load(o, &act);
		if (!sys_sigaction(sig, NULL, &cur) && ours(&cur)) {
			if (fb && is_dfl(&act)) {
				struct sigaction c = {.sa_sigaction = fb,
						      .sa_flags = SA_SIGINFO | SA_ONSTACK};

				sigfillset(&c.sa_mask); /* as pki_fatal_catch() installs it */
				sys_sigaction(sig, &c, NULL);
			} else {
				sys_sigaction(sig, &act, NULL);
				if (fb)
					pki_fatal_hides(sig, NULL, true);
			}
		}
		atomic_store(&o->fallback, NULL);
		atomic_store(&o->installed, false);
	}
	lock_drop(&saved);
	return true;
}

int pki_sigown_app_action(int sig, const struct sigaction *act, struct sigaction *old)
{
	struct owner *o = owner_of(sig);
	struct sigaction want;
	sigset_t saved;
	int err = 0;

	if (!o)
		return -EINVAL;
	if (lock_mine) /* a handler interrupted this thread's own writer */
		return -EDEADLK;
	if (act)
		want = *act; /* (act may be old) */
	lock_take(&saved);
	if (!atomic_load(&o->installed)) {
		if (sys_sigaction(sig, act ? &want : NULL, old))
			err = -errno;
	} else {
		if (old)
			app_load(o, old);
		if (act)
			__app_store(o, &want);
	}
	lock_drop(&saved);
	return err;
}

int pki_sigown_fallback_take(int sig, fallback_fn fn, struct sigaction *old)
{
	struct owner *o = owner_of(sig);
	struct sigaction act;
	sigset_t saved;
	int r = 0;

	if (!o || lock_mine)
		return 0;
	lock_take(&saved);
	if (atomic_load(&o->installed)) {
		app_load(o, &act);
		r = is_dfl(&act) ? 1 : -1;
		if (r > 0) {
			atomic_store(&o->fallback, fn);
			*old = act;
		}
	}
	lock_drop(&saved);
	return r;
}

void pki_sigown_fallback_drop(int sig, fallback_fn fn)
{
	struct owner *o = owner_of(sig);

	if (o)
		atomic_compare_exchange_strong(&o->fallback, &fn, NULL);
}

bool pki_sigown_data_overlaps(uintptr_t lo, uintptr_t hi)
{
	return lo < (uintptr_t)(&own + 1) && (uintptr_t)&own < hi;
}
