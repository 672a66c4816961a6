// SPDX-License-Identifier: MIT
/*
 * probekit graph FUNC [FILE]: the call graph under FUNC in a trace, as
 * uftrace's graph prints it: each path of calls from FUNC down, once, with
 * how many calls took it and their total time.  Built from the analyzer's
 * calls (analyze.h), each of which carries its stack: a call under FUNC
 * (its outermost frame of FUNC, so recursion is not counted twice) adds to
 * the node of its path from there.  Memory: one node per distinct path.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "cli.h"
#include "trace/analyze.h"
#include "trace/idxmap.h"
#include "trace/reader.h"

static const char usage[] =
    "usage: probekit graph FUNC [FILE] [options]\n\n"
    "The call graph under the function FUNC in the trace FILE (default\n"
    "probekit.trace), every thread together: each path of calls from FUNC\n"
    "down, with the number of calls that took it and their total time (uftrace's\n"
    "graph).  Calls recorded without their exit count, with no time.\n\n"
    "options:\n"
    "  -D, --depth N  only the paths at most N calls below FUNC\n"
    "  -h, --help     this text\n";

struct gnode {
	uint64_t fn;
	uint64_t calls, ns, timed;
	size_t child, sibling, last; /* first child, next sibling, last child: 1-based, 0: none */
};

struct graph {
	const struct pki_trace_file *f;
	uint64_t root_fn;
	unsigned long depth;
	struct gnode *n; /* n[0]: FUNC */
	size_t nn, cap;
	struct pki_idxmap kids; /* (parent index + 1, fn) -> child index + 1 */
};

/* The child of node @parent for @fn, made on first use; its index, or -1. */
static long child_of(struct graph *g, size_t parent, uint64_t fn)
{
	uint64_t *slot = pki_idxmap_slot(&g->kids, parent + 1, fn);
	struct gnode *p;

	if (!slot)
		return -1;
	if (*slot)
		return (long)*slot - 1;
	if (PKI_GROW(g->n, g->cap, g->nn + 1))
		return -1;
	g->n[g->nn] = (struct gnode){.fn = fn};
	p = &g->n[parent];
	if (p->last)
		g->n[p->last - 1].sibling = g->nn + 1;
	else
		p->child = g->nn + 1;
	p->last = g->nn + 1;
	*slot = ++g->nn;
	g->kids.n++;
	return (long)g->nn - 1;
}

static int on_call(const struct pki_trace_thread *t, const struct pki_trace_call *c, void *arg)
{
	struct graph *g = arg;
	size_t node = 0, k;

	(void)t;
	for (k = 0; k <= c->depth && c->stack[k] != g->root_fn; k++)
		;
	if (k > c->depth || (g->depth && c->depth - k > g->depth))
		return 0; /* not under FUNC, or too deep */
	for (size_t j = k + 1; j <= c->depth; j++) {
		long i = child_of(g, node, c->stack[j]);

		if (i < 0)
			return -ENOMEM;
		node = (size_t)i;
	}
	g->n[node].calls++;
	if (!c->instant) {
		g->n[node].ns += c->dur_ns;
		g->n[node].timed++;
	}
	return 0;
}

/* Node @i and, below it, its children, depth first. */
static void print_node(const struct graph *g, size_t i, unsigned level)
{
	const struct gnode *n = &g->n[i];
	char dur[32], nb[64];

	if (n->timed)
		cli_fmt_ns(dur, sizeof(dur), n->ns, false);
	else
		snprintf(dur, sizeof(dur), "-");
	printf("%12s : %*s%s(%llu) %s\n", dur, 2 * (int)level, "", level ? "+-" : "",
	       (unsigned long long)n->calls, pki_trace_fn_name(g->f, n->fn, nb, sizeof(nb)));
	for (size_t c = n->child; c; c = g->n[c - 1].sibling)
		print_node(g, c - 1, level + 1);
}

/* The fn named @name in @f's symbols, or 0. */
static uint64_t fn_named(const struct pki_trace_file *f, const char *name)
{
	for (size_t i = 0; i < f->nsyms; i++)
		if (!strcmp(f->syms[i].name, name))
			return f->syms[i].fn;
	return 0;
}

int cmd_graph(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"depth", required_argument, NULL, 'D'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct graph g = {0};
	const char *func, *path = "probekit.trace";
	struct pki_trace_file *f;
	int c, err;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "D:h", opts, NULL)) != -1) {
		if (c == 'D') {
			g.depth = cli_parse_ulong("-D", optarg);
		} else if (c == 'h') {
			fputs(usage, stdout);
			return 0;
		} else {
			return cli_bad_option("graph", "D:h", opts, argv);
		}
	}
	if (optind >= argc)
		return cli_usage_error("graph: expected FUNC");
	func = argv[optind++];
	if (optind < argc)
		path = argv[optind++];
	if (optind < argc)
		return cli_usage_error("graph: unexpected argument '%s'", argv[optind]);
	f = cli_trace_open(path);
	if (!f)
		return 1;
	g.f = f;
	g.root_fn = fn_named(f, func);
	if (!g.root_fn) {
		pki_trace_file_free(f);
		return cli_error("graph: %s: no function '%s' in the trace", path, func);
	}
	err = PKI_GROW(g.n, g.cap, 1);
	if (!err) {
		g.n[g.nn++] = (struct gnode){.fn = g.root_fn};
		err = pki_trace_replay_all(f, on_call, &g, NULL);
	}
	if (!err) {
		printf("# call graph under %s (%s): total time : (calls) function\n", func, path);
		print_node(&g, 0, 0);
	}
	free(g.n);
	pki_idxmap_free(&g.kids);
	pki_trace_file_free(f);
	if (err)
		return cli_error("graph: %s: %s", path, strerror(err < 0 ? -err : err));
	return 0;
}
