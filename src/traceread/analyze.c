// SPDX-License-Identifier: MIT
/*
 * Replay of entry/exit events into calls, and report statistics (analyze.h).
 * Events are streamed (reader.h): each thread keeps its shadow stack between
 * EVENTS records, and the report keeps one row per function (and thread), so
 * memory follows the program's functions, threads and call depth, not the
 * trace's length.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "traceread/analyze.h"
#include "traceread/idxmap.h"

/*
 * One thread's replay, fed its events as they are read.  Memory: the shadow
 * stack (call depth) and the map of the functions on it, never the events.
 */
/*
 * An event whose DATA may still come (an exit with a return value, a call
 * with arguments): it is replayed when the thread's next event that is no
 * DATA comes, or at the end (a record may end between an event and its
 * DATA).
 */
struct held {
	bool on;
	unsigned kind;
	uint64_t fn, ts;
	const struct pki_argspec *spec;
	struct pki_argval *vals; /* spec->n, allocated with the replay */
};

struct replay {
	const struct pki_trace_file *f;
	const struct pki_trace_thread *t;
	uint64_t *fns, *starts, *child_ns, *ids; /* the stack, bottom first */
	struct pki_argval **vals;		 /* per frame: its values, or NULL */
	size_t depth, cap;
	struct held held;
	struct pki_argval *into; /* where the DATA that come now go (spec->n of them), or NULL */
	unsigned into_n;
	uint64_t next_id;	  /* frame serials: unique within the thread */
	uint64_t last;		  /* the thread's last event time */
	struct pki_idxmap active; /* (fn, 0) -> 1 + number of its frames on the stack */
	pki_trace_call_fn cb;
	void *arg;
	struct pki_trace_replay_stats *st;
};

static int grow_stack(struct replay *r)
{
	size_t ncap = r->cap ? r->cap * 2 : 64;
	uint64_t **arrs[] = {&r->fns, &r->starts, &r->child_ns, &r->ids};
	size_t i;

	if (ncap > SIZE_MAX / sizeof(uint64_t))
		return -ENOMEM;
	struct pki_argval **v;

	for (i = 0; i < sizeof(arrs) / sizeof(arrs[0]); i++) {
		uint64_t *n = realloc(*arrs[i], ncap * sizeof(uint64_t));

		if (!n)
			return -ENOMEM;
		*arrs[i] = n;
	}
	v = realloc(r->vals, ncap * sizeof(*v));
	if (!v)
		return -ENOMEM;
	r->vals = v;
	r->cap = ncap;
	return 0;
}

/* Room for @spec's values, zeroed: NULL when out of memory (the values are then not shown). */
static struct pki_argval *vals_new(const struct pki_argspec *spec)
{
	return calloc(spec->n, sizeof(struct pki_argval));
}

static int push(struct replay *r, uint64_t fn, uint64_t ts)
{
	uint64_t *a;

	if (r->depth == r->cap && grow_stack(r))
		return -ENOMEM;
	a = pki_idxmap_slot(&r->active, fn, 0);
	if (!a)
		return -ENOMEM;
	if (!*a) {
		*a = 1;
		r->active.n++;
	}
	(*a)++;
	r->fns[r->depth] = fn;
	r->starts[r->depth] = ts;
	r->child_ns[r->depth] = 0;
	r->ids[r->depth] = ++r->next_id;
	r->vals[r->depth] = NULL;
	r->depth++;
	return 0;
}

/*
 * Close the top frame at @ts; @ret: its exit's values (the return value
 * item's, which the frame's values take), or NULL.
 */
