// SPDX-License-Identifier: MIT
/*
 * probekit sites FILE: list the patchable functions of a program or library
 * on disk (address, kind, name), the way the hook layer will see them once
 * the file is loaded.  With --functions: every function of the file and how
 * it could be hooked (patchable entry, prologue relocation, or refused and
 * why; sym/func_sites), what the relocation hooks reach.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <probekit/sites.h>

#include "cli.h"
#include "sym/demangle.h"
#include "sym/func_sites.h"

static const char usage[] =
    "usage: probekit sites [options] FILE\n\n"
    "List the patchable function entries of an ELF program or shared library:\n"
    "address (link-time; offset from the load base for PIE and libraries), kind\n"
    "(nop5, nop1x5, mcount) and function name.  Code built with\n"
    "-fpatchable-function-entry=5 (gcc or clang), or non-PIC code with -pg\n"
    "-mfentry -mnop-mcount -mrecord-mcount, has them.  A file without them (any\n"
    "distribution binary) gets a summary of what can be hooked all the same.\n\n"
    "With -f, list every function of the file instead (from its symbols and, if\n"
    "stripped, its .eh_frame): address, size, how it could be hooked and name\n"
    "(sub_<hex> without a symbol).  How: 'patchable KIND' (a site, as above),\n"
    "'reloc N' (its first N bytes can be moved out of line: prologue relocation)\n"
    "or 'refused REASON'; with --int3, 'int3 REASON' for a refused one whose first\n"
    "instruction alone can be moved (hooked through a breakpoint: a signal per\n"
    "call), 'int3-relay REASON' for one of them 5 bytes long or more (hooked by\n"
    "changing its first byte into a jmp: no signal; the breakpoint if the place\n"
    "the jmp reaches is taken at run time).  IFUNC resolvers and cold parts are\n"
    "skipped (counted by -s).\n"
    "'probekit trace --relocate' and the library's relocated sites\n"
    "(PROBEKIT_RELOC) hook the 'reloc' ones, and with --int3 (PROBEKIT_INT3=1)\n"
    "the 'int3' ones.\n\n"
    "options:\n"
    "  -f, --functions      every function, with how it could be hooked\n"
    "  -g, --glob PATTERN   only functions whose name matches (fnmatch; C++ and\n"
    "                       Rust names also in their demangled forms)\n"
    "      --int3           with -f: what the INT3 fallback would take\n"
    "  -s, --stats          also print what was found and rejected (with -f: counts\n"
    "                       by outcome and by refusal reason)\n" CLI_DEMANGLE_HELP
    "  -h, --help           this text\n\n"
    "Exit status: 0 on success; 1 if FILE cannot be read or is not an x86-64\n"
    "program or shared library, or nothing is found to list (no function, or none\n"
    "that -g matches); 2 for a usage error.\n";

struct print_ctx {
	const char *glob;
	unsigned long shown;
};

static int print_site(const struct pk_site *s, void *data)
{
	struct print_ctx *pc = data;

	char *shown;

	if (pc->glob && !pki_glob_match(pc->glob, s->name))
		return 0;
	shown = cli_demangled(s->name);
	printf("%016lx %-6s %s\n", s->ip, pk_site_kind_name(s->kind), shown ? shown : s->name);
	free(shown);
	pc->shown++;
	return 0;
}

static int print_func(const struct pki_func_site *fs, void *data)
{
	struct print_ctx *pc = data;
	char how[48], *shown;

	if (pc->glob && !pki_glob_match(pc->glob, fs->name))
		return PKI_FUNC_UNCOUNTED;
	switch (fs->how) {
	case PKI_FUNC_PATCHABLE:
		snprintf(how, sizeof(how), "patchable %s", pk_site_kind_name(fs->kind));
		break;
	case PKI_FUNC_RELOC:
		snprintf(how, sizeof(how), "reloc %u", fs->moved);
		break;
	case PKI_FUNC_REFUSED:
		snprintf(how, sizeof(how), "refused %s", pki_func_why_name(fs->why));
		break;
	case PKI_FUNC_INT3:
		snprintf(how, sizeof(how), "%s %s", fs->relay ? "int3-relay" : "int3",
			 pki_func_why_name(fs->why));
		break;
	default:
		return 0; /* skipped: counted, not listed */
	}
	shown = cli_demangled(fs->name);
	printf("%016llx %7llu %-22s %s\n", (unsigned long long)fs->fn->addr,
	       (unsigned long long)fs->fn->size, how, shown ? shown : fs->name);
	free(shown);
	pc->shown++;
	return 0;
}

static void print_func_stats(const char *path, const struct pki_func_stats *st)
{
	unsigned w;

	char relay[48] = "";

	if (st->int3)
		snprintf(relay, sizeof(relay), " (%zu int3-relay)", st->int3_relay);
	printf("# %s: %zu function(s): %zu patchable, %zu reloc, %zu int3%s, %zu refused; "
	       "skipped %zu ifunc resolver(s), %zu cold part(s)\n",
	       path, st->funcs, st->patchable, st->reloc, st->int3, relay, st->refused, st->ifunc,
	       st->cold);
	if (st->funcs)
		printf("# %.1f%% hookable (%.1f%% by relocation, %.1f%% by INT3); %zu patchable "
		       "site(s) in the file, %zu in no function listed\n",
		       100.0 * (st->patchable + st->reloc + st->int3) / st->funcs,
		       100.0 * st->reloc / st->funcs, 100.0 * st->int3 / st->funcs, st->sites,
		       st->sites_orphan);
	for (w = 1; w < PKI_FUNC_WHY_NR; w++)
		if (st->why[w])
			printf("# refused %s: %zu\n", pki_func_why_name(w), st->why[w]);
	if (st->debug_file[0])
		printf("# names from the separate debug file %s\n", st->debug_file);
}

