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
 *
 * A session's processes (session.c) make one graph: a function is the same
 * in two files when its name and object are (as report adds up a function
 * over processes), so a node's fn is a session-wide id (struct gfn), each
 * file's fns mapped to it once.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "cli.h"
#include "traceread/analyze.h"
#include "traceread/idxmap.h"
#include "traceread/reader.h"

static const char usage[] =
    "usage: probekit graph FUNC [FILE] [options] [--pid PID]...\n\n"
    "The call graph under the function FUNC in the trace FILE (default\n"
    "probekit.trace), every thread together: each path of calls from FUNC\n"
    "down, with the number of calls that took it and their total time (uftrace's\n"
    "graph).  Calls recorded without their exit count, with no time.  A path\n"
    "with a call whose end is not known (still running when its thread's\n"
    "events stop, with no time for that end, or cut where a flight recorder\n"
    "overwrote events) shows '-'.\n\n" CLI_SESSION_HELP
    "A path is one over the processes, its calls and times added up: two\n"
    "processes' paths are the same when their functions are (by name and object,\n"
    "as report adds up a function).\n\n"
    "options:\n"
    "  -D, --depth N  only the paths at most N calls below FUNC\n"
    "  --pid PID      only the files of process PID (repeatable, or PID,PID...)\n" CLI_DEMANGLE_HELP
    "  -h, --help     this text\n\n"
    "Exit status: 0 on success; 1 if FILE cannot be read or is not a trace file,\n"
    "FUNC is not in it, no process has the pid given to --pid, or the output\n"
    "cannot be written; 2 for a usage error.\n";

