// SPDX-License-Identifier: MIT
/*
 * A host program for tests/cli/trace/test-trace-dlopen.sh.  Its plugin,
 * libpkplugin.so, is found through the host's own RUNPATH $ORIGIN (the
 * name has no slash); it brings its dependency libpkplugdep.so along.
 * Plugin calls happen in three loads:
 *   A. main loads it and calls it; 2 threads open their own handles at
 *      the same time, call it, and close them (the object stays: main's
 *      handle); a second handle, RTLD_NOLOAD and dlopen(NULL) are opened
 *      and closed; with --fork, a child calls it too; main closes it:
 *      unloaded, with its dependency.
 *   B. 2 threads load it at the same time, call it, and close it.
 *   C. main loads it again, calls it, closes it.
 * The plugin counts its own calls; the program prints them, summed over
 * the loads, as "calls NAME N" lines after "dlopen_demo: N calls" (the
 * child's after "child: N calls"), and exits with status 3.
 *
 * --fork-race: a thread loads, calls and unloads the plugin 200 times while
 * main forks 200 children (each exits at once); prints "fork race: done"
 * and exits 0.  A fork during a dlopen or dlclose must neither deadlock nor
 * leave the child a half-updated state.
 *
 * --spinner: a thread blocks every signal and spins without a system call
 * while main loads the plugin, calls it, and closes it; prints the plugin's
 * counts as above, then "spinner: dlclose N" and exits 0.  Neither the
 * dlopen (hooking) nor the dlclose (a grace period) may hang on it.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct plug_counts {
	unsigned long work, leaf, add, dep;
};

struct plug {
	void *h;
	unsigned long (*work)(unsigned long);
	int (*add)(int, int);
	void (*counts)(struct plug_counts *);
};

static struct plug_counts total;
static volatile unsigned long sink;
static pthread_barrier_t bar;

static void die(const char *what)
{
	fprintf(stderr, "dlopen_demo: %s: %s\n", what, dlerror());
	exit(1);
}

static void load(struct plug *p)
{
	p->h = dlopen("libpkplugin.so", RTLD_NOW);
	if (!p->h)
		die("dlopen");
	p->work = (unsigned long (*)(unsigned long))dlsym(p->h, "plug_work");
	p->add = (int (*)(int, int))dlsym(p->h, "plug_add");
	p->counts = (void (*)(struct plug_counts *))dlsym(p->h, "plug_counts");
	if (!p->work || !p->add || !p->counts)
		die("dlsym");
}

/* This load's counts (the plugin's, since it was loaded) into the total. */
static void add_counts(struct plug *p)
{
	struct plug_counts c;

	p->counts(&c);
	total.work += c.work;
	total.leaf += c.leaf;
	total.add += c.add;
	total.dep += c.dep;
}

static void calls(struct plug *p, int rounds)
{
	for (int i = 0; i < rounds; i++) {
		sink += p->work((unsigned long)i % 13);
		sink += (unsigned long)p->add(i, 1);
	}
}

/* Open a handle at the same time as the other thread, call, close it. */
static void *worker(void *arg)
{
	struct plug p;

	pthread_barrier_wait(&bar);
	load(&p);
	calls(&p, 2000);
	pthread_barrier_wait(&bar); /* every call made */
	if (arg)
		add_counts(&p); /* B: the load is the threads' own */
	pthread_barrier_wait(&bar);
	if (dlclose(p.h))
		die("dlclose");
	return NULL;
}

static void threads(bool count)
{
	pthread_t t[2];

	for (int i = 0; i < 2; i++)
		if (pthread_create(&t[i], NULL, worker, count && !i ? (void *)1 : NULL))
			exit(1);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
}

/* Ends the child with exit(): its own frame stays open in the child's trace. */
__attribute__((noinline, noreturn)) static void child(struct plug *p)
{
	struct plug_counts a, b;

	p->counts(&a);
	calls(p, 100);
	p->counts(&b);
	printf("child: %lu calls\n",
	       b.work + b.leaf + b.add + b.dep - a.work - a.leaf - a.add - a.dep);
	printf("calls plug_work %lu\n", b.work - a.work);
	printf("calls plug_leaf %lu\n", b.leaf - a.leaf);
	printf("calls plug_add %lu\n", b.add - a.add);
	printf("calls plug_dep %lu\n", b.dep - a.dep);
	exit(0);
}

