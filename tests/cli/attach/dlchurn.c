// SPDX-License-Identifier: MIT
/*
 * A program that loads and unloads a library without pause
 * (tests/cli/attach/test-trace-pid-dl.sh): dlopen(argv[1]), dlclose, again,
 * every 2 ms, from its only thread, until the file "stop" exists; prints
 * "ready PID" first and "rounds N" at the end (exit status 1 if a dlopen
 * failed).  An attach meets the dynamic loader's locks taken at any moment.
 *
 * With a second argument, each round holds the library loaded for 1 ms and
 * calls that function of it (int (int), tests/cli/attach/plug.c's plug_fn:
 * x * 3 + 1) just after the load and just before the unload; "bad N"
 * counts the wrong results.  While the file "hold" exists, a round keeps
 * its instance loaded until a tracer hooked it (the function's first bytes
 * differ from those of the instance loaded before "ready", which no tracer
 * saw), then calls it three times, prints "hooked", and waits for "hold" to
 * go: the test then knows calls were made through the hook, whenever the
 * tracer's look at the loaded libraries happened to come.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef int (*plug_fn)(int);

/* Enough to see any hook's write: an INT3 on the first byte, or a whole new instruction. */
#define ENTRY_BYTES 8

static unsigned char unhooked[ENTRY_BYTES];

static int load(const char *lib, const char *name, void **h, plug_fn *fn)
{
	*h = dlopen(lib, RTLD_NOW);
	if (!*h) {
		fprintf(stderr, "dlchurn: %s\n", dlerror());
		return -1;
	}
	if (!name)
		return 0;
	*fn = (plug_fn)dlsym(*h, name);
	if (!*fn) {
		fprintf(stderr, "dlchurn: %s\n", dlerror());
		return -1;
	}
	return 0;
}

static int holding(void)
{
	return !access("hold", F_OK);
}

/* One more wrong result of @fn at @round? */
static long wrong(plug_fn fn, long round)
{
	return fn((int)round) != (int)round * 3 + 1;
}

/* "hold": keep @fn's instance until it is hooked, call it through the hook, say so. */
static long hold_until_hooked(plug_fn fn, long round)
{
	long bad = 0;

	while (holding() && !memcmp((const void *)(uintptr_t)fn, unhooked, ENTRY_BYTES))
		usleep(1000);
	if (!holding())
		return 0; /* released before a hook came */
	for (int k = 0; k < 3; k++)
		bad += wrong(fn, round);
	printf("hooked\n");
	fflush(stdout);
	while (holding())
		usleep(1000);
	return bad;
}

int main(int argc, char **argv)
{
	const char *name = argc > 2 ? argv[2] : NULL;
	long rounds = 0, bad = 0;
	plug_fn fn = NULL;
	void *h;

	if (argc < 2)
		return 2;
	if (name) {
		if (load(argv[1], name, &h, &fn))
			return 1;
		memcpy(unhooked, (const void *)(uintptr_t)fn, ENTRY_BYTES);
		dlclose(h);
	}
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	while (access("stop", F_OK)) {
		if (load(argv[1], name, &h, &fn))
			return 1;
		if (name) {
			bad += wrong(fn, rounds);
			if (holding())
				bad += hold_until_hooked(fn, rounds);
			usleep(1000);
			bad += wrong(fn, rounds);
		}
		dlclose(h);
		rounds++;
		usleep(name ? 1000 : 2000);
	}
	printf("rounds %ld\n", rounds);
	if (name)
		printf("bad %ld\n", bad);
	return 0;
}
