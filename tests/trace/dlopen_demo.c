// SPDX-License-Identifier: MIT
/*
 * A host program for tests/trace/test-trace-dlopen.sh: loads its plugin
 * (libpkplugin.so, found through its own RUNPATH $ORIGIN: the name has no
 * slash), calls it from the main thread and from 2 threads, opens it a
 * second time and closes that handle (the object stays), closes it for
 * good, loads it again and calls it again; also dlopen(NULL) and
 * RTLD_NOLOAD.  Prints the plugin's own call counts, summed over both
 * loads, as "calls NAME N" lines, and exits with status 3.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct plug_counts {
	unsigned long work, leaf, add;
};

struct plug {
	void *h;
	unsigned long (*work)(unsigned long);
	int (*add)(int, int);
	void (*counts)(struct plug_counts *);
};

static struct plug_counts total;
static volatile unsigned long sink;

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

/* Add this load's counts to the total, then close it. */
static void unload(struct plug *p)
{
	struct plug_counts c;

	p->counts(&c);
	total.work += c.work;
	total.leaf += c.leaf;
	total.add += c.add;
	if (dlclose(p->h))
		die("dlclose");
}

static void *worker(void *arg)
{
	struct plug *p = arg;

	for (int i = 0; i < 2000; i++) {
		sink += p->work(7);
		sink += (unsigned long)p->add(i, 1);
	}
	return NULL;
}

static void calls(struct plug *p, int rounds)
{
	pthread_t t[2];

	for (int i = 0; i < rounds; i++)
		sink += p->work((unsigned long)i % 13);
	for (int i = 0; i < 2; i++)
		if (pthread_create(&t[i], NULL, worker, p))
			exit(1);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
}

int main(void)
{
	struct plug p;
	void *again, *self, *noload;

	load(&p);
	calls(&p, 500);

	/* A second handle: a reference only; closing it keeps the object. */
	again = dlopen("libpkplugin.so", RTLD_NOW);
	noload = dlopen("libpkplugin.so", RTLD_NOW | RTLD_NOLOAD);
	self = dlopen(NULL, RTLD_NOW);
	if (!again || !noload || !self)
		die("dlopen again");
	if (dlclose(again) || dlclose(noload) || dlclose(self))
		die("dlclose again");
	calls(&p, 300);
	unload(&p);

	/* Gone: RTLD_NOLOAD finds nothing now. */
	noload = dlopen("libpkplugin.so", RTLD_NOW | RTLD_NOLOAD);
	if (noload)
		die("still loaded after dlclose");

	load(&p);
	calls(&p, 200);
	unload(&p);

	printf("dlopen_demo: %lu calls\n", total.work + total.leaf + total.add);
	printf("calls plug_work %lu\n", total.work);
	printf("calls plug_leaf %lu\n", total.leaf);
	printf("calls plug_add %lu\n", total.add);
	return 3;
}
