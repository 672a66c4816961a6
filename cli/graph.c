// SPDX-License-Identifier: MIT
/*
 * probekit graph FUNC [FILE]: the call graph under FUNC in a trace, as
 * uftrace's graph prints it: each path of calls from FUNC down, once, with
 * how many calls took it and their total time.  Built from the analyzer's
 * calls (analyze.h), each of which carries its stack: a call under FUNC
 * (its outermost frame of FUNC, so recursion is not counted twice) adds to
 * the node of its path from there.  Each thread keeps the nodes of its
 * current stack by frame serial (a serial is never reused, so a cached frame
 * means the frames below it are cached too): a call costs the frames pushed
 * since the last call ended, not its depth, and the printer walks the tree
 * without recursion.  Memory: one node per distinct path, and the stack.
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
    "graph).  Calls recorded without their exit count, with no time.  A path\n"
    "with a call whose end is not known (still running when its thread's\n"
    "events stop, with no time for that end, or cut where a flight recorder\n"
    "overwrote events) shows '-'.\n\n"
    "options:\n"
    "  -D, --depth N  only the paths at most N calls below FUNC\n" CLI_DEMANGLE_HELP
    "  -h, --help     this text\n\n"
    "Exit status: 0 on success; 1 if FILE cannot be read or is not a trace file,\n"
    "FUNC is not in it, or the output cannot be written; 2 for a usage error.\n";

struct gnode {
	uint64_t fn;
	uint64_t calls, ns, timed;
	uint64_t no_end;	     /* calls open with no known end: the total is not known */
	size_t child, sibling, last; /* first child, next sibling, last child: 1-based, 0: none */
	size_t parent;		     /* index (n[0]'s: 0) */
	size_t level;		     /* calls below FUNC */
};

/* A frame's place in the graph: a node index, or one of these. */
enum { NOT_UNDER = -1, TOO_DEEP = -2 };

struct gframe {
	uint64_t id; /* frame serial (analyze.h's ids); 0: none cached */
	long node;
};

struct gthread {
	struct gframe *v; /* by depth */
	size_t cap;
};

struct graph {
	const struct pki_trace_file *f;
	uint64_t root_fn;
	unsigned long depth;
	struct gnode *n; /* n[0]: FUNC */
	size_t nn, cap;
	struct pki_idxmap kids; /* (parent index + 1, fn) -> child index + 1 */
	struct gthread *th;	/* by thread index */
};

/* The child of node @parent for @fn, made on first use; its index, or -ENOMEM. */
static long child_of(struct graph *g, size_t parent, uint64_t fn)
{
	uint64_t *slot = pki_idxmap_slot(&g->kids, parent + 1, fn);
	struct gnode *p;

	if (!slot)
		return -ENOMEM;
	if (*slot)
		return (long)*slot - 1;
	if (PKI_GROW(g->n, g->cap, g->nn + 1))
		return -ENOMEM;
	g->n[g->nn] = (struct gnode){.fn = fn, .parent = parent, .level = g->n[parent].level + 1};
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

/* The node of the frame at depth @j of @c whose caller's node is @up. */
static long frame_node(struct graph *g, const struct pki_trace_call *c, size_t j, long up)
{
	if (up == NOT_UNDER)
		return c->stack[j] == g->root_fn ? 0 : NOT_UNDER; /* FUNC's outermost frame */
	if (up == TOO_DEEP || (g->depth && g->n[up].level >= g->depth))
		return TOO_DEEP;
	return child_of(g, (size_t)up, c->stack[j]);
}

static int on_call(const struct pki_trace_thread *t, const struct pki_trace_call *c, void *arg)
{
	struct graph *g = arg;
	struct gthread *th = &g->th[t - g->f->threads];
	size_t d = c->depth, k = d + 1, old = th->cap;
	long node;

	if (PKI_GROW(th->v, th->cap, d + 1))
		return -ENOMEM;
	memset(th->v + old, 0, (th->cap - old) * sizeof(*th->v));
	while (k && th->v[k - 1].id != c->ids[k - 1])
		k--;
	for (; k <= d; k++) {
		node = frame_node(g, c, k, k ? th->v[k - 1].node : NOT_UNDER);
		if (node == -ENOMEM)
			return -ENOMEM;
		th->v[k] = (struct gframe){.id = c->ids[k], .node = node};
	}
	node = th->v[d].node;
	if (node < 0)
		return 0; /* not under FUNC, or too deep */
	g->n[node].calls++;
	if (c->no_end)
		g->n[node].no_end++;
	else if (!c->instant) {
		g->n[node].ns += c->dur_ns;
		g->n[node].timed++;
	}
	return 0;
}

static void print_node(const struct graph *g, const struct gnode *n)
{
	char dur[32], nb[64], mark[32];
	size_t ind = cli_indent(n->level, n->level, mark, sizeof(mark));

	if (n->timed && !n->no_end)
		cli_fmt_ns(dur, sizeof(dur), n->ns, false);
	else
		snprintf(dur, sizeof(dur), "-");
	printf("%12s : %*s%s%s(%llu) %s\n", dur, (int)ind, "", n->level ? "+-" : "", mark,
	       (unsigned long long)n->calls, pki_trace_fn_name(g->f, n->fn, nb, sizeof(nb)));
}

/* Every node, depth first from FUNC: a node, its children, then its next sibling. */
static void print_graph(const struct graph *g)
{
	size_t i = 0;

	for (;;) {
		print_node(g, &g->n[i]);
		if (g->n[i].child) {
			i = g->n[i].child - 1;
			continue;
		}
		while (i && !g->n[i].sibling)
			i = g->n[i].parent;
		if (!i)
			return;
		i = g->n[i].sibling - 1;
	}
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
	    CLI_DEMANGLE_OPTIONS,
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
		} else if (c == CLI_O_DEMANGLE || c == CLI_O_NO_DEMANGLE) {
			if (!cli_demangle_opt(c, optarg))
				return 2;
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
	g.th = calloc(f->nthreads ? f->nthreads : 1, sizeof(*g.th));
	if (!err && !g.th)
		err = -ENOMEM;
	if (!err) {
		g.n[g.nn++] = (struct gnode){.fn = g.root_fn};
		err = pki_trace_replay_all(f, on_call, &g, NULL);
	}
	if (!err) {
		printf("# call graph under %s (%s): total time : (calls) function\n", func, path);
		print_graph(&g);
	}
	for (size_t i = 0; g.th && i < f->nthreads; i++)
		free(g.th[i].v);
	free(g.th);
	free(g.n);
	pki_idxmap_free(&g.kids);
	pki_trace_file_free(f);
	if (err)
		return cli_error("graph: %s: %s", path, strerror(err < 0 ? -err : err));
	return 0;
}
