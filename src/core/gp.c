// SPDX-License-Identifier: MIT
/*
 * Grace periods for hooks, in the spirit of the kernel's RCU-tasks: a thread
 * is quiescent when it is seen outside every trampoline body and callback.
 *
 * Read side.  Every library trampoline increments the thread's nesting
 * counter (pki_tramp_nest, initial-exec TLS) as its first instruction and
 * decrements it right before its last; everything the registry publishes
 * (runtime tables, ops arrays, ops, trampolines) is loaded and used only in
 * between.  Outside that, a thread can be in trampoline memory only at a
 * "window" (tramp.S): first instruction, final ret, or the dispatcher's final
 * jmp, always with [rsp] = site + 5.
 *
 * Write side, pki_gp_synchronize():
 *  1. List the threads of the process (/proc/self/task), except the caller.
 *  2. Send each one PKI_GP_SIGNAL with the round number (rt_tgsigqueueinfo).
 *  3. On the thread, the handler answers "busy" if its counter is >= 0.
 *     Otherwise it is quiescent; if it sits at a window it is first moved on
 *     as if it executed the window with the state published now: entry ->
 *     the site's current target (or back into the function body if none),
 *     dispatcher jmp -> the site's current direct address (or body), ret ->
 *     the body.  It answers "quiescent".
 *  4. Busy threads are asked again (new round) after a short back-off; a
 *     thread that does not answer is checked for existence (an exited thread
 *     is quiescent).
 *
 * Proof sketch.  Let P be the writer's unpublish (a pointer store, or text
 * pokes followed by a core sync) of object X, before the call.  The writer
 * issues the signal after P (syscall: full barrier); the handler runs on the
 * target T after a kernel entry/exit that took the signal lock the sender
 * released, so T's handler and everything T does after it observe P.  When
 * the handler runs with T's counter at -1, T holds no reference loaded before
 * P (references live only while the counter is >= 0), and it is not at a
 * window into X any more (moved on using state loaded after P).  Hence after
 * its answer T cannot reach X.  Threads created after the listing began never
 * saw pre-P state; listed threads that exited hold nothing.  So when every
 * listed thread has answered "quiescent" once, no thread can reach X.
 *
 * Limits (documented in hook.h): a thread that blocks PKI_GP_SIGNAL delays
 * grace periods until it unblocks (a warning is printed once); a thread
 * whose own signal handler interrupted it exactly at a window and that stays
 * in that handler across a whole grace period is not covered (its window is
 * in the outer signal frame, which we cannot see).
 *
 * Deferred frees (pki_gp_defer) go to one background thread that batches all
 * of them under a single grace period, like call_rcu.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "arch/x86_64/tramp.h"
#include "core/gp.h"
#include "core/log.h"
#include "core/tmem.h"

struct gp_target {
	pid_t tid;
	unsigned long answer; /* round << 1 | busy, written by the handler */
};

/* gp_lock serialises grace periods; the fields below are under it. */
static pthread_mutex_t gp_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gp_target *targets;
static size_t ntargets, cap_targets;
/* Current round: read by handlers; changes only when no handler of the old
 * round can still be answering (every target answered or exited). */
static unsigned long gp_round;
static uint32_t gp_answers; /* futex: bumped by each answer */

static void gp_handler(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;
	unsigned long v = (unsigned long)si->si_value.sival_ptr;
	unsigned long round = v >> 24, idx = v & 0xffffff;
	int saved = errno;
	bool busy;

	(void)sig;
	if (si->si_code != SI_QUEUE || si->si_pid != getpid() ||
	    round != __atomic_load_n(&gp_round, __ATOMIC_ACQUIRE))
		goto out;
	busy = pki_tramp_in_hook();
	if (!busy && pki_tmem_contains(pki_tramp_uc_ip(uc))) {
		unsigned long site = pki_tramp_uc_site(uc), to = 0;

		switch (pki_tramp_window(pki_tramp_uc_ip(uc))) {
		case PKI_WIN_ENTRY:
			to = pki_hook_rt_target(site);
			break;
		case PKI_WIN_DIRECT:
			to = pki_hook_rt_direct(site);
			break;
		case PKI_WIN_RET:
			break;
		case PKI_WIN_NONE:
			busy = true; /* cannot happen; never claim quiescence */
			break;
		}
		if (!busy) {
			if (to)
				pki_tramp_uc_jmp(uc, to);
			else
				pki_tramp_uc_ret(uc);
		}
	}
	__atomic_store_n(&targets[idx].answer, round << 1 | busy, __ATOMIC_RELEASE);
	__atomic_add_fetch(&gp_answers, 1, __ATOMIC_RELEASE);
	syscall(SYS_futex, &gp_answers, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
out:
	errno = saved;
}

static void gp_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = gp_handler;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigfillset(&sa.sa_mask);
	if (sigaction(PKI_GP_SIGNAL, &sa, NULL))
		pki_warn("hooks: sigaction(%d): %s\n", PKI_GP_SIGNAL, pki_errstr(errno));
}

static pthread_once_t gp_once = PTHREAD_ONCE_INIT;

static int __list_threads(pid_t self)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *de;

	if (!d)
		return -errno;
	ntargets = 0;
	while ((de = readdir(d))) {
		pid_t tid = (pid_t)atoi(de->d_name);

		if (tid <= 0 || tid == self)
			continue;
		if (ntargets == cap_targets) {
			size_t cap = cap_targets ? 2 * cap_targets : 64;
			struct gp_target *t = realloc(targets, cap * sizeof(*t));

			if (!t) {
				closedir(d);
				return -ENOMEM;
			}
			targets = t;
			cap_targets = cap;
		}
		targets[ntargets++] = (struct gp_target){.tid = tid};
	}
	closedir(d);
	return 0;
}

