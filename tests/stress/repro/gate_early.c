// SPDX-License-Identifier: MIT
/*
 * Found by review of the thread-creation gate (src/watch/gate.c): its lock
 * was initialised by a constructor, after threads started by an earlier
 * constructor (another library's, or the agent's) had already used it: the
 * re-made lock lost a reader, and the next pk_watch_add() waited for ever
 * (4 of 6 runs).  Linked with the static archive, so that our constructor
 * runs before the library's.  Exit 0 when pk_watch_add() returns, 3 when it
 * is stuck after 3 s, 77 (SKIP) where hardware breakpoints are not
 * delivered: the add is refused before the gate.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <probekit/watch.h>

static volatile int stop;
static pthread_t looper_th;
static long var;

static void *noop(void *a)
{
	return a;
}

static void *looper(void *a)
{
	while (!stop) {
		pthread_t t;

		if (!pthread_create(&t, NULL, noop, NULL))
			pthread_join(t, NULL);
	}
	return a;
}

__attribute__((constructor(101))) static void early(void)
{
	pthread_create(&looper_th, NULL, looper, NULL);
	usleep(20000);
}

static void on_alarm(int s)
{
	static const char m[] = "HANG: pk_watch_add stuck in the thread gate\n";

	(void)s;
	if (write(2, m, sizeof(m) - 1) < 0)
		_exit(3);
	_exit(3);
}

int main(void)
{
	struct pk_watch *w;

	usleep(20000);
	stop = 1;
	pthread_join(looper_th, NULL);
	signal(SIGALRM, on_alarm);
	alarm(3);
	PK_OPTS(pk_watch_opts, o, .mode = PK_WATCH_MODE_HW); /* the gate is the hardware's */
	w = pk_watch_add(&var, sizeof(var), PK_WATCH_W, &o);
	if (!w && errno == EOPNOTSUPP) {
		/* refused before the gate: nothing here was tested */
		printf("SKIP: hardware breakpoints are not delivered here\n");
		return 77;
	}
	printf("pk_watch_add returned %s\n", w ? "a watchpoint" : "NULL (no breakpoints here?)");
	if (w)
		pk_watch_remove(w);
	return 0;
}
