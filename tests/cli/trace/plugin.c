// SPDX-License-Identifier: MIT
/*
 * The plugin that dlopen_demo.c loads, unloads and loads again under
 * `probekit trace` (tests/cli/trace/test-trace-dlopen.sh).  Built with
 * -fpatchable-function-entry=5: every plug_ function is a site.  It counts
 * its own calls; plug_counts() is not a site, so that reading the counts
 * adds none.  plug_add() calls plug_dep() of its dependency libpkplugdep.so.
 */
#include <stdatomic.h>

#define NOSITE __attribute__((patchable_function_entry(0, 0), noinline))

struct plug_counts {
	unsigned long work, leaf, add, dep;
};

/* libpkplugdep.so */
int plug_dep(int x);
unsigned long plug_dep_count(void);

static atomic_ulong n_work, n_leaf, n_add;

__attribute__((noinline)) unsigned long plug_leaf(unsigned long x)
{
	atomic_fetch_add_explicit(&n_leaf, 1, memory_order_relaxed);
	return x * 2654435761u + 1;
}

__attribute__((noinline)) unsigned long plug_work(unsigned long k)
{
	unsigned long acc = 0;

	atomic_fetch_add_explicit(&n_work, 1, memory_order_relaxed);
	for (unsigned long i = 0; i < k; i++)
		acc += plug_leaf(acc + i);
	return acc;
}

__attribute__((noinline)) int plug_add(int a, int b)
{
	atomic_fetch_add_explicit(&n_add, 1, memory_order_relaxed);
	return plug_dep(a) + b;
}

NOSITE void plug_counts(struct plug_counts *c)
{
	c->work = atomic_load(&n_work);
	c->leaf = atomic_load(&n_leaf);
	c->add = atomic_load(&n_add);
	c->dep = plug_dep_count();
}
