// SPDX-License-Identifier: MIT
/* Probekit's own threads and the last-flush fatal-signal handlers (see signals.h). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/futex.h"
#include "base/signals.h"
#include "base/sigown.h"

/*
 * The handshake of pki_worker_start(): the new thread copies what it runs,
 * then sets @started and wakes the starter, which waits for it.  The starter
 * owns this (on its stack) until it has seen @started set, and the new
 * thread touches it for the last time in that store's wake-up: so the
 * starter's frame outlives every access.
 */
struct worker_start {
	void *(*fn)(void *);
	void *arg;
	uint32_t started; /* atomic futex word */
};

/*
 * The tids of our threads (pki_worker_is).  A slot is taken by the thread
 * itself and given back when its function returns; a slot whose thread is
 * gone from this process (a fork child sees its parent's) is taken again.
 */
#define NWORKERS 32
static pid_t workers[NWORKERS];

static bool worker_slot_stale(pid_t tid)
{
	int saved = errno;
	bool gone = tid && syscall(SYS_tgkill, getpid(), tid, 0) && errno == ESRCH;

	errno = saved;
	return gone;
}

void pki_worker_adopt(void)
{
	pid_t self = (pid_t)syscall(SYS_gettid);

	if (pki_worker_is(self))
		return;
	for (int i = 0; i < NWORKERS; i++) {
		pid_t t = __atomic_load_n(&workers[i], __ATOMIC_ACQUIRE);

		if ((!t || worker_slot_stale(t)) &&
		    __atomic_compare_exchange_n(&workers[i], &t, self, false, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE))
			return;
	}
	/* All taken: the thread passes for the program's (pki_threads_only_ours waits on). */
}

void pki_worker_leave(void)
{
	pid_t self = (pid_t)syscall(SYS_gettid);

	for (int i = 0; i < NWORKERS; i++) {
		pid_t t = self;

		__atomic_compare_exchange_n(&workers[i], &t, 0, false, __ATOMIC_ACQ_REL,
					    __ATOMIC_ACQUIRE);
	}
}

bool pki_worker_is(pid_t tid)
{
	for (int i = 0; i < NWORKERS; i++)
		if (tid && __atomic_load_n(&workers[i], __ATOMIC_ACQUIRE) == tid)
			return true;
	return false;
}

static void *worker_main(void *p)
{
	struct worker_start *ws = p;
	void *(*fn)(void *) = ws->fn;
	void *arg = ws->arg;
	void *ret;

	pki_worker_adopt(); /* before the starter returns: no window where it passes for PROG's */
	__atomic_store_n(&ws->started, 1, __ATOMIC_RELEASE);
	pki_futex_wake(&ws->started, 1);
	ret = fn(arg);
	pki_worker_leave();
	return ret;
}

void pki_worker_mask_enter(sigset_t *saved)
{
	sigset_t set;

	sigfillset(&set);
	sigdelset(&set, PKI_SIG_KICK);
	sigdelset(&set, SIGTRAP);
	pthread_sigmask(SIG_SETMASK, &set, saved);
}

int pki_worker_start(pthread_t *th, bool detached, const char *name, void *(*fn)(void *), void *arg)
{
	struct worker_start ws = {.fn = fn, .arg = arg};
	pthread_attr_t attr;
	sigset_t saved;
	int err;

	pki_worker_mask_enter(&saved);
	pthread_attr_init(&attr);
	if (detached)
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	err = -pthread_create(th, &attr, worker_main, &ws);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	while (!err && !__atomic_load_n(&ws.started, __ATOMIC_ACQUIRE))
		pki_futex_wait(&ws.started, 0, NULL); /* EINTR, EAGAIN: look again */
	if (!err && name)
		pthread_setname_np(*th, name);
	return err;
}

/*
 * The catchers with signals caught (pki_fatal_hides reads them from any
 * thread or handler): a slot is taken at the first catch and kept.
 */
#define NCATCHERS 4
static struct pki_fatal *catchers[NCATCHERS];

static void catcher_add(struct pki_fatal *f)
{
	for (int i = 0; i < NCATCHERS; i++) {
		struct pki_fatal *c = __atomic_load_n(&catchers[i], __ATOMIC_ACQUIRE);

		if (c == f)
			return;
		if (!c && __atomic_compare_exchange_n(&catchers[i], &c, f, false, __ATOMIC_ACQ_REL,
						      __ATOMIC_ACQUIRE))
			return;
		if (c == f)
			return;
	}
}

