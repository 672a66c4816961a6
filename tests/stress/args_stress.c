// SPDX-License-Identifier: MIT
/*
 * args_stress: the hooks of `probekit trace -A/-R/-F` under fire
 * (tests/stress/test-trace-args-stress.sh gives the options).  Rounds of
 * worker threads, more than the CPUs, some blocking every signal, make
 * calls whose recorded values say whether they are their own:
 *
 *   leaf(n, "v<n>") returns 2n;
 *   held(n) calls leaf(n, "v<n>") and returns n % 3 - 1 (-F keeps -1);
 *   cond_fn(n, s) with s "keep-<n>" or "drop-<n>" (-F keeps "keep*");
 *   one of the 10,200 generated functions pks_f<i> (tests/stress), whose
 *   first argument and result are i (and i | PKS_BAD if the hook clobbered
 *   an argument register: counted as bad).
 *
 * Meanwhile a thread sends SIGUSR1 to the workers as fast as it can; the
 * handler makes calls of the same kinds (sig_leaf, sig_held), nested in
 * whatever it interrupts (a held call's hold, a record, a commit).  Between
 * rounds the main thread forks a child that makes CHILD_SETS sets of calls
 * and exits.  At the end it prints its own counts, which the trace must
 * match exactly: "leaf L held H kept K cond C pks F bad B children N
 * signals S".
 *
 * usage: args_stress [ROUNDS [WORKERS [SETS]]]   (default 8 16 1500)
 * ARGS_STRESS_NOFORK=1 in the environment: no forks.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "stress.h"

#define P	    __attribute__((noinline, patchable_function_entry(5)))
#define WORKERS_MAX 64
#define CHILD_SETS  100

__thread struct pks_ctx *pks_ctx; /* (the generated functions write their return address) */
static __thread struct pks_ctx own_ctx;

static volatile long sink;
static atomic_long n_leaf, n_held, n_kept, n_cond, n_pks, n_bad;
static _Atomic pid_t tids[WORKERS_MAX];
static atomic_int stop_signals;

P int leaf(int n, const char *s)
{
	sink += s[0];
	return 2 * n;
}

/* "v<n>" into @buf, without stdio (signal handlers use it). */
static const char *tag(char *buf, const char *prefix, int n)
{
	char digits[16];
	int k = 0, i = 0;

	while (*prefix)
		buf[i++] = *prefix++;
	do
		digits[k++] = (char)('0' + n % 10);
	while ((n /= 10) != 0);
	while (k)
		buf[i++] = digits[--k];
	buf[i] = '\0';
	return buf;
}

P int held(int n)
{
	char s[24];

	leaf(n, tag(s, "v", n));
	return n % 3 - 1;
}

P int cond_fn(int n, const char *s)
{
	sink += s[0];
	return n;
}

/* The signal handler's own: its calls are not all recorded (see calls_in_handler()). */
P int sig_leaf(int n, const char *s)
{
	sink += s[0];
	return 2 * n;
}

P int sig_held(int n)
{
	char s[24];

	sig_leaf(n, tag(s, "v", n));
	return n % 3 - 1;
}

/* One set of calls for @n (@n >= 0), counted. */
static void calls(int n)
{
	unsigned i = (unsigned)n % pks_nfuncs;
	unsigned long r;
	char s[24];

	leaf(n, tag(s, "v", n));
	held(n);
	cond_fn(n, tag(s, n % 2 ? "keep-" : "drop-", n));
	r = pks_funcs[i](i, i, 0, 0, 0, PKS_KEY(i) ^ i, (double)(i & 0xffff));
	atomic_fetch_add(&n_leaf, 2);
	atomic_fetch_add(&n_held, 1);
	atomic_fetch_add(&n_kept, n % 3 == 0);
	atomic_fetch_add(&n_cond, n % 2);
	atomic_fetch_add(&n_pks, 1);
	atomic_fetch_add(&n_bad, r != i);
}

/*
 * The handler's calls, nested in whatever it interrupts.  Not all of them
 * are recorded, by design: one that interrupts a hook's callback runs
 * unhooked (hook.h, "Recursion"), and an event recorded while the
 * interrupted thread was inside a record is lost, counted.  So they have
 * functions of their own, whose recorded calls are checked for their
 * values but not counted.
 */
static atomic_long n_sig;

static void on_usr1(int sig)
{
	static atomic_int next;
	int n = atomic_fetch_add(&next, 1) % 1000000000;
	char s[24];

	(void)sig;
	sig_leaf(n, tag(s, "v", n));
	sig_held(n);
	atomic_fetch_add(&n_sig, 1);
}

static int sets;

struct worker {
	pthread_t th;
	int id, round;
};

static void *work(void *arg)
{
	struct worker *w = arg;

	pks_ctx = &own_ctx;
	if (w->id % 4 == 3) { /* blocks every signal: none of the storm lands here */
		sigset_t all;

		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, NULL);
	}
	atomic_store(&tids[w->id], (pid_t)syscall(SYS_gettid));
	for (int k = 0; k < sets; k++)
		calls((w->round * WORKERS_MAX + w->id) * 100000 + k);
	atomic_store(&tids[w->id], 0);
	return NULL;
}

static void *storm(void *arg)
{
	unsigned seed = 1;

	(void)arg;
	while (!atomic_load(&stop_signals)) {
		pid_t t = atomic_load(&tids[rand_r(&seed) % WORKERS_MAX]);

		if (t)
			syscall(SYS_tgkill, getpid(), t, SIGUSR1);
		else
			sched_yield();
	}
	return NULL;
}

static int child(int round)
{
	pks_ctx = &own_ctx;
	atomic_store(&n_bad, 0);
	for (int k = 0; k < CHILD_SETS; k++)
		calls(900000000 + round * 1000 + k);
	_exit(atomic_load(&n_bad) ? 1 : 0);
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 8, workers = argc > 2 ? atoi(argv[2]) : 16;
	struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_RESTART};
	struct worker w[WORKERS_MAX];
	bool forks = !getenv("ARGS_STRESS_NOFORK");
	pthread_t st;
	int children = 0, st_rc;

	sets = argc > 3 ? atoi(argv[3]) : 1500;
	if (workers > WORKERS_MAX)
		workers = WORKERS_MAX;
	pks_ctx = &own_ctx;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	pthread_create(&st, NULL, storm, NULL);
	for (int r = 0; r < rounds; r++) {
		pid_t pid;

		for (int i = 0; i < workers; i++) {
			w[i] = (struct worker){.id = i, .round = r};
			pthread_create(&w[i].th, NULL, work, &w[i]);
		}
		fflush(stdout);
		pid = forks ? fork() : -1;
		if (pid == 0)
			child(r);
		for (int i = 0; i < workers; i++)
			pthread_join(w[i].th, NULL);
		if (pid > 0 && waitpid(pid, &st_rc, 0) == pid && WIFEXITED(st_rc) &&
		    WEXITSTATUS(st_rc) == 0)
			children++;
	}
	atomic_store(&stop_signals, 1);
	pthread_join(st, NULL);
	printf("leaf %ld held %ld kept %ld cond %ld pks %ld bad %ld children %d signals %ld\n",
	       atomic_load(&n_leaf), atomic_load(&n_held), atomic_load(&n_kept),
	       atomic_load(&n_cond), atomic_load(&n_pks), atomic_load(&n_bad), children,
	       atomic_load(&n_sig));
	return atomic_load(&n_bad) != 0 || children != (forks ? rounds : 0);
}
