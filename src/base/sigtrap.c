// SPDX-License-Identifier: MIT
/*
 * The library's one SIGTRAP handler.  The patcher (INT3 emulation) and the
 * watchpoints (perf hits) register as clients; the handler offers each trap
 * to them and passes what neither claims to the application's action,
 * running it as the kernel would have: with its sa_mask and SIGTRAP blocked
 * (unless it asked SA_NODEFER), SA_RESETHAND honoured, SIG_IGN ignored,
 * SIG_DFL the default action (the process dies of SIGTRAP).  One exception:
 * once the patcher is a client, INT3 sites may exist, and the handler may
 * call a function hooked through one; a trap met with SIGTRAP blocked kills
 * the process, so SIGTRAP is then never blocked in the application's
 * handler (sa_mask or not), and a SIGTRAP raised while it runs (its own kill
 * or INT3) runs it again, nested, instead of pending or killing the process.
 *
 * Why one handler: two handlers that each chained to whatever was installed
 * before them made the order depend on who came first, and a program that
 * installed its own handler later took every trap, ours included.  The
 * agent routes the program's sigaction()/signal() calls for SIGTRAP to
 * pki_sigtrap_app_action(): its handler becomes the one we chain to.
 *
 * Flags: SA_NODEFER, so that a handler interrupting ours (a SIGALRM handler
 * that calls a hooked function, a callback that touches watched memory) can
 * trap again and be handled instead of meeting a blocked SIGTRAP, which the
 * kernel answers by killing the process; the clients are re-entrant for it.
 * SA_SIGINFO for si_code and si_perf_data; SA_RESTART so that a trap never
 * makes a blocking call fail with EINTR; SA_ONSTACK so that a trap on a
 * nearly full stack uses the alternate stack if the thread has one.  The
 * signals the clients ask for (the sled kick) stay blocked in it and in the
 * application's handler it runs.  Not honoured from the application's
 * action: SA_ONSTACK and the absence of SA_RESTART (ours apply).
 *
 * The application's action is read in signal context and written by any
 * thread, also from signal handlers: a sequence count makes reads lock-free,
 * and writers hold `lock` with every signal blocked, so that no handler can
 * interrupt a writer on its own thread and spin on its half-written copy.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/siglock.h"
#include "base/sigtrap.h"
#include "base/threads.h"

#define ACT_WORDS ((sizeof(struct sigaction) + sizeof(long) - 1) / sizeof(long))

static struct {
	atomic_uint seq; /* odd while a writer is copying */
	_Atomic unsigned long w[ACT_WORDS];
} app;

/*
 * A client's function, once registered, stays: a trap already dequeued
 * for our handler when its client left (pki_sigtrap_client_drop()) must
 * still find it (a late watchpoint hit is swallowed, not passed on to a
 * default action that kills).  `wanted` (under `lock`) says who is still
 * there; with nobody, SIGTRAP goes back to the application.
 */
static _Atomic(pki_sigtrap_fn) clients[PKI_SIGTRAP_NR];
static bool wanted[PKI_SIGTRAP_NR];
static _Atomic(pki_sigaction_fn) sys_fn;
static atomic_bool installed;

/* Under `lock`: the signals the clients keep blocked in the handler. */
static sigset_t handler_block;
static atomic_flag lock = ATOMIC_FLAG_INIT;

static int sys_sigaction(const struct sigaction *act, struct sigaction *old)
{
	pki_sigaction_fn fn = atomic_load_explicit(&sys_fn, memory_order_acquire);

	return (fn ? fn : sigaction)(SIGTRAP, act, old);
}

void pki_sigtrap_set_sys(pki_sigaction_fn fn)
{
	atomic_store_explicit(&sys_fn, fn, memory_order_release);
}

bool pki_sigtrap_installed(void)
{
	return atomic_load(&installed);
}

/*
 * Every signal but SIGTRAP blocked first: the holder cannot be interrupted
 * by a handler that wants the lock on its own thread.  SIGTRAP stays
 * deliverable: the calls made under the lock (sigaction, the mask's
 * restore) may be libc functions that are being patched (relocation in
 * every object), and a trap met with SIGTRAP blocked kills the process.
 * Our own handler, interrupting the holder, takes no lock and reads the
 * action the holder is writing as it was before (lock_mine, app_writing).
 * Held for a few stores or one sigaction call.
 */
static __thread bool lock_mine;	  /* this thread holds `lock` */
static __thread bool app_writing; /* this thread is inside __app_store's stores */
static struct sigaction app_prev; /* under `lock`: the action before the one being stored */

static void lock_take(sigset_t *saved)
{
	pki_siglock_block(saved);
	lock_mine = true; /* before the flag is ours, and after it is not: no window */
	atomic_signal_fence(memory_order_seq_cst);
	pki_siglock_wait(&lock);
}

