// SPDX-License-Identifier: MIT
/* Replay of entry/exit events into calls, and report statistics (analyze.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace/analyze.h"

/* A small open-addressing map from a 64-bit key to an index. */
struct map {
	uint64_t *keys;
	uint32_t *vals; /* index + 1; 0 = empty */
	size_t cap, n;
};

static uint64_t mix(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	return k;
}

static int map_grow(struct map *m)
{
	size_t ncap = m->cap ? m->cap * 2 : 64, i;
	uint64_t *keys = calloc(ncap, sizeof(*keys));
	uint32_t *vals = calloc(ncap, sizeof(*vals));

	if (!keys || !vals) {
		free(keys);
		free(vals);
		return -ENOMEM;
	}
	for (i = 0; i < m->cap; i++) {
		size_t j;

		if (!m->vals[i])
			continue;
		for (j = mix(m->keys[i]) & (ncap - 1); vals[j]; j = (j + 1) & (ncap - 1))
			;
		keys[j] = m->keys[i];
		vals[j] = m->vals[i];
	}
	free(m->keys);
	free(m->vals);
	m->keys = keys;
	m->vals = vals;
	m->cap = ncap;
	return 0;
}

/* Slot of @key: its value is *ret (0 if absent; then store into it to insert). */
static uint32_t *map_slot(struct map *m, uint64_t key)
{
	size_t j;

	if ((m->n + 1) * 2 > m->cap && map_grow(m))
		return NULL;
	for (j = mix(key) & (m->cap - 1); m->vals[j]; j = (j + 1) & (m->cap - 1))
		if (m->keys[j] == key)
			return &m->vals[j];
	m->keys[j] = key;
	return &m->vals[j];
}

static void map_free(struct map *m)
{
	free(m->keys);
	free(m->vals);
}

struct frame {
	uint64_t start, child_ns;
};

struct replay {
	const struct pki_trace_file *f;
	const struct pki_trace_thread *t;
	uint64_t *fns;
	struct frame *fr;
	size_t depth, cap;
	struct map active; /* fn -> 1 + number of its frames on the stack */
	pki_trace_call_fn cb;
	void *arg;
	struct pki_trace_replay_stats *st;
};

static int push(struct replay *r, uint64_t fn, uint64_t ts)
{
	uint32_t *a;

	if (r->depth == r->cap) {
		size_t ncap = r->cap ? r->cap * 2 : 64;
		uint64_t *fns = realloc(r->fns, ncap * sizeof(*fns));
		struct frame *fr;

		if (!fns)
			return -ENOMEM;
		r->fns = fns;
		fr = realloc(r->fr, ncap * sizeof(*fr));
		if (!fr)
			return -ENOMEM;
		r->fr = fr;
		r->cap = ncap;
	}
	a = map_slot(&r->active, fn);
	if (!a)
		return -ENOMEM;
	if (!*a) {
		*a = 1;
		r->active.n++;
	}
	(*a)++;
	r->fns[r->depth] = fn;
	r->fr[r->depth] = (struct frame){.start = ts};
	r->depth++;
	return 0;
}

/* Close the top frame at @ts. */
static int pop(struct replay *r, uint64_t ts, bool unwound, bool open)
{
	size_t d = --r->depth;
	uint64_t fn = r->fns[d];
	struct frame *fr = &r->fr[d];
	uint32_t *a = map_slot(&r->active, fn);
	struct pki_trace_call c = {
	    .fn = fn, .depth = (uint32_t)d, .unwound = unwound, .open = open, .stack = r->fns};

	if (!a)
		return -ENOMEM;
	(*a)--;
	c.outermost = *a == 1;
	c.start_ns = pki_trace_file_ts_ns(r->f, fr->start);
	c.end_ns = pki_trace_file_ts_ns(r->f, ts);
	c.dur_ns = ts > fr->start ? pki_trace_file_dur_ns(r->f, ts - fr->start) : 0;
	c.self_ns = c.dur_ns > fr->child_ns ? c.dur_ns - fr->child_ns : 0;
	if (d)
		r->fr[d - 1].child_ns += c.dur_ns;
	r->st->calls++;
	r->st->unwound += unwound;
	r->st->open += open;
	return r->cb(r->t, &c, r->arg);
}

