// SPDX-License-Identifier: MIT
/* The probekit command: subcommand dispatch and shared helpers. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <probekit/probekit.h>

#include "cli.h"

int cli_error(const char *fmt, ...)
{
	va_list ap;

	fputs("probekit: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

int cli_usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("probekit: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\n(see --help)\n", stderr);
	return 2;
}

unsigned long cli_parse_ulong(const char *opt, const char *val)
{
	char *end;
	unsigned long v;

	if (!val || !*val || *val == '-') {
		cli_usage_error("option %s needs a non-negative number", opt);
		exit(2);
	}
	errno = 0;
	v = strtoul(val, &end, 0);
	if (errno || *end) {
		cli_usage_error("option %s: '%s' is not a number", opt, val);
		exit(2);
	}
	return v;
}

static void print_cmds(FILE *f, const struct cli_cmd *cmds)
{
	for (; cmds->name; cmds++)
		fprintf(f, "  %-12s %s\n", cmds->name, cmds->summary);
}

int cli_dispatch(const char *prog, const struct cli_cmd *cmds, const char *usage, int argc,
		 char **argv)
{
	const struct cli_cmd *c;

	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
	    !strcmp(argv[1], "help")) {
		FILE *f = argc < 2 ? stderr : stdout;

		fputs(usage, f);
		print_cmds(f, cmds);
		return argc < 2 ? 2 : 0;
	}
	for (c = cmds; c->name; c++)
		if (!strcmp(c->name, argv[1]))
			return c->run(argc - 1, argv + 1);
	return cli_usage_error("unknown %s '%s'", prog, argv[1]);
}

static int cmd_version(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	printf("probekit %s\n", pk_version());
	return 0;
}

static const struct cli_cmd commands[] = {
    {"bench", cmd_bench, "measure probekit against its peers (perf bench style)"},
    {"export", cmd_export, "convert a trace file: Chrome trace JSON or folded stacks"},
    {"graph", cmd_graph, "the call graph under a function of a trace file, per path"},
    {"replay", cmd_replay, "the calls of a trace file as a tree, with durations"},
    {"report", cmd_report, "per-function calls and times of a trace file"},
    {"sites", cmd_sites, "list the patchable functions of a program or library"},
    {"trace", cmd_trace, "run a program and record every call of its functions"},
    {"version", cmd_version, "print the library version"},
    {"watch", cmd_watch, "run a program with a watchpoint on a variable or function"},
    {NULL, NULL, NULL},
};

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "--version"))
		return cmd_version(0, NULL);
	return cli_dispatch(
	    "command", commands,
	    "usage: probekit <command> [options]\n"
	    "       probekit <command> --help\n\n"
	    "Instrument live Linux x86-64 processes: hardware watchpoints on every\n"
	    "thread and function-entry hooks, at a cost that does not grow with the\n"
	    "number of hooks, threads or CPUs.\n\ncommands:\n",
	    argc, argv);
}