static int pop_ret(struct replay *r, uint64_t ts, bool unwound, bool open, bool no_end,
		   const struct pki_argval *ret)
{
	size_t d = --r->depth;
	uint64_t fn = r->fns[d], start = r->starts[d];
	const struct pki_argspec *spec = r->f->nargs ? pki_trace_file_args(r->f, fn) : NULL;
	int err;
	uint64_t *a = pki_idxmap_slot(&r->active, fn, 0);
	struct pki_trace_call c = {.fn = fn,
				   .depth = (uint32_t)d,
				   .unwound = unwound,
				   .open = open,
				   .no_end = no_end,
				   .stack = r->fns,
				   .stack_ts = r->starts,
				   .ids = r->ids};

	if (!a)
		return -ENOMEM;
	(*a)--;
	c.outermost = *a == 1;
	c.start_ns = pki_trace_file_ts_ns(r->f, start);
	c.end_ns = pki_trace_file_ts_ns(r->f, ts);
	/* (no end known: no time, and the frames below it are cut with it) */
	c.dur_ns = ts > start && !no_end ? pki_trace_file_dur_ns(r->f, ts - start) : 0;
	c.self_ns = c.dur_ns > r->child_ns[d] ? c.dur_ns - r->child_ns[d] : 0;
	if (d)
		r->child_ns[d - 1] += c.dur_ns;
	r->st->calls++;
	r->st->unwound += unwound;
	r->st->open += open;
	r->st->no_end += no_end;
	if (spec && ret && spec->ret && !r->vals[d])
		r->vals[d] = vals_new(spec);
	if (spec && ret && spec->ret && r->vals[d])
		r->vals[d][spec->n - 1] = ret[spec->n - 1];
	if (spec && r->vals[d]) {
		c.spec = spec;
		c.vals = r->vals[d];
	}
	if (r->into && r->into == r->vals[d])
		r->into = NULL;
	err = r->cb(r->t, &c, r->arg);
	free(r->vals[d]);
	r->vals[d] = NULL;
	return err;
}

static int pop(struct replay *r, uint64_t ts, bool unwound)
{
	return pop_ret(r, ts, unwound, false, false, NULL);
}

/* Close what is open at the end of the thread's trace: at @ts, or with no known end. */
static int pop_open(struct replay *r, uint64_t ts, bool known)
{
	return pop_ret(r, ts, false, true, !known, NULL);
}

/*
 * A call with no exit to come (PKI_EV_CALL): reported at the depth it would
 * have, with its stack, and no duration; nothing stays on the stack.
 */
static int instant(struct replay *r, uint64_t fn, uint64_t ts, const struct pki_argspec *spec,
		   const struct pki_argval *vals)
{
	struct pki_trace_call c = {
	    .fn = fn, .instant = true, .spec = vals ? spec : NULL, .vals = vals};
	uint64_t *a;
	int err = push(r, fn, ts);

	if (err)
		return err;
	a = pki_idxmap_slot(&r->active, fn, 0);
	c.depth = (uint32_t)(r->depth - 1);
	c.outermost = *a == 2;
	c.start_ns = c.end_ns = pki_trace_file_ts_ns(r->f, ts);
	c.stack = r->fns;
	c.stack_ts = r->starts;
	c.ids = r->ids;
	r->st->calls++;
	err = r->cb(r->t, &c, r->arg);
	(*a)--;
	r->depth--;
	return err;
}

/* The exit of @fn at @ts (@ret: its values, or NULL). */
static int exit_of(struct replay *r, uint64_t fn, uint64_t ts, const struct pki_argval *ret)
{
	uint64_t a = r->depth ? pki_idxmap_get(&r->active, fn, 0) : 0;
	size_t d;
	int err = 0;

	if (a <= 1) {
		r->st->unmatched_exits++;
		return 0;
	}
	for (d = r->depth; r->fns[d - 1] != fn; d--)
		;
	while (!err && r->depth > d)
		err = pop(r, ts, true);
	return err ? err : pop_ret(r, ts, false, false, false, ret);
}

/* Replay the held event, its DATA in. */
static int settle(struct replay *r)
{
	struct held *h = &r->held;

	if (!h->on)
		return 0;
	h->on = false;
	r->into = NULL;
	if (h->kind == PKI_EV_EXIT)
		return exit_of(r, h->fn, h->ts, h->vals);
	return instant(r, h->fn, h->ts, h->spec, h->vals);
}

/* @fn's event of @kind at @ts, whose DATA come next, is held (settle()). */
static int hold(struct replay *r, const struct pki_argspec *spec, unsigned kind, uint64_t fn,
		uint64_t ts)
{
	struct held *h = &r->held;

	if (!h->vals && !(h->vals = calloc(PKI_DATA_ITEMS_MAX, sizeof(*h->vals))))
		return -ENOMEM;
	memset(h->vals, 0, spec->n * sizeof(*h->vals));
	*h = (struct held){true, kind, fn, ts, spec, h->vals};
	r->into = h->vals;
	r->into_n = spec->n;
	return 0;
}

