// SPDX-License-Identifier: MIT
/*
 * The cli/probekit.c helpers that cli/report.c, replay.c and graph.c need,
 * for the trace fuzz target, which links them to run `probekit report`,
 * `export`, `replay` and `graph` on each input that parses (cli/probekit.c
 * itself holds main()).
 */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"

int cli_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	return 1;
}

int cli_usage_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	return 2;
}

/* cli/probekit.c's, for replay and graph; the fuzzer only passes valid numbers. */
unsigned long cli_parse_ulong(const char *opt, const char *val)
{
	(void)opt;
	return strtoul(val, NULL, 0);
}

int cli_bad_option(const char *cmd, const char *shortopts, const struct option *opts, char **argv)
{
	(void)cmd, (void)shortopts, (void)opts, (void)argv;
	return 2;
}