bool pki_fatal_hides(int sig, struct sigaction *old, bool taken)
{
	if (sig <= 0 || sig >= NSIG)
		return false;
	for (int i = 0; i < NCATCHERS; i++) {
		struct pki_fatal *f = __atomic_load_n(&catchers[i], __ATOMIC_ACQUIRE);
		bool yes = true;

		if (!f || !__atomic_load_n(&f->caught[sig], __ATOMIC_ACQUIRE))
			continue;
		if (taken && !__atomic_compare_exchange_n(&f->caught[sig], &yes, false, false,
							  __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			continue; /* let go meanwhile */
		if (old)
			*old = f->old[sig];
		return true;
	}
	return false;
}

/* The catcher that holds @sig, or NULL. */
static struct pki_fatal *holder(int sig)
{
	if (sig <= 0 || sig >= NSIG)
		return NULL;
	for (int i = 0; i < NCATCHERS; i++) {
		struct pki_fatal *f = __atomic_load_n(&catchers[i], __ATOMIC_ACQUIRE);

		if (f && __atomic_load_n(&f->caught[sig], __ATOMIC_ACQUIRE))
			return f;
	}
	return NULL;
}

bool pki_fatal_ours(int sig, const struct sigaction *cur)
{
	struct pki_fatal *f = holder(sig);

	return f && (cur->sa_flags & SA_SIGINFO) && cur->sa_sigaction == f->handler;
}

void pki_fatal_set_default(int sig, const struct sigaction *act)
{
	struct pki_fatal *f = holder(sig);

	if (f)
		f->old[sig] = *act;
}

void pki_fatal_catch(struct pki_fatal *f, const int *sigs, size_t n)
{
	struct sigaction sa = {.sa_sigaction = f->handler, .sa_flags = SA_SIGINFO | SA_ONSTACK};
	size_t i;

	catcher_add(f);
	sigfillset(&sa.sa_mask);
	for (i = 0; i < n; i++) {
		int sig = sigs[i];
		struct sigaction old;
		int owned;

		if (f->caught[sig])
			continue;
		/* SO5: a signal the owner holds: our handler is its fallback, not a second one */
		owned = pki_sigown_fallback_take(sig, f->handler, &old);
		if (owned) {
			if (owned > 0) {
				f->old[sig] = old;
				__atomic_store_n(&f->caught[sig], true, __ATOMIC_RELEASE);
			}
			continue;
		}
		if (sigaction(sig, NULL, &old) || old.sa_handler != SIG_DFL ||
		    (old.sa_flags & SA_SIGINFO))
			continue; /* the program handles or ignores it: leave it be */
		f->old[sig] = old;
		if (!sigaction(sig, &sa, NULL))
			__atomic_store_n(&f->caught[sig], true, __ATOMIC_RELEASE);
	}
}

static bool is_fault(int signo)
{
	return signo == SIGSEGV || signo == SIGBUS || signo == SIGILL || signo == SIGFPE;
}

void pki_fatal_die(struct pki_fatal *f, int signo, const siginfo_t *si)
{
	int saved = errno;

	/* Let go first: the agent's sigaction() would keep ours for a SIG_DFL (signals.h). */
	__atomic_store_n(&f->caught[signo], false, __ATOMIC_RELEASE);
	/*
	 * SO5: the owner holds @signo: the default action is the application's
	 * there (as through the agent's sigaction()), and the owner, which ran
	 * us as its fallback, ends the process itself.
	 */
	if (!pki_sigown_installed(signo) || pki_sigown_app_action(signo, &f->old[signo], NULL))
		sigaction(signo, &f->old[signo], NULL);
	/* si_code > 0: sent by the kernel for the faulting instruction, which runs again. */
	if (!is_fault(signo) || si->si_code <= 0)
		raise(signo);
	errno = saved;
}

void pki_fatal_release(struct pki_fatal *f)
{
	int sig;

	for (sig = 1; sig < NSIG; sig++) {
		struct sigaction cur;

		bool yes = true;

		/* Let go first: the program's sigaction() queries see the kernel's again. */
		if (!__atomic_compare_exchange_n(&f->caught[sig], &yes, false, false,
						 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			continue;
		pki_sigown_fallback_drop(sig, f->handler); /* SO5 */
		/* Only if still ours: the program may have installed its own since. */
		if (!sigaction(sig, NULL, &cur) && (cur.sa_flags & SA_SIGINFO) &&
		    cur.sa_sigaction == f->handler)
			sigaction(sig, &f->old[sig], NULL);
	}
}
