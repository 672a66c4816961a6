// SPDX-License-Identifier: MIT
/*
 * The two cli/probekit.c helpers that cli/report.c needs, for the trace
 * fuzz target, which links report.c to run `probekit report` and `probekit
 * export` on each input that parses (cli/probekit.c itself holds main()).
 */
#include <stdarg.h>
#include <stdio.h>

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