static int feed(struct replay *r, const struct pki_trace_event *ev, size_t n)
{
	size_t i;
	int err = 0;

	for (i = 0; i < n && !err; i++) {
		uint64_t fn = PKI_EV_FN(ev[i].word), ts = ev[i].ts;
		unsigned kind = PKI_EV_KIND(ev[i].word);
		const struct pki_argspec *spec;

		if (PKI_EV_IS_DATA(ev[i].word)) { /* a value of the event before, if we have it */
			unsigned item = PKI_DATA_ITEM(ev[i].word);

			if (r->into && item < r->into_n)
				pki_argval_add(&r->into[item], ev[i].word, ev[i].ts);
			continue;
		}
		err = settle(r);
		r->into = NULL;
		if (err)
			break;
		spec = r->f->nargs ? pki_trace_file_args(r->f, fn) : NULL;
		if (PKI_EV_KIND(ev[i].word) == PKI_EV_GAP) {
			/*
			 * Overwritten events: what was open ended in them, when is
			 * not known.
			 */
			while (!err && r->depth)
				err = pop_open(r, r->last, false);
			r->st->gaps++;
			continue;
		}
		r->last = ts;
		if (kind == PKI_EV_ENTRY) {
			err = push(r, fn, ts);
			if (!err && spec && spec->n > spec->ret) { /* its arguments come next */
				r->vals[r->depth - 1] = vals_new(spec);
				r->into = r->vals[r->depth - 1];
				r->into_n = spec->n;
			}
			continue;
		}
		if (spec && (kind == PKI_EV_EXIT ? spec->ret : spec->n > spec->ret)) {
			err = hold(r, spec, kind, fn, ts);
			continue;
		}
		if (kind == PKI_EV_CALL)
			err = instant(r, fn, ts, NULL, NULL);
		else
			err = exit_of(r, fn, ts, NULL);
	}
	return err;
}

/*
 * The thread's events are over: close the frames still open where its
 * trace is known to have ended (else with no end), free the state.
 */
static int replay_end(struct replay *r, int err)
{
	uint64_t end = r->last;
	bool known = pki_trace_thread_end(r->f, r->t, &end);

	if (!err)
		err = settle(r);
	while (!err && r->depth)
		err = pop_open(r, end, known);
	while (r->depth) /* (an error: the frames left) */
		free(r->vals[--r->depth]);
	free(r->vals);
	free(r->held.vals);
	free(r->fns);
	free(r->starts);
	free(r->child_ns);
	free(r->ids);
	pki_idxmap_free(&r->active);
	return err;
}

struct replay_set {
	struct replay *r;		     /* by thread index in f->threads */
	const struct pki_trace_thread *only; /* NULL: every thread */
};

static int feed_cb(const struct pki_trace_file *f, const struct pki_trace_thread *t,
		   const struct pki_trace_event *ev, size_t n, void *arg)
{
	struct replay_set *rs = arg;

	if (rs->only && t != rs->only)
		return 0;
	return feed(&rs->r[rs->only ? 0 : (size_t)(t - f->threads)], ev, n);
}

/* Replay @only (or every thread if NULL), reading the events once. */
static int replay_threads(const struct pki_trace_file *f, const struct pki_trace_thread *only,
			  pki_trace_call_fn cb, void *arg, struct pki_trace_replay_stats *st)
{
	struct pki_trace_replay_stats dummy = {0};
	size_t n = only ? 1 : f->nthreads, i;
	struct replay_set rs = {.only = only};
	int err;

	if (!n)
		return 0;
	rs.r = calloc(n, sizeof(*rs.r));
	if (!rs.r)
		return -ENOMEM;
	for (i = 0; i < n; i++)
		rs.r[i] = (struct replay){.f = f,
					  .t = only ? only : &f->threads[i],
					  .cb = cb,
					  .arg = arg,
					  .st = st ? st : &dummy};
	err = pki_trace_file_events(f, feed_cb, &rs);
	for (i = 0; i < n; i++)
		err = replay_end(&rs.r[i], err);
	free(rs.r);
	return err;
}