int pki_trace_replay(const struct pki_trace_file *f, const struct pki_trace_thread *t,
		     pki_trace_call_fn cb, void *arg, struct pki_trace_replay_stats *st)
{
	struct pki_trace_replay_stats dummy;
	struct replay r = {.f = f, .t = t, .cb = cb, .arg = arg, .st = st ? st : &dummy};
	uint64_t last = 0;
	size_t i;
	int err = 0;

	if (!st)
		memset(&dummy, 0, sizeof(dummy));
	for (i = 0; i < t->nev && !err; i++) {
		uint64_t fn = PKI_EV_FN(t->ev[i].word), ts = t->ev[i].ts;
		uint32_t *a;
		size_t d;

		last = ts;
		if (PKI_EV_KIND(t->ev[i].word) == PKI_EV_ENTRY) {
			err = push(&r, fn, ts);
			continue;
		}
		a = r.depth ? map_slot(&r.active, fn) : NULL;
		if (!a || *a <= 1) {
			r.st->unmatched_exits++;
			continue;
		}
		for (d = r.depth; r.fns[d - 1] != fn; d--)
			;
		while (!err && r.depth > d)
			err = pop(&r, ts, true, false);
		if (!err)
			err = pop(&r, ts, false, false);
	}
	while (!err && r.depth)
		err = pop(&r, last, false, true);
	free(r.fns);
	free(r.fr);
	map_free(&r.active);
	return err;
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

struct build {
	struct pki_trace_report *r;
	size_t cap;
	struct map idx;
	bool per_thread;
	struct canon *canon; /* NULL in most traces: no library came back elsewhere */
	size_t ncanon;
};

/*
 * Per-thread reports replay one thread at a time, so the map is emptied
 * between threads and keyed by fn alone in both modes.
 */
static int account(const struct pki_trace_thread *t, const struct pki_trace_call *c, void *arg)
{
	struct build *b = arg;
	uint64_t fn = c->fn;
	uint32_t *slot;
	struct pki_trace_fnstat *s;

	if (b->ncanon) {
		struct canon key = {.fn = fn}, *m;

		m = bsearch(&key, b->canon, b->ncanon, sizeof(key), canon_by_fn);
		if (m)
			fn = m->to;
	}
	slot = map_slot(&b->idx, fn);

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
		*slot = (uint32_t)b->r->n;
		b->idx.n++;
	}
	s = &b->r->st[*slot - 1];
	s->calls++;
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

int pki_trace_report_build(const struct pki_trace_file *f, bool per_thread,
			   struct pki_trace_report *r)
{
	struct build b = {.r = r, .per_thread = per_thread};
	size_t i;
	int err = 0;

	memset(r, 0, sizeof(*r));
	err = canon_build(f, &b.canon, &b.ncanon);
	for (i = 0; i < f->nthreads && !err; i++) {
		if (per_thread) {
			map_free(&b.idx);
			memset(&b.idx, 0, sizeof(b.idx));
		}
		err = pki_trace_replay(f, &f->threads[i], account, &b, &r->rs);
	}
	map_free(&b.idx);
	free(b.canon);
	if (err)
		pki_trace_report_free(r);
	return err;
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

static uint64_t key_of(const struct pki_trace_fnstat *s, enum pki_trace_sort key)
{
	switch (key) {
	case PKI_SORT_CALLS:
		return s->calls;
	case PKI_SORT_SELF:
		return s->self_ns;
	case PKI_SORT_AVG:
		return s->calls ? s->sum_ns / s->calls : 0;
	case PKI_SORT_MIN:
		return s->min_ns;
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

	if (ctx->key != PKI_SORT_NAME && key_of(a, ctx->key) != key_of(b, ctx->key))
		return key_of(a, ctx->key) > key_of(b, ctx->key) ? -1 : 1;
	c = strcmp(pki_trace_fn_name(ctx->f, a->fn, ba, sizeof(ba)),
		   pki_trace_fn_name(ctx->f, b->fn, bb, sizeof(bb)));
	if (c)
		return c;
	if (a->fn != b->fn)
		return a->fn < b->fn ? -1 : 1;
	return a->tsn < b->tsn ? -1 : a->tsn > b->tsn;
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
	free(r->st);
	memset(r, 0, sizeof(*r));
}