static int __ask(pid_t pid, size_t i)
{
	siginfo_t si;

	memset(&si, 0, sizeof(si));
	si.si_signo = PKI_GP_SIGNAL;
	si.si_code = SI_QUEUE;
	si.si_pid = pid;
	si.si_uid = getuid();
	si.si_value.sival_ptr = (void *)(gp_round << 24 | i);
	if (syscall(SYS_rt_tgsigqueueinfo, pid, targets[i].tid, PKI_GP_SIGNAL, &si))
		return -errno;
	return 0;
}

static bool thread_gone(pid_t pid, pid_t tid)
{
	return syscall(SYS_tgkill, pid, tid, 0) && errno == ESRCH;
}

int pki_gp_synchronize(void)
{
	pid_t pid = getpid(), self = (pid_t)syscall(SYS_gettid);
	struct timespec backoff = {0, 10000};
	size_t left;
	int err, waits = 0;
	bool warned = false;

	if (pki_tramp_in_hook())
		return -EDEADLK;
	pthread_once(&gp_once, gp_install);
	pthread_mutex_lock(&gp_lock);
	err = __list_threads(self);
	if (err)
		goto unlock;
	/* Targets still to hear "quiescent" from sit in [0, left). */
	left = ntargets;
	while (left) {
		uint32_t seen;

		__atomic_add_fetch(&gp_round, 1, __ATOMIC_RELEASE);
		for (size_t i = 0; i < left; i++) {
			targets[i].answer = 0;
			err = __ask(pid, i);
			if (err == -ESRCH)
				targets[i].answer = gp_round << 1; /* exited: quiescent */
			else if (err == -EAGAIN)
				targets[i].answer = gp_round << 1 | 1; /* queue full: ask again */
		}
		/* Wait until each has answered this round or exited. */
		for (;;) {
			size_t missing = 0;
			struct timespec to = {0, 10 * 1000 * 1000};

			seen = __atomic_load_n(&gp_answers, __ATOMIC_ACQUIRE);
			for (size_t i = 0; i < left; i++) {
				unsigned long a = __atomic_load_n(&targets[i].answer, __ATOMIC_ACQUIRE);

				if (a >> 1 == gp_round)
					continue;
				if (thread_gone(pid, targets[i].tid))
					targets[i].answer = gp_round << 1;
				else
					missing++;
			}
			if (!missing)
				break;
			if (syscall(SYS_futex, &gp_answers, FUTEX_WAIT_PRIVATE, seen, &to, NULL, 0) &&
			    errno == ETIMEDOUT && ++waits == 200 && !warned) {
				pki_warn("hooks: grace period waits for a thread that does not take "
					 "signal %d: %s\n", PKI_GP_SIGNAL, pki_errstr(ETIMEDOUT));
				warned = true;
			}
		}
		/* Keep the busy ones at the front for the next round. */
		size_t busy = 0;

		for (size_t i = 0; i < left; i++)
			if (targets[i].answer & 1)
				targets[busy++] = targets[i];
		left = busy;
		if (left) {
			nanosleep(&backoff, NULL);
			if (backoff.tv_nsec < 1000 * 1000)
				backoff.tv_nsec *= 2;
		}
	}
	err = 0;
unlock:
	pthread_mutex_unlock(&gp_lock);
	return err;
}

/* Deferred frees. */
struct gp_cb {
	struct gp_cb *next;
	void (*fn)(void *);
	void *arg;
};

/* defer_lock guards the queue and the counters; the worker waits on defer_cv. */
static pthread_mutex_t defer_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t defer_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static struct gp_cb *queue;
static unsigned long queued, done; /* callbacks ever queued / run */
static bool worker_up;

static void *defer_worker(void *unused)
{
	(void)unused;
	pthread_mutex_lock(&defer_lock);
	for (;;) {
		struct gp_cb *list;
		unsigned long n;

		while (!queue)
			pthread_cond_wait(&defer_cv, &defer_lock);
		list = queue;
		queue = NULL;
		n = queued;
		pthread_mutex_unlock(&defer_lock);
		/* One grace period for the whole batch, queued before it began. */
		pki_gp_synchronize();
		while (list) {
			struct gp_cb *next = list->next;

			list->fn(list->arg);
			free(list);
			list = next;
		}
		pthread_mutex_lock(&defer_lock);
		done = n;
		pthread_cond_broadcast(&done_cv);
	}
	return NULL;
}

static int __start_worker(void)
{
	pthread_attr_t attr;
	pthread_t th;
	sigset_t all, old;
	int err;

	/* The worker takes no signal but the grace-period one. */
	sigfillset(&all);
	sigdelset(&all, PKI_GP_SIGNAL);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	err = -pthread_create(&th, &attr, defer_worker, NULL);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!err) {
		pthread_setname_np(th, "probekit-gp");
		worker_up = true;
	}
	return err;
}

void pki_gp_defer(void (*fn)(void *), void *arg)
{
	struct gp_cb *cb = malloc(sizeof(*cb));

	pthread_mutex_lock(&defer_lock);
	if (!cb || (!worker_up && __start_worker())) {
		pthread_mutex_unlock(&defer_lock);
		free(cb);
		pki_gp_synchronize();
		fn(arg);
		return;
	}
	*cb = (struct gp_cb){.next = queue, .fn = fn, .arg = arg};
	queue = cb;
	queued++;
	pthread_cond_signal(&defer_cv);
	pthread_mutex_unlock(&defer_lock);
}

void pki_gp_barrier(void)
{
	unsigned long want;

	pthread_mutex_lock(&defer_lock);
	want = queued;
	while (done < want)
		pthread_cond_wait(&done_cv, &defer_lock);
	pthread_mutex_unlock(&defer_lock);
}
