// SPDX-License-Identifier: MIT
/*
 * probekit watch: run PROG with an all-threads hardware watchpoint on one of
 * its symbols (or an address) from before main(), and report every hit.  The
 * command checks what it can before running PROG (options, PROG itself); the
 * agent resolves the symbol inside PROG, where its libraries are loaded, and
 * tells the command when it refuses (agent_run.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent_run.h"
#include "cli.h"

static const char usage[] =
    "usage: probekit watch [options] SYMBOL[+OFF]|ADDR [options] -- PROG [ARGS...]\n\n"
    "Run PROG with a hardware watchpoint on every thread, set before main(), and\n"
    "print each hit: seconds since start, thread id, the instruction, and the\n"
    "value (old -> new for writes).  SYMBOL is a data or function symbol of PROG\n"
    "or of a library it loads; ADDR is a hex link-time address of PROG (for a\n"
    "PIE, an offset from its load base, as nm prints it).\n\n"
    "x86 reports a data access after it happened: the instruction shown is found\n"
    "by decoding the function from its start (\"at f+0x..\"), or is the next one\n"
    "(\"after f+0x..\") when that fails.  The value is read when the hit is\n"
    "handled: a concurrent writer may already have changed it.\n\n"
    "options:\n"
    "  -t, --type w|rw|x   writes (default), reads and writes, or execution\n"
    "  -l, --len N         bytes to watch: 1, 2, 4 or 8 (default: the symbol's size)\n"
    "  -s, --stack         a backtrace with each hit (frame pointers: build PROG\n"
    "                      with -fno-omit-frame-pointer for full stacks)\n"
    "  -c, --count N       stop after N hits; PROG goes on unwatched\n"
    "  -o, --output FILE   write the report to FILE (default: stderr)\n"
    "  -h, --help          this text\n\n"
    "Exit status: PROG's (death by a signal is reproduced); 125 probekit failed,\n"
    "126 PROG cannot be run under probekit (setuid, static), 127 PROG not found.\n";

#define WATCH_FAIL 125

int cmd_watch(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"type", required_argument, NULL, 't'},
	    {"len", required_argument, NULL, 'l'},
	    {"stack", no_argument, NULL, 's'},
	    {"count", required_argument, NULL, 'c'},
	    {"output", required_argument, NULL, 'o'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	const char *type = "w", *len = NULL, *count = NULL, *output = NULL, *spec = NULL;
	const char *env[16];
	char path[PATH_MAX], agent[PATH_MAX], *end;
	struct agent_run r = {.out_fd = -1, .relay_fd = 2, .report_end = true};
	bool stack = false;
	int c, ret, ne = 0;

	optind = 1;
	opterr = 0;
	/*
	 * Options come anywhere before PROG: before SYMBOL or after it.  PROG
	 * starts after "--", or else at the first word after SYMBOL that is not
	 * an option ('+': never permute, so PROG's own options are never ours).
	 */
	for (;;) {
		int before = optind;

		c = getopt_long(argc, argv, "+t:l:sc:o:h", opts, NULL);
		if (c == -1) {
			if (optind == before + 1 && !strcmp(argv[before], "--"))
				break; /* getopt ate the "--": PROG follows */
			if (optind >= argc || spec)
				break;
			spec = argv[optind++];
			continue;
		}
		switch (c) {
		case 't':
			type = optarg;
			if (strcmp(type, "w") && strcmp(type, "rw") && strcmp(type, "x"))
				return cli_usage_error("watch: unknown type '%s' (w, rw or x)",
						       type),
				       WATCH_FAIL;
			break;
		case 'l':
			len = optarg;
			errno = 0;
			c = (int)strtol(len, &end, 0);
			if (errno || *end || (c != 1 && c != 2 && c != 4 && c != 8))
				return cli_usage_error(
					   "watch: unsupported length '%s': x86 watches "
					   "1, 2, 4 or 8 bytes",
					   len),
				       WATCH_FAIL;
			break;
		case 's':
			stack = true;
			break;
		case 'c':
			count = optarg;
			errno = 0;
			if (strtoul(count, &end, 0) == 0 || errno || *end || *count == '-')
				return cli_usage_error(
					   "watch: --count needs a positive number, not "
					   "'%s'",
					   count),
				       WATCH_FAIL;
			break;
		case 'o':
			output = optarg;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			return cli_usage_error("watch: unknown option '%s'", argv[optind - 1]),
			       WATCH_FAIL;
		}
	}
	if (!spec)
		return cli_usage_error("watch: expected SYMBOL or ADDR, then -- PROG"), WATCH_FAIL;
	if (!*spec)
		return cli_usage_error("watch: empty SYMBOL: give a symbol of PROG or an address"),
		       WATCH_FAIL;
	if (optind >= argc)
		return cli_usage_error("watch: expected PROG after %s --", spec), WATCH_FAIL;
	if (!strcmp(type, "x") && len && strcmp(len, "1"))
		return cli_usage_error("watch: -t x watches one instruction: no -l"), WATCH_FAIL;

	ret = agent_prepare(argv[optind], path, sizeof(path), agent, sizeof(agent));
	if (ret)
		return ret;
	if (output) {
		r.out_fd = open(output, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (r.out_fd < 0)
			return cli_error("%s: %s", output, strerror(errno)), WATCH_FAIL;
		r.relay_fd = r.out_fd;
	}
	env[ne++] = PK_ENV_WATCH;
	env[ne++] = spec;
	env[ne++] = PK_ENV_WATCH_TYPE;
	env[ne++] = type;
	if (len) {
		env[ne++] = PK_ENV_WATCH_LEN;
		env[ne++] = len;
	}
	if (count) {
		env[ne++] = PK_ENV_WATCH_COUNT;
		env[ne++] = count;
	}
	if (stack) {
		env[ne++] = PK_ENV_WATCH_STACK;
		env[ne++] = "1";
	}
	env[ne] = NULL;
	r.path = path;
	r.argv = argv + optind;
	r.agent = agent;
	r.env = env;
	return agent_run(&r);
}
