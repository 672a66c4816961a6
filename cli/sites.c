// SPDX-License-Identifier: MIT
/*
 * probekit sites FILE: list the patchable functions of a program or library
 * on disk (address, kind, name), the way the hook layer will see them once
 * the file is loaded.
 */
#include <errno.h>
#include <fnmatch.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <probekit/sites.h>

#include "cli.h"

static const char usage[] =
    "usage: probekit sites [options] FILE\n\n"
    "List the patchable function entries of an ELF program or shared library:\n"
    "address (link-time; offset from the load base for PIE and libraries), kind\n"
    "(nop5, nop1x5, mcount) and function name.\n\n"
    "Build code with -fpatchable-function-entry=5 (gcc or clang), or non-PIC code\n"
    "with -pg -mfentry -mnop-mcount -mrecord-mcount, to give it sites.\n\n"
    "options:\n"
    "  -g, --glob PATTERN   only functions whose name matches (fnmatch)\n"
    "  -s, --stats          also print what was found and rejected\n"
    "  -h, --help           this text\n";

struct print_ctx {
	const char *glob;
	unsigned long shown;
};

static int print_site(const struct pk_site *s, void *data)
{
	struct print_ctx *pc = data;

	if (pc->glob && fnmatch(pc->glob, s->name, 0))
		return 0;
	printf("%016lx %-6s %s\n", s->ip, pk_site_kind_name(s->kind), s->name);
	pc->shown++;
	return 0;
}

int cmd_sites(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"glob", required_argument, NULL, 'g'},
	    {"stats", no_argument, NULL, 's'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	PK_OPTS(pk_sites_stats, st);
	struct print_ctx pc = {0};
	bool show_stats = false;
	const char *path;
	int c, ret;

	optind = 1;
	while ((c = getopt_long(argc, argv, "g:sh", opts, NULL)) != -1) {
		switch (c) {
		case 'g':
			pc.glob = optarg;
			break;
		case 's':
			show_stats = true;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			return cli_usage_error("sites: bad option");
		}
	}
	if (optind != argc - 1)
		return cli_usage_error("sites: expected one FILE");
	path = argv[optind];

	ret = pk_sites_file_foreach(path, print_site, &pc, &st);
	switch (ret) {
	case -ENOEXEC:
		return cli_error("%s: not an x86-64 ELF program or shared library (or malformed)",
				 path);
	case -EOPNOTSUPP:
		return cli_error("%s: relocatable object: link it into a program or library first",
				 path);
	default:
		if (ret < 0)
			return cli_error("%s: %s", path, strerror(-ret));
	}
	if (show_stats)
		printf("# %s: %s, %zu record(s), %zu site(s), %zu not at a function entry, "
		       "%zu not a known nop, %zu duplicate(s)\n",
		       path, st.pic ? "position-independent" : "fixed-address", st.records,
		       st.sites, st.not_entry, st.bad_insn, st.duplicates);
	if (!st.sites) {
		if (st.records)
			return cli_error(
			    "%s: %zu patchable record(s) but no usable site "
			    "(built with -fpatchable-function-entry=N,M other than 5,0?)",
			    path, st.records);
		return cli_error("%s: no patchable sites; rebuild with "
				 "-fpatchable-function-entry=5 (or, non-PIC, -pg -mfentry "
				 "-mnop-mcount -mrecord-mcount)",
				 path);
	}
	if (pc.glob && !pc.shown)
		return cli_error("%s: no site matches '%s'", path, pc.glob);
	return 0;
}