static void *reloader(void *arg)
{
	struct plug p;

	for (int i = 0; i < 200; i++) {
		load(&p);
		calls(&p, 10);
		if (dlclose(p.h))
			die("dlclose");
	}
	return arg;
}

static int fork_race(void)
{
	pthread_t t;
	pid_t pid;

	if (pthread_create(&t, NULL, reloader, NULL))
		exit(1);
	for (int i = 0; i < 200; i++) {
		pid = fork();
		if (pid == 0)
			_exit(0);
		if (pid < 0 || waitpid(pid, NULL, 0) != pid)
			exit(1);
	}
	pthread_join(t, NULL);
	printf("fork race: done\n");
	return 0;
}

static atomic_bool spin_stop, spin_ready;

static void *spinner(void *arg)
{
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, NULL);
	atomic_store(&spin_ready, true);
	while (!atomic_load_explicit(&spin_stop, memory_order_relaxed))
		;
	return arg;
}

static int spin_close(void)
{
	struct plug p;
	pthread_t t;
	int r;

	if (pthread_create(&t, NULL, spinner, NULL))
		exit(1);
	while (!atomic_load(&spin_ready))
		;
	load(&p);
	calls(&p, 100);
	add_counts(&p);
	r = dlclose(p.h);
	atomic_store(&spin_stop, true);
	pthread_join(t, NULL);
	printf("dlopen_demo: %lu calls\n", total.work + total.leaf + total.add + total.dep);
	printf("calls plug_work %lu\n", total.work);
	printf("calls plug_leaf %lu\n", total.leaf);
	printf("calls plug_add %lu\n", total.add);
	printf("calls plug_dep %lu\n", total.dep);
	printf("spinner: dlclose %d\n", r);
	return 0;
}

int main(int argc, char **argv)
{
	bool fork_child = argc > 1 && !strcmp(argv[1], "--fork");
	void *again, *self, *noload;
	struct plug p;
	pid_t pid;

	if (argc > 1 && !strcmp(argv[1], "--fork-race"))
		return fork_race();
	if (argc > 1 && !strcmp(argv[1], "--spinner"))
		return spin_close();
	pthread_barrier_init(&bar, NULL, 2);
	/* A */
	load(&p);
	calls(&p, 500);
	threads(false);
	again = dlopen("libpkplugin.so", RTLD_NOW);
	noload = dlopen("libpkplugin.so", RTLD_NOW | RTLD_NOLOAD);
	self = dlopen(NULL, RTLD_NOW);
	if (!again || !noload || !self)
		die("dlopen again");
	if (dlclose(again) || dlclose(noload) || dlclose(self))
		die("dlclose again");
	calls(&p, 300);
	if (fork_child) {
		fflush(stdout);
		pid = fork();
		if (pid == 0)
			child(&p);
		if (pid < 0 || waitpid(pid, NULL, 0) != pid)
			exit(1);
	}
	add_counts(&p);
	if (dlclose(p.h))
		die("dlclose");
	if (dlopen("libpkplugin.so", RTLD_NOW | RTLD_NOLOAD) ||
	    dlopen("libpkplugdep.so", RTLD_NOW | RTLD_NOLOAD))
		die("still loaded after dlclose");
	/* B */
	threads(true);
	if (dlopen("libpkplugin.so", RTLD_NOW | RTLD_NOLOAD))
		die("still loaded after the threads' dlclose");
	/* C */
	load(&p);
	calls(&p, 200);
	add_counts(&p);
	if (dlclose(p.h))
		die("dlclose");

	printf("dlopen_demo: %lu calls\n", total.work + total.leaf + total.add + total.dep);
	printf("calls plug_work %lu\n", total.work);
	printf("calls plug_leaf %lu\n", total.leaf);
	printf("calls plug_add %lu\n", total.add);
	printf("calls plug_dep %lu\n", total.dep);
	return 3;
}
