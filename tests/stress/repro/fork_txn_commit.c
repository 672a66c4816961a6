// SPDX-License-Identifier: MIT
/*
 * Found by stress_hook at scale (--background 10000
 * --background-callers 4 -t 200, where a controller's call can take 2-3 s):
 * a fork child hangs for ever in its first hook call instead of failing
 * with -ENOTRECOVERABLE, as hook.h promises, when fork() gave up waiting
 * (2 s) for another thread's pk_txn_commit().  hook_fork_child() sets
 * hook_broken and returns before it drops the other thread's open
 * transaction (txn_open stays true), and the child's hook_enter() waits on
 * txn_cv while txn_open && !txn_mine, before it looks at hook_broken:
 * nobody is left to broadcast.
 *
 * Here a thread sleeps 4 s inside a callback, so the commit of a
 * transaction that unregisters that ops waits for its grace period; main
 * forks meanwhile.  Exit 0 when correct (the child's pk_ops_register
 * returns, whatever it returns), 1 when the child is still inside it after
 * 5 s.  Failed on main at afb75ef; fixed since (hook_enter() looks at
 * hook_broken before it waits for a transaction).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <probekit/hook.h>

__attribute__((noinline, patchable_function_entry(5, 0))) int hooked(int x)
{
	__asm__ volatile("");
	return x + 1;
}

static atomic_int in_cb, committing;
static __thread int block_here;

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts))
		;
}

static void cb(unsigned long ip, unsigned long pip, struct pk_ops *o, struct pk_regs *r)
{
	(void)ip, (void)pip, (void)o, (void)r;
	if (block_here) {
		atomic_store(&in_cb, 1);
		sleep_ms(4000); /* holds the commit's grace period off */
	}
}

static void nop_cb(unsigned long ip, unsigned long pip, struct pk_ops *o, struct pk_regs *r)
{
	(void)ip, (void)pip, (void)o, (void)r;
}

static unsigned long ip;
static PK_OPTS(pk_ops, ops, .func = cb,
	       .filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));

static void *reader(void *arg)
{
	(void)arg;
	block_here = 1;
	hooked(0);
	return NULL;
}

static void *committer(void *arg)
{
	int err;

	(void)arg;
	if ((err = pk_txn_begin()) || (err = pk_ops_unregister(&ops))) {
		printf("txn: %d\n", err);
		return NULL;
	}
	atomic_store(&committing, 1);
	err = pk_txn_commit();
	printf("parent: pk_txn_commit = %d\n", err);
	return NULL;
}

static void on_alarm(int sig)
{
	static const char m[] = "child: still inside pk_ops_register after 5 s (hung)\n";

	(void)sig;
	(void)!write(1, m, sizeof(m) - 1);
	_exit(1);
}

int main(void)
{
	pthread_t r, c;
	pid_t pid;
	int st;

	ip = (unsigned long)hooked;
	if (pk_ops_register(&ops))
		return 2;
	pthread_create(&r, NULL, reader, NULL);
	while (!atomic_load(&in_cb))
		sleep_ms(1);
	pthread_create(&c, NULL, committer, NULL);
	while (!atomic_load(&committing))
		sleep_ms(1);
	sleep_ms(200); /* the commit is waiting for the grace period, under its lock */
	fflush(stdout);
	pid = fork(); /* waits 2 s for the commit, then goes on without it */
	if (pid < 0)
		return 2;
	if (!pid) {
		unsigned long cip = (unsigned long)hooked;
		PK_OPTS(pk_ops, o2, .func = nop_cb,
			.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &cip, .nips = 1));
		int err;

		signal(SIGALRM, on_alarm);
		alarm(5);
		err = pk_ops_register(&o2);
		printf("child: pk_ops_register = %d (%s)\n", err, strerror(-err));
		fflush(stdout);
		_exit(0);
	}
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return 1;
	pthread_join(c, NULL);
	pthread_join(r, NULL);
	printf("child exit %d\n", WEXITSTATUS(st));
	return WEXITSTATUS(st);
}