static void lock_drop(const sigset_t *saved)
{
	pki_siglock_release(&lock);
	atomic_signal_fence(memory_order_seq_cst);
	lock_mine = false;
	pthread_sigmask(SIG_SETMASK, saved, NULL);
}

/*
 * fork() in another thread while one holds the lock: the child gets it free.
 * The lock is the innermost of all: clients take it under their own locks
 * (pki_sigtrap_client_add and _drop are called holding the watchpoint
 * manager's or the patch lock), so fork's prepare must take it after theirs.
 * Prepare handlers run in the reverse order of registration: registered at
 * load, before any client's, ours runs last.  Code whose own constructors
 * may make a client register first (the agent's, which run before the
 * library's) calls pki_sigtrap_init() before anything else.
 */
static void fork_prepare(void)
{
	pki_siglock_wait(&lock);
}

static void fork_release(void)
{
	pki_siglock_release(&lock);
}

static void register_atfork(void)
{
	pthread_atfork(fork_prepare, fork_release, fork_release);
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

void pki_sigtrap_init(void)
{
	pthread_once(&atfork_once, register_atfork);
}

__attribute__((constructor)) static void sigtrap_load(void)
{
	pki_sigtrap_init();
}

static void app_words(unsigned long buf[ACT_WORDS])
{
	for (size_t i = 0; i < ACT_WORDS; i++)
		buf[i] = atomic_load_explicit(&app.w[i], memory_order_relaxed);
}

/* Under `lock`. */
static void __app_store(const struct sigaction *act)
{
	unsigned long buf[ACT_WORDS] = {0}, cur[ACT_WORDS];
	unsigned int s = atomic_load_explicit(&app.seq, memory_order_relaxed);

	memcpy(buf, act, sizeof(*act));
	app_words(cur); /* complete: only lock holders write */
	memcpy(&app_prev, cur, sizeof(app_prev));
	atomic_signal_fence(memory_order_seq_cst);
	app_writing = true;
	atomic_signal_fence(memory_order_seq_cst);
	atomic_store_explicit(&app.seq, s + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	for (size_t i = 0; i < ACT_WORDS; i++)
		atomic_store_explicit(&app.w[i], buf[i], memory_order_relaxed);
	atomic_store_explicit(&app.seq, s + 2, memory_order_release);
	atomic_signal_fence(memory_order_seq_cst);
	app_writing = false;
}

/*
 * Any context.  A writer on ANOTHER thread finishes soon; one on this
 * thread (our handler interrupted it: SIGTRAP stays deliverable under the
 * lock) never will before we return, so we take the action it replaces.
 */
static unsigned int app_load(struct sigaction *act)
{
	unsigned long buf[ACT_WORDS];
	unsigned int s1, s2;

	for (;;) {
		s1 = atomic_load_explicit(&app.seq, memory_order_acquire);
		if ((s1 & 1) && app_writing) {
			*act = app_prev;
			return s1;
		}
		if (!(s1 & 1)) {
			for (size_t i = 0; i < ACT_WORDS; i++)
				buf[i] = atomic_load_explicit(&app.w[i], memory_order_relaxed);
			atomic_thread_fence(memory_order_acquire);
			s2 = atomic_load_explicit(&app.seq, memory_order_relaxed);
			if (s1 == s2)
				break;
		}
		sched_yield();
	}
	memcpy(act, buf, sizeof(*act));
	return s1;
}

/* ---- the handler -------------------------------------------------------- */

/*
 * The default action of SIGTRAP (terminate with a core dump): give the
 * kernel SIG_DFL back and send the signal again.  SIGTRAP is not blocked in
 * our handler, so it is delivered on the way out of tgkill.
 */
static void default_action(void)
{
	struct sigaction dfl = {.sa_handler = SIG_DFL};

	sigemptyset(&dfl.sa_mask);
	sys_sigaction(&dfl, NULL);
	syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), SIGTRAP);
}

static void chain(int sig, siginfo_t *si, void *uc)
{
	struct sigaction act;
	sigset_t add, saved;
	unsigned int seq = app_load(&act);
	bool masked = false;

	if (act.sa_handler == SIG_IGN)
		return;
	if (act.sa_handler == SIG_DFL) {
		default_action();
		return;
	}
	if (act.sa_flags & SA_RESETHAND) {
		/* one-shot: the next trap gets the default action, as with the kernel */
		struct sigaction dfl = {.sa_handler = SIG_DFL};
		sigset_t s;

		sigemptyset(&dfl.sa_mask);
		if (lock_mine) /* we interrupted this thread's own store: leave it be */
			goto run;
		lock_take(&s);
		if (atomic_load_explicit(&app.seq, memory_order_relaxed) == seq)
			__app_store(&dfl);
		lock_drop(&s);
	}
run:
	add = act.sa_mask;
	if (atomic_load_explicit(&clients[PKI_SIGTRAP_PATCH], memory_order_relaxed))
		sigdelset(&add, SIGTRAP); /* INT3 sites may exist (the header comment) */
	else if (!(act.sa_flags & SA_NODEFER))
		sigaddset(&add, SIGTRAP);
	if (!sigisemptyset(&add)) {
		pthread_sigmask(SIG_BLOCK, &add, &saved);
		masked = true;
	}
	if (act.sa_flags & SA_SIGINFO)
		act.sa_sigaction(sig, si, uc);
	else
		act.sa_handler(sig);
	/* (the kernel restores the interrupted mask from uc when we return) */
	if (masked)
		pthread_sigmask(SIG_SETMASK, &saved, NULL);
}