static int file_error(const char *path, int ret)
{
	switch (ret) {
	case -ENOEXEC:
		return cli_error("%s: not an x86-64 ELF program or shared library (or malformed)",
				 path);
	case -EOPNOTSUPP:
		return cli_error("%s: relocatable object: link it into a program or library first",
				 path);
	default:
		return cli_error("%s: %s", path, strerror(-ret));
	}
}

/*
 * Only a regular file is read: a FIFO would block the read until a writer
 * comes (forever), a device would never end.  Opened without blocking to
 * find out.  0, or the exit status after saying why.
 */
static int regular_file(const char *path)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC), err;

	if (fd < 0)
		return file_error(path, -errno);
	err = fstat(fd, &st) ? errno : 0;
	close(fd);
	if (err)
		return file_error(path, -err);
	if (!S_ISREG(st.st_mode))
		return cli_error("%s: not a regular file (%s)", path,
				 S_ISDIR(st.st_mode)	? "a directory"
				 : S_ISFIFO(st.st_mode) ? "a pipe or FIFO"
							: "a device or socket");
	return 0;
}

static int list_functions(const char *path, const char *glob, bool show_stats, bool int3)
{
	struct print_ctx pc = {.glob = glob};
	struct pki_func_stats st;
	int ret;

	ret = pki_func_sites_file(path, int3 ? PKI_FUNC_SITES_INT3 : 0, print_func, &pc, &st);
	if (ret < 0)
		return file_error(path, ret);
	if (show_stats)
		print_func_stats(path, &st);
	if (glob && !pc.shown)
		return cli_error("%s: no function matches '%s'", path, glob);
	if (!pc.shown)
		return cli_error("%s: no function found (no symbols, no .eh_frame)", path);
	return 0;
}

static int count_func(const struct pki_func_site *fs, void *data)
{
	(void)fs;
	(void)data;
	return 0;
}

/*
 * A file without patchable entries (any distribution binary): what can be
 * hooked anyway, and how to see it, instead of a rebuild it does not need.
 */
static int coverage(const char *path)
{
	struct pki_func_stats st;
	size_t hookable;
	int ret = pki_func_sites_file(path, 0, count_func, NULL, &st);

	if (ret < 0)
		return file_error(path, ret);
	if (!st.funcs)
		return cli_error("%s: no patchable entries and no function found (no symbols, "
				 "no .eh_frame)",
				 path);
	hookable = st.patchable + st.reloc;
	printf("# %s: no patchable entries (built without -fpatchable-function-entry=5)\n"
	       "# %zu of its %zu function(s) can be hooked all the same, by prologue "
	       "relocation (%.1f%%); %zu refused\n",
	       path, hookable, st.funcs, 100.0 * hookable / st.funcs, st.refused);
	for (unsigned w = 1; w < PKI_FUNC_WHY_NR; w++)
		if (st.why[w])
			printf("#   refused %s: %zu\n", pki_func_why_name(w), st.why[w]);
	printf("# 'probekit sites -f %s' lists them with how each is hooked (--int3: the "
	       "refused ones a breakpoint would take);\n"
	       "# 'probekit trace -- PROG' traces them as they are\n",
	       path);
	return 0;
}

int cmd_sites(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"functions", no_argument, NULL, 'f'},
	    {"glob", required_argument, NULL, 'g'},
	    {"stats", no_argument, NULL, 's'},
	    {"int3", no_argument, NULL, 'I'},
	    {"help", no_argument, NULL, 'h'},
	    CLI_DEMANGLE_OPTIONS,
	    {NULL, 0, NULL, 0},
	};
	PK_OPTS(pk_sites_stats, st);
	struct print_ctx pc = {0};
	bool show_stats = false, funcs = false, int3 = false;
	const char *path;
	int c, ret;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "fg:sh", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
			funcs = true;
			break;
		case 'g':
			pc.glob = optarg;
			break;
		case 's':
			show_stats = true;
			break;
		case 'I':
			int3 = true;
			break;
		case CLI_O_DEMANGLE:
		case CLI_O_NO_DEMANGLE:
			if (!cli_demangle_opt(c, optarg))
				return 2;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			return cli_bad_option("sites", "fg:sh", opts, argv);
		}
	}
	if (optind != argc - 1)
		return cli_usage_error("sites: expected one FILE");
	path = argv[optind];
	if (int3 && !funcs)
		return cli_usage_error("sites: --int3 needs --functions");
	ret = regular_file(path);
	if (ret)
		return ret;
	if (funcs)
		return list_functions(path, pc.glob, show_stats, int3);

	ret = pk_sites_file_foreach(path, print_site, &pc, &st);
	if (ret < 0)
		return file_error(path, ret);
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
		return coverage(path);
	}
	if (pc.glob && !pc.shown)
		return cli_error("%s: no site matches '%s'", path, pc.glob);
	return 0;
}
