// SPDX-License-Identifier: MIT
/* The probekit command: subcommand dispatch and shared helpers. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <probekit/probekit.h>

#include "base/clock.h"
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

unsigned long long cli_parse_size(const char *opt, const char *val)
{
	static const char units[] = "KMG";
	unsigned long long v;
	const char *u;
	char *end;

	if (!val || !*val || *val == '-') {
		cli_usage_error("option %s needs a size (e.g. 512K, 4M, 1G)", opt);
		exit(2);
	}
	errno = 0;
	v = strtoull(val, &end, 10);
	u = *end ? strchr(units, *end & ~0x20) : NULL;
	if (errno || end == val ||
	    (*end && (!u || (end[1] && strcasecmp(end + 1, "B") && strcasecmp(end + 1, "iB"))))) {
		cli_usage_error("option %s: '%s' is not a size (e.g. 512K, 4M, 1G)", opt, val);
		exit(2);
	}
	for (int i = u ? (int)(u - units) + 1 : 0; i > 0; i--) {
		if (v > (~0ull >> 10)) {
			cli_usage_error("option %s: '%s' is too large", opt, val);
			exit(2);
		}
		v <<= 10;
	}
	return v;
}

/* Levenshtein distance of @a and @b, capped at 9 (long option names). */
static unsigned edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b), i, j;
	unsigned d[40], prev, tmp;

	if (la >= sizeof(d) / sizeof(d[0]) || lb >= sizeof(d) / sizeof(d[0]))
		return 9;
	for (j = 0; j <= lb; j++)
		d[j] = (unsigned)j;
	for (i = 1; i <= la; i++) {
		prev = d[0];
		d[0] = (unsigned)i;
		for (j = 1; j <= lb; j++) {
			unsigned sub = prev + (a[i - 1] != b[j - 1]);

			tmp = d[j];
			d[j] = sub < d[j] + 1 ? sub : d[j] + 1;
			d[j] = d[j] < d[j - 1] + 1 ? d[j] : d[j - 1] + 1;
			prev = tmp;
		}
	}
	return d[lb] < 9 ? d[lb] : 9;
}

int cli_bad_option(const char *cmd, const char *shortopts, const struct option *opts, char **argv)
{
	const char *arg = argv[optind - 1], *name = arg + strspn(arg, "-");
	size_t len = strcspn(name, "=");
	const struct option *best = NULL;
	unsigned bd = 3;

	for (const struct option *o = opts; o->name; o++) {
		unsigned d;

		if (!strncmp(o->name, name, len) && !o->name[len] &&
		    o->has_arg == required_argument)
			return cli_usage_error("%s: option --%s needs a value", cmd, o->name);
		d = edit_distance(name, o->name);
		if (d < bd)
			bd = d, best = o;
	}
	if (optopt && (arg[0] != '-' || arg[1] != '-')) {
		const char *s = strchr(shortopts, optopt);

		if (s && s[1] == ':')
			return cli_usage_error("%s: option -%c needs a value", cmd, optopt);
		return cli_usage_error("%s: unknown option -%c", cmd, optopt);
	}
	if (best)
		return cli_usage_error("%s: unknown option '%s' (did you mean --%s?)", cmd, arg,
				       best->name);
	return cli_usage_error("%s: unknown option '%s'", cmd, arg);
}

/*
 * The command @name is a typing slip of, or NULL: the unique nearest, with
 * fewer edits than half @name's letters ('tarce' is 'trace', 'nope' nothing).
 */
static const struct cli_cmd *closest_cmd(const struct cli_cmd *cmds, const char *name)
{
	const struct cli_cmd *best = NULL;
	unsigned bd = 3;
	bool tie = false;

	for (; cmds->name; cmds++) {
		unsigned d = edit_distance(name, cmds->name);

		if (d < bd)
			bd = d, best = cmds, tie = false;
		else if (d == bd)
			tie = true;
	}
	return tie || 2 * bd >= strlen(name) ? NULL : best;
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

	if (argc > 2 && !strcmp(argv[1], "help")) /* help CMD: CMD --help */
		return cli_dispatch(prog, cmds, usage, 3,
				    (char *[]){argv[0], argv[2], "--help", NULL});
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
	c = closest_cmd(cmds, argv[1]);
	if (c)
		return cli_usage_error("unknown %s '%s' (did you mean '%s'?)", prog, argv[1],
				       c->name);
	return cli_usage_error("unknown %s '%s'", prog, argv[1]);
}

static int cmd_version(int argc, char **argv)
{
	if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		fputs("usage: probekit version\n\nPrint the library's version.\n\n"
		      "Exit status: 0 on success; 2 for a usage error (an argument).\n",
		      stdout);
		return 0;
	}
	if (argc > 1)
		return cli_usage_error("version: unexpected argument '%s'", argv[1]);
	printf("probekit %s\n", pk_version());
	return 0;
}

static const struct cli_cmd commands[] = {
    {"bench", cmd_bench, "measure probekit against its peers (perf bench style)"},
    {"export", cmd_export,
     "convert a trace file: Chrome JSON, Perfetto, speedscope or folded stacks"},
    {"graph", cmd_graph, "the call graph under a function of a trace file, per path"},
    {"info", cmd_info, "what a trace file is: command, times, machine, events and losses"},
    {"inject", cmd_inject, "load a shared library into a running process (development)"},
    {"replay", cmd_replay, "the calls of a trace file as a tree, with durations"},
    {"report", cmd_report, "per-function calls and times of a trace file"},
    {"sites", cmd_sites, "the functions of a program or library that can be hooked, and how"},
    {"top", cmd_top, "a live view of the functions of a running process"},
    {"trace", cmd_trace, "run a program and record every call of its functions"},
    {"version", cmd_version, "print the library version"},
    {"watch", cmd_watch, "run a program with a watchpoint on a variable or function"},
    {NULL, NULL, NULL},
};

/*
 * A command whose output could not all be written (a full disk, a closed
 * or broken standard output) failed, whatever it printed before: say so and
 * exit non-zero rather than 0 with a truncated result.
 */
static int stdout_check(int status)
{
	int err = fflush(stdout) ? errno : 0;

	if (!err && !ferror(stdout))
		return status;
	cli_error("standard output: %s", strerror(err ? err : EIO));
	return status ? status : 1;
}

uint64_t cli_start_ns;

/* The command's start, before main: what "attached in" counts from. */
__attribute__((constructor)) static void start_note(void)
{
	cli_start_ns = pki_mono_ns();
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "--version"))
		return stdout_check(cmd_version(0, NULL));
	return stdout_check(
	    cli_dispatch("command", commands,
			 "usage: probekit <command> [options]\n"
			 "       probekit <command> --help\n\n"
			 "Instrument live Linux x86-64 processes: hardware watchpoints on every\n"
			 "thread and function-entry hooks, at a cost that does not grow with the\n"
			 "number of hooks, threads or CPUs.\n\ncommands:\n",
			 argc, argv));
}
