// SPDX-License-Identifier: MIT
/*
 * selfhook: a program that links libprobekit and reads its own patchable
 * sites with it (pk_sites_foreach: the library's site table, read under
 * liburcu), for test-trace-exit.sh: traced by `probekit trace -f
 * demo_leaf`, it must run as plainly ("sites demo_ found") and the trace must
 * hold its demo_leaf calls.
 */
#include <stdio.h>
#include <string.h>

#include <probekit/probekit.h>
#include <probekit/sites.h>

#define FN __attribute__((noinline, noclone))

static volatile unsigned long sink;

FN unsigned long demo_leaf(unsigned long x)
{
	return x * 2654435761u ^ (x >> 7);
}

FN unsigned long demo_other(unsigned long x)
{
	return x + 1;
}

static int count_demo(const struct pk_site *s, void *arg)
{
	if (!strncmp(s->name, "demo_", 5))
		++*(int *)arg;
	return 0;
}

int main(void)
{
	int n = 0, err = pk_sites_foreach(count_demo, &n);

	if (err < 0) {
		printf("pk_sites_foreach: %d\n", err);
		return 1;
	}
	for (unsigned long i = 0; i < 10; i++)
		sink += demo_leaf(i) + demo_other(i);
	/* A function the agent hooked no longer has its patchable entry: 1 or 2. */
	printf("sites demo_ %s\ncalls demo_leaf 10\n", n >= 1 ? "found" : "none");
	return 0;
}
