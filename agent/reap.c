// SPDX-License-Identifier: MIT
/*
 * The process ends when the program's last thread does, as it would
 * without us.  The agent's threads (the trace drainer, the watch consumer,
 * the library's grace-period worker, liburcu's call_rcu thread) are threads
 * like the program's: once main() leaves with pthread_exit() or
 * syscall(SYS_exit), glibc's count of threads never falls to zero when the
 * program's last one ends, and the kernel ends a process only when its
 * last thread is gone: ours would keep it alive for ever, blocking every
 * signal but SIGKILL.
 *
 * So when the main thread leaves (the wrappers below, and agent/trace.c's
 * syscall()), a thread of ours (reaper) waits until the program has no
 * thread left but ours (base/threads.h, pki_threads_only_ours: /proc/self/task,
 * polled from 1 ms up to every 64 ms), then ends the process the way the
 * program's last thread would have:
 *
 *  - main left with pthread_exit() (or thrd_exit()): glibc's last thread
 *    calls exit(0): we call exit(0), so atexit handlers run, stdio is
 *    flushed and the trace is completed as at any exit.  They run on our
 *    thread, with main's signal mask when it left.
 *  - main left with syscall(SYS_exit, CODE): no exit() ran, and the kernel
 *    gives the status of the thread that ends last: CODE if main was the
 *    program's last thread; else 0, what glibc's threads end with, or the
 *    CODE of a later syscall(SYS_exit) of another thread (taken as the
 *    last).  The trace is completed as for _exit().
 *
 * The reaper's own calls are never events (it is one of ours while it
 * polls); the program's atexit handlers it runs are recorded, unless a
 * call of its polling was already seen (--relocate-all traces libc's
 * open/read): the thread then stays ours and their calls are not recorded.
 *
 * Not seen: a main thread that leaves by a raw exit system call of its own
 * (inline assembly): the process then still outlives its threads.
 *
 * What runs where: the wrappers in the leaving thread, normal context; the
 * reaper on its own thread.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "agent_int.h"
#include "base/signals.h"
#include "base/threads.h"

#define PK_EXPORT	 __attribute__((visibility("default")))
#define REAP_POLL_MAX_NS 64000000L

static struct {
	pid_t pid;     /* the process whose main thread left (a fork child has its own) */
	bool raw;      /* main left with syscall(SYS_exit) */
	int status;    /* atomic: the status a raw ending gives */
	sigset_t mask; /* main's when it left */
} R;

static void *reaper(void *arg)
{
	struct timespec ts = {0, 1000000};

	(void)arg;
	while (!pki_threads_only_ours()) {
		nanosleep(&ts, NULL);
		if (ts.tv_nsec < REAP_POLL_MAX_NS)
			ts.tv_nsec *= 2;
	}
	if (R.raw) {
		int status = __atomic_load_n(&R.status, __ATOMIC_ACQUIRE);

		agent_exit_flush(status);
		agent_exit_really(status);
	}
	pthread_sigmask(SIG_SETMASK, &R.mask, NULL);
	pki_worker_leave(); /* the atexit handlers are the program's: their calls are events */
	exit(0);
}

void agent_thread_leaves(bool raw, int code)
{
	pid_t pid = getpid();
	pthread_t th;
	int saved = errno;

	if ((pid_t)syscall(SYS_gettid) != pid) {
		/* Another thread's syscall(SYS_exit) after main's: taken as the last. */
		if (raw && __atomic_load_n(&R.pid, __ATOMIC_ACQUIRE) == pid)
			__atomic_store_n(&R.status, code & 0xff, __ATOMIC_RELEASE);
		return;
	}
	if (R.pid == pid)
		return; /* already waiting (main cannot leave twice) */
	R.raw = raw;
	R.status = raw && pki_threads_only_ours() ? code & 0xff : 0;
	pthread_sigmask(SIG_SETMASK, NULL, &R.mask);
	__atomic_store_n(&R.pid, pid, __ATOMIC_RELEASE);
	if (pki_worker_start(&th, true, "probekit-reap", reaper, NULL))
		R.pid = 0; /* no thread: as before, the process outlives its threads */
	errno = saved;
}

/* glibc's thrd_exit() leaves through its internal pthread_exit: routed through ours. */
PK_EXPORT __attribute__((noreturn)) void thrd_exit(int res)
{
	pthread_exit((void *)(intptr_t)res);
}