int pki_trace_replay(const struct pki_trace_file *f, const struct pki_trace_thread *t,
		     pki_trace_call_fn cb, void *arg, struct pki_trace_replay_stats *st)
{
	return replay_threads(f, t, cb, arg, st);
}

int pki_trace_replay_all(const struct pki_trace_file *f, pki_trace_call_fn cb, void *arg,
			 struct pki_trace_replay_stats *st)
{
	return replay_threads(f, NULL, cb, arg, st);
}

/* ---- report ------------------------------------------------------------- */

/*
 * One function, one row, even when its library was unloaded and loaded
 * again at another address (dlopen/dlclose): its calls then carry another
 * fn value, named by a SYMBOL record of another OBJECT record with the same
 * path.  Such an fn is counted under the lowest fn at the same offset from
 * the base of an object with the same path (its "canonical" fn).
 */
struct canon {
	uint64_t fn, to;
	const char *path;
	uint64_t off;
};

static int canon_by_place(const void *pa, const void *pb)
{
	const struct canon *a = pa, *b = pb;
	int c = strcmp(a->path, b->path);

	if (c)
		return c;
	if (a->off != b->off)
		return a->off < b->off ? -1 : 1;
	return a->fn < b->fn ? -1 : a->fn > b->fn;
}

static int canon_by_fn(const void *pa, const void *pb)
{
	const struct canon *a = pa, *b = pb;

	return a->fn < b->fn ? -1 : a->fn > b->fn;
}

/* The fns that have a canonical fn other than themselves, sorted by fn. */
static int canon_build(const struct pki_trace_file *f, struct canon **out, size_t *nout)
{
	struct canon *v;
	size_t i, n = 0, k = 0;

	*out = NULL;
	*nout = 0;
	if (f->nobjs < 2)
		return 0;
	v = calloc(f->nsyms ? f->nsyms : 1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (i = 0; i < f->nsyms; i++) {
		const struct pki_trace_obj *o =
		    f->syms[i].object_id ? pki_trace_file_obj(f, f->syms[i].object_id) : NULL;

		if (o && o->path && f->syms[i].fn >= o->base)
			v[n++] = (struct canon){
			    .fn = f->syms[i].fn, .path = o->path, .off = f->syms[i].fn - o->base};
	}
	qsort(v, n, sizeof(*v), canon_by_place);
	for (i = 0; i < n; i++) {
		bool same = i && !strcmp(v[i].path, v[i - 1].path) && v[i].off == v[i - 1].off;

		v[i].to = same ? v[i - 1].to : v[i].fn;
	}
	for (i = 0; i < n; i++)
		if (v[i].to != v[i].fn)
			v[k++] = v[i];
	if (!k) {
		free(v);
		return 0;
	}
	qsort(v, k, sizeof(*v), canon_by_fn);
	*out = v;
	*nout = k;
	return 0;
}

/* Distinct texts, each kept once: an open-addressing table of indexes into r->texts. */
struct texts {
	uint32_t *slot; /* index + 1, or 0 */
	size_t mask, cap;
};

static uint64_t text_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	while (*s)
		h = (h ^ (unsigned char)*s++) * 1099511628211ull;
	return h;
}

