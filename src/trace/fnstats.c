// SPDX-License-Identifier: MIT
/*
 * Per-function call statistics in the process: see fnstats.h.  Built
 * vector-free (novec_sources): pki_fnstats_add() runs behind the return
 * trampoline, which saves no vector register; the rest uses integer
 * arithmetic only.
 *
 * Freeing (pki_fnstats_fini): the table is read by pki_fnstats_add() and
 * pki_fnstats_count(), from a hook or from the return trampoline's exit
 * path.  fini runs after the ops were unregistered (a grace period: no
 * thread is inside a hook any more), but a frame whose return was hijacked
 * before may return through the trampoline at any time later, and a
 * counter shared by every call to know when none is reading would cost
 * every call a contended atomic.  So nothing a reader may reach is ever
 * freed: fini sets n to 0 (a later reader returns at once) and gives the
 * cells' pages back with MADV_DONTNEED (a reader that found n before and
 * writes after only faults in a zero page); the key arrays stay, and the
 * next init reuses all of it when it fits, or leaves it and makes new
 * ones (one retired table per larger session: bounded by the sessions).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "trace/clock.h"
#include "trace/fnstats.h"
#include "trace/trace.h"

struct cell {
	uint64_t calls, total, self, max;
	uint32_t hist[PKI_FNSTATS_BUCKETS];
};

/* What the interval's figures are taken against: the sums at the last sample. */
struct prev {
	uint64_t calls, total, self;
	uint32_t hist[PKI_FNSTATS_BUCKETS];
};

static struct {
	uint64_t *keys; /* open addressing, 2^bits slots: fn, 0 = empty */
	uint32_t *vals; /* the function's index */
	unsigned bits;
	size_t n;	    /* functions; 0: no table (calls are ignored) */
	size_t ncells;	    /* the functions the cells are laid out for (n while it is not 0) */
	struct cell *cells; /* [shard][n] */
	size_t cells_len;
	struct prev *prev; /* [n] */
	uint64_t ticks_per_sec;
	unsigned next_shard;
} S;

static __thread unsigned shard_plus1 __attribute__((tls_model("initial-exec")));

static inline uint64_t hash(uint64_t fn, unsigned bits)
{
	return (fn * 0x9e3779b97f4a7c15ull) >> (64 - bits);
}

static inline long lookup(uint64_t fn)
{
	uint64_t mask = (1ull << S.bits) - 1, h = hash(fn, S.bits);

	for (;; h = (h + 1) & mask) {
		if (S.keys[h] == fn)
			return S.vals[h];
		if (!S.keys[h])
			return -1;
	}
}

/* Bucket of a duration: 4 per power of two (the two bits below the top one). */
static inline unsigned bucket(uint64_t d)
{
	unsigned b;

	if (d < 4)
		return (unsigned)d;
	b = 63u - (unsigned)__builtin_clzll(d);
	return b * 4 + (unsigned)((d >> (b - 2)) & 3);
}

/* The largest duration in bucket @i (what a percentile in it is reported as). */
static uint64_t bucket_top(unsigned i)
{
	unsigned b = i / 4, sub = i % 4;

	if (i < 4)
		return i;
	if (b >= 63)
		return UINT64_MAX;
	return (1ull << b) + ((uint64_t)(sub + 1) << (b - 2)) - 1;
}

static inline struct cell *cell_of(uint64_t fn)
{
	long i;
	unsigned s = shard_plus1;

	if (!S.n)
		return NULL;
	i = lookup(fn);
	if (i < 0)
		return NULL;
	if (__builtin_expect(!s, 0)) {
		s = __atomic_fetch_add(&S.next_shard, 1, __ATOMIC_RELAXED) % PKI_FNSTATS_SHARDS + 1;
		shard_plus1 = s;
	}
	return &S.cells[(size_t)(s - 1) * S.ncells + (size_t)i];
}

