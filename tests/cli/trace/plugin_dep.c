// SPDX-License-Identifier: MIT
/*
 * A dependency of libpkplugin.so (DT_NEEDED): loaded and unloaded with it,
 * so `probekit trace` hooks it at the plugin's dlopen and must let it go at
 * the plugin's dlclose (tests/cli/trace/test-trace-dlopen.sh).
 */
#include <stdatomic.h>

static atomic_ulong n_dep;

__attribute__((noinline)) int plug_dep(int x)
{
	atomic_fetch_add_explicit(&n_dep, 1, memory_order_relaxed);
	return x ^ 1;
}

__attribute__((patchable_function_entry(0, 0), noinline)) unsigned long plug_dep_count(void)
{
	return atomic_load(&n_dep);
}
