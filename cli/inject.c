// SPDX-License-Identifier: MIT
/*
 * probekit inject -p PID LIBRARY: load a shared library into a running
 * process (src/attach/attach.h, doc/design/attach.md).  A development
 * command: the front door that `trace -p` and the others will use, and
 * what the attach tests drive.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attach/attach.h"
#include "cli.h"

static const char usage[] =
    "usage: probekit inject [options] -p PID LIBRARY\n\n"
    "Load the shared library LIBRARY into the running process PID, without\n"
    "restarting or stopping it (a development command; `trace -p` will build on\n"
    "it).  One thread is held, at a point where it holds no libc lock, for a\n"
    "fraction of a millisecond: it creates a thread that dlopens LIBRARY, passed\n"
    "as a descriptor.  Prints the total time and the time the thread was stopped.\n"
    "Refuses, naming the cause and the fix, what it cannot do safely.\n\n"
    "options:\n"
    "  -p, --pid PID   the process\n"
    "  -n, --check     only check that PID could be attached to, touching nothing\n"
    "  -t, --thread TID  use only thread TID of PID (20 tries; for tests)\n"
    "  -h, --help      this text\n\n"
    "Exit status: 0 once LIBRARY is loaded (with -n: once PID is found\n"
    "attachable); 1 if it was refused or failed (the cause named); 2 for a usage\n"
    "error.\n";

int cmd_inject(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"pid", required_argument, NULL, 'p'},
	    {"check", no_argument, NULL, 'n'},
	    {"thread", required_argument, NULL, 't'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct pki_attach_opts ao = {0};
	struct pki_attach_report rep;
	char why[1024], *end;
	bool check = false;
	long pid = 0;
	int c, fd, rc;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "p:nt:h", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			pid = strtol(optarg, &end, 10);
			if (*end || pid <= 0)
				return cli_usage_error("inject: bad PID '%s'", optarg);
			break;
		case 'n':
			check = true;
			break;
		case 't':
			ao.tid = (pid_t)strtol(optarg, &end, 10);
			if (*end || ao.tid <= 0)
				return cli_usage_error("inject: bad TID '%s'", optarg);
			ao.rounds = 20;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			return cli_bad_option("inject", "p:nt:h", opts, argv);
		}
	}
	if (!pid)
		return cli_usage_error("inject: -p PID is required");
	if (check) {
		if (optind != argc)
			return cli_usage_error("inject: --check takes no LIBRARY");
		rc = pki_attach_preflight((pid_t)pid, why, sizeof(why));
		if (rc)
			return cli_error("inject: %s", why);
		printf("process %ld can be attached to\n", pid);
		return 0;
	}
	if (optind != argc - 1)
		return cli_usage_error("inject: expected one LIBRARY");
	fd = open(argv[optind], O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cli_error("inject: %s: %s", argv[optind], strerror(errno));
	rc = pki_attach_inject((pid_t)pid, fd, &ao, &rep, why, sizeof(why));
	close(fd);
	if (rc)
		return cli_error("inject: %s", why);
	printf("loaded %s into process %ld: %.3f ms in all; thread %d stopped %.0f us "
	       "(%.0f us of remote work), %d thread(s) tried in %d round(s)\n",
	       argv[optind], pid, (double)rep.total_ns / 1e6, rep.tid, (double)rep.stopped_ns / 1e3,
	       (double)rep.call_ns / 1e3, rep.tries, rep.rounds);
	return 0;
}