/*
 * The patcher's client first, before anything that may call libc: its INT3s
 * can stand in libc's own functions while they are patched (with relocation
 * in every object), errno's own __errno_location() included, so the path
 * that claims them calls none and leaves errno alone (sigtrap.h).  Saving
 * errno first would trap again, in every nested handler, without end.
 */
static void sigtrap_handler(int sig, siginfo_t *si, void *uc)
{
	pki_sigtrap_fn patch =
	    atomic_load_explicit(&clients[PKI_SIGTRAP_PATCH], memory_order_acquire);
	int saved_errno;

	if (patch && patch(sig, si, uc))
		return;
	saved_errno = errno;
	for (int i = 0; i < PKI_SIGTRAP_NR; i++) {
		pki_sigtrap_fn fn = atomic_load_explicit(&clients[i], memory_order_acquire);

		if (i != PKI_SIGTRAP_PATCH && fn && fn(sig, si, uc))
			goto out;
	}
	chain(sig, si, uc);
out:
	errno = saved_errno;
}

/* ---- installing --------------------------------------------------------- */

/* Under `lock`.  (Re)install ours with the current handler_block. */
static int __install(void)
{
	struct sigaction sa = {
	    .sa_sigaction = sigtrap_handler,
	    .sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK | SA_NODEFER,
	};

	sa.sa_mask = handler_block;
	if (!atomic_load(&installed)) {
		struct sigaction prev;

		/* Read first: once ours is in, a trap may chain at any moment. */
		if (sys_sigaction(NULL, &prev))
			return -errno;
		__app_store(&prev);
	}
	if (sys_sigaction(&sa, NULL))
		return -errno;
	atomic_store(&installed, true);
	return 0;
}

int pki_sigtrap_client_add(enum pki_sigtrap_client client, pki_sigtrap_fn fn, int block)
{
	sigset_t saved;
	bool more = false;
	int err = 0;

	if (client < 0 || client >= PKI_SIGTRAP_NR || !fn)
		return -EINVAL;
	lock_take(&saved);
	if (!atomic_load(&installed))
		sigemptyset(&handler_block);
	/* Published before the handler can run: the first trap finds it. */
	atomic_store_explicit(&clients[client], fn, memory_order_release);
	wanted[client] = true;
	if (block > 0 && !sigismember(&handler_block, block)) {
		sigaddset(&handler_block, block);
		more = true;
	}
	if (!atomic_load(&installed) || more)
		err = __install();
	lock_drop(&saved);
	return err;
}

bool pki_sigtrap_client_drop(enum pki_sigtrap_client client)
{
	struct sigaction act;
	sigset_t saved;
	bool others = false;

	if (client < 0 || client >= PKI_SIGTRAP_NR)
		return false;
	if (pki_threads_pending(1ull << (SIGTRAP - 1), 1000))
		return false;
	lock_take(&saved);
	wanted[client] = false;
	for (int i = 0; i < PKI_SIGTRAP_NR; i++)
		others |= wanted[i];
	if (atomic_load(&installed) && !others) {
		struct sigaction cur;

		/*
		 * The application's action as we last saw it, unless it set its
		 * own since without us seeing it (an attached agent interposes
		 * no sigaction()): then that one stays.
		 */
		app_load(&act);
		if (!sys_sigaction(NULL, &cur) && (cur.sa_flags & SA_SIGINFO) &&
		    cur.sa_sigaction == sigtrap_handler)
			sys_sigaction(&act, NULL);
		atomic_store(&installed, false);
	}
	lock_drop(&saved);
	return true;
}

int pki_sigtrap_app_action(const struct sigaction *act, struct sigaction *old)
{
	sigset_t saved;
	int err = 0;

	lock_take(&saved);
	if (!atomic_load(&installed)) {
		if (sys_sigaction(act, old))
			err = -errno;
	} else {
		if (old)
			app_load(old);
		if (act)
			__app_store(act);
	}
	lock_drop(&saved);
	return err;
}