void pki_fnstats_add(uint64_t fn, uint64_t dur, uint64_t self)
{
	struct cell *c = cell_of(fn);
	uint64_t m;

	if (c) {
		__atomic_fetch_add(&c->calls, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(&c->total, dur, __ATOMIC_RELAXED);
		__atomic_fetch_add(&c->self, self, __ATOMIC_RELAXED);
		__atomic_fetch_add(&c->hist[bucket(dur)], 1, __ATOMIC_RELAXED);
		m = __atomic_load_n(&c->max, __ATOMIC_RELAXED);
		while (dur > m && !__atomic_compare_exchange_n(&c->max, &m, dur, true,
							       __ATOMIC_RELAXED, __ATOMIC_RELAXED))
			;
	}
}

void pki_fnstats_count(uint64_t fn)
{
	struct cell *c = cell_of(fn);

	if (c) /* untimed: the calls the histogram does not have (sample_one()) */
		__atomic_fetch_add(&c->calls, 1, __ATOMIC_RELAXED);
}

/* Arrays for @n functions: the retired ones if they fit (see "freeing"), else new. */
static int table_make(size_t n)
{
	size_t slots, len = (size_t)PKI_FNSTATS_SHARDS * n * sizeof(struct cell);
	unsigned bits;

	for (bits = 4; (1ull << bits) < 2 * n; bits++)
		;
	slots = (size_t)1 << bits;
	if (!S.keys || bits > S.bits) {
		uint64_t *keys = calloc(slots, sizeof(*keys));
		uint32_t *vals = calloc(slots, sizeof(*vals));

		if (!keys || !vals) {
			free(keys);
			free(vals);
			return -ENOMEM;
		}
		S.keys = keys; /* the old ones stay: a late reader may hold them */
		S.vals = vals;
		S.bits = bits;
	} else {
		memset(S.keys, 0, ((size_t)1 << S.bits) * sizeof(*S.keys));
	}
	if (!S.cells || len > S.cells_len) {
		void *cells = mmap(NULL, len, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (cells == MAP_FAILED)
			return -ENOMEM;
		S.cells = cells;
		S.cells_len = len;
	}
	free(S.prev);
	S.prev = calloc(n, sizeof(*S.prev));
	return S.prev ? 0 : -ENOMEM;
}

int pki_fnstats_init(const uint64_t *fns, size_t n)
{
	struct pki_trace_clockinfo ci;
	uint64_t mask;
	int err;

	pki_fnstats_fini();
	err = pki_trace_clock_setup(0, &ci);
	if (err)
		return err;
	pki_trace_use_tsc = ci.clock == PKI_CLOCK_TSC;
	S.ticks_per_sec = ci.ticks_per_sec ? ci.ticks_per_sec : 1000000000u;
	if (!n)
		return 0;
	err = table_make(n);
	if (err)
		return err;
	mask = ((uint64_t)1 << S.bits) - 1;
	for (size_t i = 0; i < n; i++) {
		uint64_t h = hash(fns[i], S.bits);

		if (!fns[i])
			continue;
		while (S.keys[h] && S.keys[h] != fns[i])
			h = (h + 1) & mask;
		S.keys[h] = fns[i];
		S.vals[h] = (uint32_t)i;
	}
	S.ncells = n;
	__atomic_store_n(&S.n, n, __ATOMIC_RELEASE);
	return 0;
}

void pki_fnstats_fini(void)
{
	__atomic_store_n(&S.n, 0, __ATOMIC_SEQ_CST);
	if (S.cells)
		madvise(S.cells, S.cells_len, MADV_DONTNEED); /* zero, and no memory */
	free(S.prev);
	S.prev = NULL;
}

static uint64_t to_ns(uint64_t ticks)
{
	return (uint64_t)((unsigned __int128)ticks * 1000000000u / S.ticks_per_sec);
}

/* The duration under which @num/@den of the @calls timed calls in @h lie. */
static uint64_t percentile(const uint32_t *h, uint64_t calls, uint64_t num, uint64_t den)
{
	uint64_t want = (calls * num + den - 1) / den, seen = 0;

	for (unsigned i = 0; i < PKI_FNSTATS_BUCKETS; i++) {
		seen += h[i];
		if (seen >= want && seen)
			return bucket_top(i);
	}
	return 0;
}

/* The interval's figures of function @i into @row; false if it was not called. */
static bool sample_one(size_t i, struct pki_fnstats_row *row)
{
	uint32_t hist[PKI_FNSTATS_BUCKETS] = {0};
	uint64_t calls = 0, total = 0, self = 0, max = 0, timed;
	struct prev *p = &S.prev[i];
	struct cell *c;

	for (unsigned s = 0; s < PKI_FNSTATS_SHARDS; s++)
		calls +=
		    __atomic_load_n(&S.cells[(size_t)s * S.ncells + i].calls, __ATOMIC_RELAXED);
	if (calls == p->calls)
		return false; /* (its cells untouched: their pages never mapped) */
	for (unsigned s = 0; s < PKI_FNSTATS_SHARDS; s++) {
		uint64_t m;

		c = &S.cells[(size_t)s * S.ncells + i];
		total += __atomic_load_n(&c->total, __ATOMIC_RELAXED);
		self += __atomic_load_n(&c->self, __ATOMIC_RELAXED);
		m = __atomic_exchange_n(&c->max, 0, __ATOMIC_RELAXED);
		max = m > max ? m : max;
		for (unsigned b = 0; b < PKI_FNSTATS_BUCKETS; b++)
			hist[b] += __atomic_load_n(&c->hist[b], __ATOMIC_RELAXED);
	}
	row->index = i;
	row->calls = calls - p->calls;
	row->total_ns = to_ns(total - p->total);
	row->self_ns = to_ns(self - p->self);
	row->max_ns = to_ns(max);
	p->calls = calls;
	p->total = total;
	p->self = self;
	timed = 0;
	for (unsigned b = 0; b < PKI_FNSTATS_BUCKETS; b++) {
		uint32_t now = hist[b];

		hist[b] = now - p->hist[b];
		p->hist[b] = now;
		timed += hist[b];
	}
	/*
	 * The timed calls are the histogram's: calls and the other sums are
	 * read one after the other while threads add, so a difference of two
	 * of them may be off by the calls made in between.
	 */
	row->untimed = row->calls > timed ? row->calls - timed : 0;
	/* A bucket's top may pass the interval's longest call: never shown above it. */
	row->p50_ns = to_ns(percentile(hist, timed, 1, 2));
	row->p99_ns = to_ns(percentile(hist, timed, 99, 100));
	if (row->p50_ns > row->max_ns)
		row->p50_ns = row->max_ns;
	if (row->p99_ns > row->max_ns)
		row->p99_ns = row->max_ns;
	return true;
}

size_t pki_fnstats_sample(struct pki_fnstats_row *rows, size_t max)
{
	size_t n = __atomic_load_n(&S.n, __ATOMIC_ACQUIRE), k = 0;

	for (size_t i = 0; i < n && k < max; i++)
		k += sample_one(i, &rows[k]);
	return k;
}
