// SPDX-License-Identifier: MIT
/*
 * Found by review of the signal-free grace periods: libprobekit.so makes a
 * thread-specific-data key whose destructor is its own code; a program that
 * dlopen()s it, hooks, unhooks and dlclose()s it crashed when a thread that
 * had run a hook exited (the destructor was unmapped).  The library is now
 * linked -z nodelete.  argv[1]: the shared library.  Exit 0 when it
 * survives.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include <probekit/hook.h>

__attribute__((noinline, patchable_function_entry(5, 0))) int hooked(int x)
{
	__asm__ volatile("");
	return x + 1;
}

static void cb(unsigned long ip, unsigned long pip, struct pk_ops *o, struct pk_regs *r)
{
	(void)ip, (void)pip, (void)o, (void)r;
}

static pthread_barrier_t b;

static void *thr(void *a)
{
	(void)a;
	hooked(1); /* registers this thread */
	pthread_barrier_wait(&b);
	pthread_barrier_wait(&b); /* main dlcloses meanwhile */
	return NULL;
}

int main(int argc, char **argv)
{
	void *h = dlopen(argc > 1 ? argv[1] : "libprobekit.so", RTLD_NOW);
	int (*reg)(struct pk_ops *), (*unreg)(struct pk_ops *);
	unsigned long ip = (unsigned long)hooked;
	PK_OPTS(pk_ops, ops, .func = cb,
		.filter = PK_OPTS_INIT(pk_ops_filter, .ips = &ip, .nips = 1));
	pthread_t th;

	if (!h)
		return fprintf(stderr, "%s\n", dlerror()), 2;
	reg = (int (*)(struct pk_ops *))dlsym(h, "pk_ops_register");
	unreg = (int (*)(struct pk_ops *))dlsym(h, "pk_ops_unregister");
	if (!reg || !unreg)
		return 2;
	pthread_barrier_init(&b, NULL, 2);
	if (reg(&ops))
		return 2;
	pthread_create(&th, NULL, thr, NULL);
	pthread_barrier_wait(&b);
	printf("unregister: %d\n", unreg(&ops));
	printf("dlclose: %d\n", dlclose(h));
	fflush(stdout);
	pthread_barrier_wait(&b);
	pthread_join(th, NULL);
	printf("survived\n");
	return 0;
}
