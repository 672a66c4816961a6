// SPDX-License-Identifier: MIT
/*
 * Who is scribbling on my variable?  Four threads share `balance`: two only
 * read it, the accountant updates it properly, and a rogue thread corrupts it
 * now and then.  One all-threads write watchpoint catches every write; the
 * SIGTRAP-side only pushes the hit into a lock-free queue, and an ordinary
 * reporter thread prints thread id, instruction address and function name
 * (dladdr; the program is linked with -rdynamic).  At the end the program
 * compares the writes it made itself with the hits it saw.
 *
 *   build/examples/corrupt
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <probekit/watch.h>

#define ROUNDS 2000

volatile long balance = 100;
static atomic_long writes; /* what the program itself did */
static atomic_bool stop;
static pthread_barrier_t start;

/* Non-static and noinline so dladdr can name them. */
__attribute__((noinline)) void deposit(long amount)
{
	balance += amount;
	atomic_fetch_add(&writes, 1);
}

__attribute__((noinline)) void scribble(long junk)
{
	balance = junk;
	atomic_fetch_add(&writes, 1);
}

static void *accountant(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&start);
	for (int i = 0; i < ROUNDS; i++)
		if (i % 250 == 0)
			deposit(10);
	return NULL;
}

static void *rogue(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&start);
	for (int i = 0; i < ROUNDS; i++)
		if (i % 500 == 123) /* now and then, but the same every run */
			scribble(-i);
	return NULL;
}

static void *reader(void *arg)
{
	long sum = 0;

	(void)arg;
	pthread_barrier_wait(&start);
	for (int i = 0; i < ROUNDS; i++)
		sum += balance; /* reads are not watched (write watchpoint) */
	return (void *)sum;
}

/* Library messages: warnings only (why a watchpoint was refused). */
static int print_warnings(enum pk_print_level level, const char *fmt, va_list ap)
{
	return level == PK_WARN ? vfprintf(stderr, fmt, ap) : 0;
}

static void *reporter(void *arg)
{
	struct pk_hitq *q = arg;
	PK_OPTS(pk_watch_hit, h);
	long seen = 0;

	for (;;) {
		bool last = atomic_load(&stop);

		while (!pk_hitq_pop(q, &h)) {
			Dl_info info = {0};

			/* h.ip is just AFTER the writing instruction (x86 traps after) */
			dladdr((void *)(h.ip - 1), &info);
			printf("write #%ld: thread %d at %#lx in %s()\n", ++seen, (int)h.tid,
			       (unsigned long)h.ip, info.dli_sname ? info.dli_sname : "??");
		}
		if (last)
			break;
		usleep(1000);
	}
	return (void *)seen;
}

int main(void)
{
	void *(*fn[4])(void *) = {accountant, rogue, reader, reader};
	struct pk_hitq *q = pk_hitq_new(1024);
	pthread_t th[4], rep;
	struct pk_watch *w;
	void *seen;

	pk_set_print(print_warnings);
	if (!q)
		return perror("pk_hitq_new"), 1;
	pthread_barrier_init(&start, NULL, 4);
	/* threads that exist before the watchpoint ... */
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, fn[i], NULL);
	{
		PK_OPTS(pk_watch_opts, o, .queue = q);

		w = pk_watch_add((const void *)&balance, sizeof(balance), PK_WATCH_W, &o);
	}
	if (!w)
		return perror("pk_watch_add"), errno == ENODEV || errno == EOPNOTSUPP ? 77 : 1;
	/* ... and threads created after it are all watched */
	for (int i = 2; i < 4; i++)
		pthread_create(&th[i], NULL, fn[i], NULL);
	pthread_create(&rep, NULL, reporter, q);

	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	pk_watch_remove(w); /* no hit is in flight after this */
	atomic_store(&stop, true);
	pthread_join(rep, &seen);

	printf("%ld writes made, %ld caught, %lu dropped: %s\n", atomic_load(&writes), (long)seen,
	       pk_hitq_dropped(q),
	       (long)seen == atomic_load(&writes) ? "every write was caught" : "WRITES MISSED");
	pk_hitq_free(q);
	return (long)seen == atomic_load(&writes) ? 0 : 1;
}