/* @s's index in @r->texts (added if new): 0 or -ENOMEM. */
static int text_id(struct pki_trace_report *r, struct texts *t, const char *s, uint32_t *id)
{
	size_t h;

	if (2 * (r->ntexts + 1) > t->mask + 1) {
		size_t n = t->mask ? 2 * (t->mask + 1) : 64;
		uint32_t *slot = calloc(n, sizeof(*slot));

		if (!slot)
			return -ENOMEM;
		for (size_t i = 0; i < r->ntexts; i++) {
			for (h = text_hash(r->texts[i]) & (n - 1); slot[h]; h = (h + 1) & (n - 1))
				;
			slot[h] = (uint32_t)i + 1;
		}
		free(t->slot);
		t->slot = slot;
		t->mask = n - 1;
	}
	for (h = text_hash(s) & t->mask; t->slot[h]; h = (h + 1) & t->mask)
		if (!strcmp(r->texts[t->slot[h] - 1], s)) {
			*id = t->slot[h] - 1;
			return 0;
		}
	if (r->ntexts == t->cap) {
		size_t ncap = t->cap ? 2 * t->cap : 64;
		char **v = realloc(r->texts, ncap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		r->texts = v;
		t->cap = ncap;
	}
	if (!(r->texts[r->ntexts] = strdup(s)))
		return -ENOMEM;
	t->slot[h] = (uint32_t)++r->ntexts;
	*id = (uint32_t)r->ntexts - 1;
	return 0;
}

struct build {
	struct pki_trace_report *r;
	size_t cap;
	bool by_args;
	const char *(*name_of)(uint64_t addr, void *arg);
	const struct pki_trace_file *f;
	struct texts texts;
	struct pki_idxmap idx; /* (fn, tsn or 0) -> index + 1 into r->st */
	bool per_thread;
	struct canon *canon; /* NULL in most traces: no library came back elsewhere */
	size_t ncanon;
};

/* Threads are replayed together (their events interleave): keyed by fn and tsn. */
static int account(const struct pki_trace_thread *t, const struct pki_trace_call *c, void *arg)
{
	struct build *b = arg;
	uint64_t fn = c->fn, *slot;
	struct pki_trace_fnstat *s;
	uint32_t id = 0;

	if (b->ncanon) {
		struct canon key = {.fn = fn}, *m;

		m = bsearch(&key, b->canon, b->ncanon, sizeof(key), canon_by_fn);
		if (m)
			fn = m->to;
	}
	if (b->by_args && c->spec) {
		char text[2 * 1024 + 4];
		size_t n;
		int err;

		pki_argvals_str(c->spec, c->vals, false, text, 1024, b->name_of, (void *)b->f);
		n = strlen(text);
		if (c->spec->ret && c->vals[c->spec->n - 1].any) {
			memcpy(text + n, " = ", 4);
			pki_argvals_str(c->spec, c->vals, true, text + n + 3, 1024, b->name_of,
					(void *)b->f);
		}
		err = text_id(b->r, &b->texts, text, &id);
		if (err)
			return err;
		id++;
	}
	/* (the key's second word: the thread, and the values' text + 1 above it) */
	slot = pki_idxmap_slot(&b->idx, fn, (b->per_thread ? t->tsn : 0) | (uint64_t)id << 32);

	if (!slot)
		return -ENOMEM;
	if (!*slot) {
		if (b->r->n == b->cap) {
			size_t ncap = b->cap ? b->cap * 2 : 64;
			struct pki_trace_fnstat *n = realloc(b->r->st, ncap * sizeof(*n));

			if (!n)
				return -ENOMEM;
			b->r->st = n;
			b->cap = ncap;
		}
		b->r->st[b->r->n++] = (struct pki_trace_fnstat){
		    .fn = fn, .tsn = b->per_thread ? t->tsn : 0, .min_ns = UINT64_MAX};
		if (id) /* (texts only grow: their index is what stays) */
			b->r->st[b->r->n - 1].args = (const char *)(uintptr_t)id;
		*slot = b->r->n;
		b->idx.n++;
	}
	s = &b->r->st[*slot - 1];
	s->calls++;
	if (c->instant) { /* counted, no time */
		s->instants++;
		return 0;
	}
	if (c->no_end) { /* no time known: the sums and bounds it is in are unknown */
		s->no_end++;
		s->no_end_outer += c->outermost;
		return 0;
	}
	s->self_ns += c->self_ns;
	s->sum_ns += c->dur_ns;
	if (c->outermost)
		s->total_ns += c->dur_ns;
	if (c->dur_ns < s->min_ns)
		s->min_ns = c->dur_ns;
	if (c->dur_ns > s->max_ns)
		s->max_ns = c->dur_ns;
	return 0;
}

int pki_trace_report_build_args(const struct pki_trace_file *f, bool per_thread, bool by_args,
				const char *(*name_of)(uint64_t addr, void *arg),
				struct pki_trace_report *r)
{
	struct build b = {
	    .r = r, .per_thread = per_thread, .by_args = by_args, .name_of = name_of, .f = f};
	int err = 0;

	memset(r, 0, sizeof(*r));
	err = canon_build(f, &b.canon, &b.ncanon);
	if (!err)
		err = pki_trace_replay_all(f, account, &b, &r->rs);
	pki_idxmap_free(&b.idx);
	free(b.canon);
	free(b.texts.slot);
	/* The rows' values: from text index + 1 to the text (r->texts is final now). */
	for (size_t i = 0; !err && i < r->n; i++)
		if (r->st[i].args)
			r->st[i].args = r->texts[(uintptr_t)r->st[i].args - 1];
	if (err)
		pki_trace_report_free(r);
	return err;
}

int pki_trace_report_build(const struct pki_trace_file *f, bool per_thread,
			   struct pki_trace_report *r)
{
	return pki_trace_report_build_args(f, per_thread, false, NULL, r);
}

const char *pki_trace_fn_name(const struct pki_trace_file *f, uint64_t fn, char *buf, size_t len)
{
	const struct pki_trace_sym *s = pki_trace_file_sym(f, fn);

	if (s)
		return s->name;
	snprintf(buf, len, "0x%llx", (unsigned long long)fn);
	return buf;
}

struct sort_ctx {
	const struct pki_trace_file *f;
	enum pki_trace_sort key;
};

uint64_t pki_trace_fnstat_key(const struct pki_trace_fnstat *s, enum pki_trace_sort key)
{
	if (key == PKI_SORT_TOTAL ? s->no_end_outer : key != PKI_SORT_CALLS && s->no_end)
		return 0;
	switch (key) {
	case PKI_SORT_CALLS:
		return s->calls;
	case PKI_SORT_SELF:
		return s->self_ns;
	case PKI_SORT_AVG: /* over the timed calls, as printed */
		return pki_trace_fnstat_avg(s);
	case PKI_SORT_MIN:
		return s->calls > s->instants ? s->min_ns : 0; /* untimed: none, last */
	case PKI_SORT_MAX:
		return s->max_ns;
	default:
		return s->total_ns;
	}
}

static int stat_cmp(const void *pa, const void *pb, void *arg)
{
	const struct pki_trace_fnstat *a = pa, *b = pb;
	const struct sort_ctx *ctx = arg;
	char ba[32], bb[32];
	int c;

	if (ctx->key != PKI_SORT_NAME &&
	    pki_trace_fnstat_key(a, ctx->key) != pki_trace_fnstat_key(b, ctx->key))
		return pki_trace_fnstat_key(a, ctx->key) > pki_trace_fnstat_key(b, ctx->key) ? -1
											     : 1;
	c = strcmp(pki_trace_fn_name(ctx->f, a->fn, ba, sizeof(ba)),
		   pki_trace_fn_name(ctx->f, b->fn, bb, sizeof(bb)));
	if (c)
		return c;
	if (a->fn != b->fn)
		return a->fn < b->fn ? -1 : 1;
	if (a->tsn != b->tsn)
		return a->tsn < b->tsn ? -1 : 1;
	return strcmp(a->args ? a->args : "", b->args ? b->args : "");
}

void pki_trace_report_sort(const struct pki_trace_file *f, struct pki_trace_report *r,
			   enum pki_trace_sort key)
{
	struct sort_ctx ctx = {f, key};

	/* An empty report has st == NULL, which qsort_r must not be given (nonnull). */
	if (r->n)
		qsort_r(r->st, r->n, sizeof(*r->st), stat_cmp, &ctx);
}

void pki_trace_report_free(struct pki_trace_report *r)
{
	for (size_t i = 0; i < r->ntexts; i++)
		free(r->texts[i]);
	free(r->texts);
	free(r->st);
	memset(r, 0, sizeof(*r));
}

void pki_trace_fnstat_merge(struct pki_trace_fnstat *into, const struct pki_trace_fnstat *from)
{
	into->calls += from->calls;
	into->total_ns += from->total_ns;
	into->self_ns += from->self_ns;
	into->sum_ns += from->sum_ns;
	into->min_ns = from->min_ns < into->min_ns ? from->min_ns : into->min_ns;
	into->max_ns = from->max_ns > into->max_ns ? from->max_ns : into->max_ns;
	into->instants += from->instants;
	into->no_end += from->no_end;
	into->no_end_outer += from->no_end_outer;
}