struct gnode {
	uint64_t fn; /* its struct gfn's index */
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

/* A function of the session: the file it was first met in, and its fn there. */
struct gfn {
	const struct pki_trace_file *f;
	uint64_t fn;
};

struct graph {
	const char *func;
	unsigned long depth;
	struct gnode *n; /* n[0]: FUNC */
	size_t nn, cap;
	struct pki_idxmap kids; /* (parent index + 1, gfn index) -> child index + 1 */
	struct gfn *fns;
	size_t nfns, fcap;
	struct pki_idxmap fn_ids;  /* (file + 1, fn) -> gfn index + 1 */
	struct pki_idxmap by_name; /* (name hash, i) -> gfn index + 1: the i-th of that hash */
	/* the file being read */
	const struct pki_trace_file *f;
	size_t file;
	uint64_t root_fn;
	struct gthread *th; /* by thread index */
};

/* FNV-1a of @fn's name and object (cli_obj_name()). */
static uint64_t fn_hash(const struct pki_trace_file *f, uint64_t fn)
{
	char nb[32];
	const char *name = pki_trace_fn_name(f, fn, nb, sizeof(nb)), *obj = cli_obj_name(f, fn);
	uint64_t h = 0xcbf29ce484222325ull;
	size_t nl = strlen(name) + 1; /* (with its NUL: between name and object) */

	for (size_t i = 0; i < nl; i++)
		h = (h ^ (unsigned char)name[i]) * 0x100000001b3ull;
	for (; obj && *obj; obj++)
		h = (h ^ (unsigned char)*obj) * 0x100000001b3ull;
	return h;
}

/* Is @a the function @fn of @f: the same name and object? */
static bool fn_same(const struct gfn *a, const struct pki_trace_file *f, uint64_t fn)
{
	const char *oa = cli_obj_name(a->f, a->fn), *ob = cli_obj_name(f, fn);
	char ba[32], bb[32];

	return !strcmp(pki_trace_fn_name(a->f, a->fn, ba, sizeof(ba)),
		       pki_trace_fn_name(f, fn, bb, sizeof(bb))) &&
	       !strcmp(oa ? oa : "", ob ? ob : "");
}

/* The gfn of @fn of the file being read, by name, made on first use; or -ENOMEM. */
static long fn_find(struct graph *g, uint64_t fn)
{
	uint64_t h = fn_hash(g->f, fn), *slot;

	for (uint64_t i = 0;; i++) {
		slot = pki_idxmap_slot(&g->by_name, h, i);
		if (!slot)
			return -ENOMEM;
		if (*slot && fn_same(&g->fns[*slot - 1], g->f, fn))
			return (long)*slot - 1;
		if (*slot)
			continue;
		if (PKI_GROW(g->fns, g->fcap, g->nfns + 1))
			return -ENOMEM;
		g->fns[g->nfns] = (struct gfn){g->f, fn};
		*slot = ++g->nfns;
		g->by_name.n++;
		return (long)g->nfns - 1;
	}
}

/* The gfn index of @fn of the file being read; or -ENOMEM. */
static long fn_id(struct graph *g, uint64_t fn)
{
	uint64_t *slot = pki_idxmap_slot(&g->fn_ids, g->file + 1, fn);
	long id;

	if (!slot)
		return -ENOMEM;
	if (*slot)
		return (long)*slot - 1;
	id = fn_find(g, fn);
	if (id < 0)
		return id;
	*slot = (uint64_t)id + 1;
	g->fn_ids.n++;
	return id;
}

/* The child of node @parent for @fn, made on first use; its index, or -ENOMEM. */
static long child_of(struct graph *g, size_t parent, uint64_t fn)
{
	long id = fn_id(g, fn);
	uint64_t *slot = id < 0 ? NULL : pki_idxmap_slot(&g->kids, parent + 1, (uint64_t)id);
	struct gnode *p;

	if (!slot)
		return -ENOMEM;
	if (*slot)
		return (long)*slot - 1;
	if (PKI_GROW(g->n, g->cap, g->nn + 1))
		return -ENOMEM;
	g->n[g->nn] =
	    (struct gnode){.fn = (uint64_t)id, .parent = parent, .level = g->n[parent].level + 1};
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
	const struct gfn *fn = &g->fns[n->fn];
	char dur[32], nb[64], mark[32];
	size_t ind = cli_indent(n->level, n->level, mark, sizeof(mark));

	if (n->timed && !n->no_end)
		cli_fmt_ns(dur, sizeof(dur), n->ns, false);
	else
		snprintf(dur, sizeof(dur), "-");
	printf("%12s : %*s%s%s(%llu) %s\n", dur, (int)ind, "", n->level ? "+-" : "", mark,
	       (unsigned long long)n->calls, pki_trace_fn_name(fn->f, fn->fn, nb, sizeof(nb)));
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

/* The calls of @f, the session's file @k, added to @g's graph. */
static int graph_file(struct graph *g, const struct pki_trace_file *f, size_t k)
{
	long root;
	int err;

	g->f = f;
	g->file = k;
	g->root_fn = fn_named(f, g->func);
	if (!g->root_fn)
		return 0;
	if (!g->nn) {
		root = fn_id(g, g->root_fn);
		if (root < 0 || PKI_GROW(g->n, g->cap, 1))
			return -ENOMEM;
		g->n[g->nn++] = (struct gnode){.fn = (uint64_t)root};
	}
	g->th = calloc(f->nthreads ? f->nthreads : 1, sizeof(*g->th));
	if (!g->th)
		return -ENOMEM;
	err = pki_trace_replay_all(f, on_call, g, NULL);
	for (size_t i = 0; i < f->nthreads; i++)
		free(g->th[i].v);
	free(g->th);
	g->th = NULL;
	return err;
}

/* The graph of every process of @s, printed; 0, or 1 after saying why not. */
static int graph_session(struct graph *g, const struct cli_session *s, const char *path)
{
	int err = 0;

	for (size_t k = 0; !err && k < s->n; k++) {
		err = graph_file(g, s->p[k].f, k);
		if (err)
			return cli_error("graph: %s: %s", s->p[k].path,
					 strerror(err < 0 ? -err : err));
	}
	if (!g->nn)
		return cli_error("graph: %s: no function '%s' in the trace", path, g->func);
	if (s->n > 1)
		printf("# call graph under %s (the session of %s, %zu processes): total time : "
		       "(calls) function\n",
		       g->func, path, s->n);
	else
		printf("# call graph under %s (%s): total time : (calls) function\n", g->func,
		       path);
	print_graph(g);
	return 0;
}

static void graph_free(struct graph *g)
{
	free(g->n);
	free(g->fns);
	pki_idxmap_free(&g->kids);
	pki_idxmap_free(&g->fn_ids);
	pki_idxmap_free(&g->by_name);
}

/* Fill @g, @path and @pids from the command line; -1, or the exit status to stop with. */
static int graph_opts_parse(struct graph *g, const char **path, struct cli_pids *pids, int argc,
			    char **argv)
{
	static const struct option opts[] = {
	    {"depth", required_argument, NULL, 'D'},
	    {"pid", required_argument, NULL, 'p'},
	    {"help", no_argument, NULL, 'h'},
	    CLI_DEMANGLE_OPTIONS,
	    {NULL, 0, NULL, 0},
	};
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "D:h", opts, NULL)) != -1) {
		if (c == 'D') {
			g->depth = cli_parse_ulong("-D", optarg);
		} else if (c == 'p') {
			if (!cli_pids_add(pids, "graph", optarg))
				return 2;
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
	g->func = argv[optind++];
	if (optind < argc)
		*path = argv[optind++];
	if (optind < argc)
		return cli_usage_error("graph: unexpected argument '%s'", argv[optind]);
	return -1;
}

int cmd_graph(int argc, char **argv)
{
	struct graph g = {0};
	struct cli_pids pids = {0};
	const char *path = "probekit.trace";
	struct cli_session s;
	int ret = graph_opts_parse(&g, &path, &pids, argc, argv);

	if (ret >= 0)
		goto out;
	ret = cli_session_open(&s, "graph", path, &pids);
	if (!ret) {
		ret = graph_session(&g, &s, path);
		cli_session_free(&s);
	}
	graph_free(&g);
out:
	free(pids.v);
	return ret;
}
