// SPDX-License-Identifier: MIT
/* probekit bench: benchmarks that print perf-bench style figures. */
#include <stddef.h>

#include "cli.h"

static const struct cli_cmd benches[] = {
	{"slots", bench_slots, "slot model: reserve+release of an all-CPU task breakpoint"},
	{"breakpoint", bench_breakpoint, "perf bench breakpoint with all-threads watchpoints"},
	{"record", bench_record, "trace recorder hot path: ns per recorded event"},
	{"trace", bench_trace, "probekit trace vs uftrace record: ns added per call"},
	{NULL, NULL, NULL},
};

int cmd_bench(int argc, char **argv)
{
	return cli_dispatch("benchmark", benches,
			    "usage: probekit bench <benchmark> [options]\n\n"
			    "Each benchmark prints its figures the way 'perf bench' does; where a peer\n"
			    "exists it is measured in the same run.\n\nbenchmarks:\n",
			    argc, argv);
}
