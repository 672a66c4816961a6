// SPDX-License-Identifier: MIT
/*
 * The hook registry: sites, the ops on each, and ONE internal direct ops
 * owning the ip->addr hash of all direct entries (seed 003).  For each site
 * it decides what the 5 bytes call:
 *
 *   ops  direct  site calls
 *   0    no      nothing (nop5)
 *   1    no      the ops' trampoline specialised for it (near the site)
 *   0    yes     addr (or a near stub jumping to it, if out of rel32 reach)
 *   >=2  any     the list dispatcher of a chunk near the site, which runs
 *   >=1  yes     the ops and then continues into addr (hash lookup)
 *
 * Writers.  hook_lock serialises everything below, held for the length of
 * one public call.  A transaction is an ownership of the registry, not of
 * the lock: pk_txn_begin() marks it open and owned by the calling thread
 * (txn_open, txn_mine), other threads' calls wait on txn_cv until its
 * commit or abort; between calls the owner holds no lock.  So fork() only
 * waits for a call in flight, never for an open transaction (see "fork"
 * below).  Every public call stages its change
 * on the sites (keeping an undo copy of each site it touches first: the
 * "dirty" list), and the commit computes the targets, builds and publishes a
 * new runtime table, then hands all pokes to the patch layer in ONE batch.
 *
 * Readers (hot path: list dispatcher, grace-period handler) see only the
 * runtime table `rt_cur`: immutable once published, with the ops arrays in
 * it; replaced as a whole per commit; the old one freed after a grace period
 * (gp.c).  It is published BEFORE the text is poked, so a thread entering the
 * dispatcher through old or new bytes finds the new state; a dispatcher that
 * finds no entry just returns.
 *
 * Freeing.  pk_direct_del()/mod() retire tables, stubs and trampolines with
 * pki_gp_defer() (background, batched: no wait per call).  pk_ops_unregister()
 * waits for one grace period, because the caller may free the ops right after.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <probekit/hook.h>
#include <probekit/sites.h>

#include "arch/x86_64/insn.h"
#include "arch/x86_64/tramp.h"
#include "core/gp.h"
#include "core/hook_int.h"
#include "core/log.h"
#include "core/tmem.h"
#include "sym/sites.h"

/* ---- writer-side state, under hook_lock ---- */

struct ops_vec {
	struct pk_ops **v;
	unsigned int n, cap;
};

struct site {
	unsigned long ip;
	uint8_t cur[PKI_SITE_LEN]; /* bytes in the text now */
	unsigned long target;	   /* what they call (0: nothing) */
	struct pki_tslot stub;	   /* far stub to the direct addr, if stub.x */
	/* staged state */
	struct ops_vec ops;
	unsigned long direct; /* the direct ops' hash: ip -> addr (0: none) */
	/* undo copy while dirty in the open transaction */
	bool dirty;
	struct ops_vec saved_ops;
	unsigned long saved_direct;
	/* commit scratch */
	unsigned long new_target;
	struct pki_tslot new_stub;
};

struct ops_priv {
	struct pk_ops *ops;
	unsigned long *ips; /* its sites */
	size_t nips;
	struct pki_tslot *tramps; /* specialised trampolines, one per chunk used */
	size_t ntramps;
	bool registered; /* committed state */
	bool staged;	 /* staged state */
	bool follows;	 /* filter by globs or empty: takes sites of objects loaded later */
	/*
	 * Unregister + register of a registered ops in one transaction: the
	 * new registration gets its own ops_priv (ops->private), and @prev is
	 * the committed one, staged for removal.  Abort gives ops->private
	 * back to @prev; commit frees @prev after the grace period.
	 */
	struct ops_priv *prev;
};

struct ops_change {
	struct ops_priv *p;
	bool reg;
};

/* ip -> struct site, open addressing (sites are never removed). */
struct sitemap {
	struct site **slot;
	size_t cap, n;
};

static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sitemap sites;
static struct {
	struct site **v;
	size_t n, cap;
} dirty;
static struct {
	struct ops_change *v;
	size_t n, cap;
} changes;
static pthread_cond_t txn_cv = PTHREAD_COND_INITIALIZER; /* txn_open went false */
static bool txn_open;
static __thread bool txn_mine;
static bool hook_broken; /* fork child of a parent whose call in flight never ended */
/* Every ops_priv alive (registered, staged, or being unregistered). */
static struct {
	struct ops_priv **v;
	size_t n, cap;
} all_ops;
static bool rt_stale; /* sites were forgotten: the next commit rebuilds the table */

static void hook_unlock(void);
static void atfork_after_batch(void);

/* How long an unregister waits for its grace period (0: for ever); see hook_int.h. */
static long unreg_timeout_ns;

void pki_hook_set_unregister_timeout(long ns)
{
	__atomic_store_n(&unreg_timeout_ns, ns, __ATOMIC_RELAXED);
}

/* Default site source: the sym layer's table (built on first use). */
static int sym_lookup(unsigned long addr, unsigned long *ip)
{
	struct pk_site site;
	int err = pk_site_find(addr, &site);

	if (!err)
		*ip = site.ip;
	return err;
}

struct each_ctx {
	int (*cb)(unsigned long ip, void *arg);
	void *arg;
};

static int each_one(const struct pk_site *s, void *ctx)
{
	struct each_ctx *c = ctx;
	int err = c->cb(s->ip, c->arg);

	return err < 0 ? err : 0;
}

static int sym_each(const char *glob, int (*cb)(unsigned long, void *), void *arg)
{
	struct each_ctx c = {cb, arg};
	int ret = pk_sites_match(glob, each_one, &c);

	return ret < 0 ? ret : 0;
}

static const struct pki_site_src default_src = {sym_lookup, sym_each};
static const struct pki_site_src *site_src = &default_src;

static pki_poke_fn poke_fn = pki_text_poke_batch;

void pki_hook_set_site_src(const struct pki_site_src *src)
{
	site_src = src ? src : &default_src;
}

void pki_hook_set_poke(pki_poke_fn fn)
{
	poke_fn = fn ? fn : pki_text_poke_batch;
}

static size_t hash_ip(unsigned long ip, size_t mask)
{
	return (size_t)((ip * 0x9e3779b97f4a7c15ul) >> 17) & mask;
}

static struct site *__site_find(unsigned long ip)
{
	if (!sites.cap)
		return NULL;
	for (size_t i = hash_ip(ip, sites.cap - 1);; i = (i + 1) & (sites.cap - 1)) {
		if (!sites.slot[i])
			return NULL;
		if (sites.slot[i]->ip == ip)
			return sites.slot[i];
	}
}

static int __sitemap_insert(struct site *s)
{
	if (2 * (sites.n + 1) > sites.cap) {
		size_t cap = sites.cap ? 2 * sites.cap : 64;
		struct site **slot = calloc(cap, sizeof(*slot));

		if (!slot)
			return -ENOMEM;
		for (size_t j = 0; j < sites.cap; j++) {
			struct site *o = sites.slot[j];
			size_t i;

			if (!o)
				continue;
			for (i = hash_ip(o->ip, cap - 1); slot[i]; i = (i + 1) & (cap - 1))
				;
			slot[i] = o;
		}
		free(sites.slot);
		sites.slot = slot;
		sites.cap = cap;
	}
	size_t i;

	for (i = hash_ip(s->ip, sites.cap - 1); sites.slot[i]; i = (i + 1) & (sites.cap - 1))
		;
	sites.slot[i] = s;
	sites.n++;
	return 0;
}

/* The site record of @ip, made on first use after checking it is a site. */
static int __site_get(unsigned long addr, struct site **out)
{
	struct site *s = __site_find(addr);
	unsigned long ip;
	int err;

	if (s)
		goto found;
	err = site_src->lookup(addr, &ip);
	if (err)
		return err;
	s = __site_find(ip);
	if (s)
		goto found;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->ip = ip;
	memcpy(s->cur, (const void *)ip, PKI_SITE_LEN);
	switch (pki_insn_classify(s->cur)) {
	case PKI_INSN_NOP5:
	case PKI_INSN_NOP1X5:
		break;
	default: /* someone else's code already there */
		free(s);
		return -EBUSY;
	}
	err = __sitemap_insert(s);
	if (err) {
		free(s);
		return err;
	}
found:
	*out = s;
	return 0;
}

static int vec_reserve(struct ops_vec *v, unsigned int n)
{
	if (n <= v->cap)
		return 0;
	unsigned int cap = v->cap ? 2 * v->cap : 4;

	while (cap < n)
		cap *= 2;
	struct pk_ops **nv = realloc(v->v, cap * sizeof(*nv));

	if (!nv)
		return -ENOMEM;
	v->v = nv;
	v->cap = cap;
	return 0;
}

static int vec_copy(struct ops_vec *dst, const struct ops_vec *src)
{
	int err = vec_reserve(dst, src->n);

	if (err)
		return err;
	if (src->n)
		memcpy(dst->v, src->v, src->n * sizeof(*src->v));
	dst->n = src->n;
	return 0;
}

#define GROW(arr, want)                                                                            \
	({                                                                                         \
		int __e = 0;                                                                       \
		if ((want) > (arr).cap) {                                                          \
			size_t __c = (arr).cap ? 2 * (arr).cap : 16;                               \
			while (__c < (want))                                                       \
				__c *= 2;                                                          \
			void *__p = realloc((arr).v, __c * sizeof(*(arr).v));                      \
			if (__p) {                                                                 \
				(arr).v = __p;                                                     \
				(arr).cap = __c;                                                   \
			} else {                                                                   \
				__e = -ENOMEM;                                                     \
			}                                                                          \
		}                                                                                  \
		__e;                                                                               \
	})

/*
 * Make @s ready to be changed in the open transaction: undo copy taken,
 * on the dirty list, room for one more ops.  Nothing staged yet, so a
 * failure here leaves the transaction as it was.
 */
static int __site_prepare(struct site *s, unsigned int more_ops)
{
	int err;

	if (!s->dirty) {
		err = GROW(dirty, dirty.n + 1);
		if (!err)
			err = vec_copy(&s->saved_ops, &s->ops);
		if (err)
			return err;
	}
	err = vec_reserve(&s->ops, s->ops.n + more_ops);
	if (err)
		return err;
	if (!s->dirty) {
		s->saved_direct = s->direct;
		s->dirty = true;
		dirty.v[dirty.n++] = s;
	}
	return 0;
}

/* ---- runtime table: what readers see ---- */

struct rt_ent {
	unsigned long ip;
	unsigned long target; /* what the site calls (committed) */
	unsigned long direct;
	struct pk_ops *const *ops;
	unsigned long nops;
};

struct rt {
	size_t mask;
	struct rt_ent *ent;
	struct pk_ops *pool[];
};

static struct rt *rt_cur; /* published with release, read with acquire */

static const struct rt_ent *rt_find(const struct rt *t, unsigned long ip)
{
	if (!t)
		return NULL;
	for (size_t i = hash_ip(ip, t->mask);; i = (i + 1) & t->mask) {
		if (!t->ent[i].ip)
			return NULL;
		if (t->ent[i].ip == ip)
			return &t->ent[i];
	}
}

/* Hot path: every ops of the site, then where to continue. */
unsigned long pki_hook_list_func(unsigned long ip, unsigned long parent_ip, void *regs,
				 int recursing)
{
	const struct rt *t = __atomic_load_n(&rt_cur, __ATOMIC_ACQUIRE);
	const struct rt_ent *e = rt_find(t, ip);

	if (__builtin_expect(!e, 0))
		return 0;
	if (!recursing)
		for (unsigned long i = 0; i < e->nops; i++)
			e->ops[i]->func(ip, parent_ip, e->ops[i], regs);
	return e->direct;
}

unsigned long pki_hook_rt_target(unsigned long ip)
{
	const struct rt_ent *e = rt_find(__atomic_load_n(&rt_cur, __ATOMIC_ACQUIRE), ip);

	return e ? e->target : 0;
}

unsigned long pki_hook_rt_direct(unsigned long ip)
{
	const struct rt_ent *e = rt_find(__atomic_load_n(&rt_cur, __ATOMIC_ACQUIRE), ip);

	return e ? e->direct : 0;
}

/* Table of every site with a new target, from the staged state. */
static struct rt *__rt_build(void)
{
	size_t n = 0, nops = 0, cap = 4;
	struct rt *t;

	for (size_t i = 0; i < sites.cap; i++) {
		struct site *s = sites.slot[i];

		if (s && s->new_target) {
			n++;
			nops += s->ops.n;
		}
	}
	while (cap < 2 * n)
		cap *= 2;
	t = calloc(1, sizeof(*t) + nops * sizeof(t->pool[0]) + cap * sizeof(struct rt_ent));
	if (!t)
		return NULL;
	t->mask = cap - 1;
	t->ent = (struct rt_ent *)&t->pool[nops];
	nops = 0;
	for (size_t i = 0; i < sites.cap; i++) {
		struct site *s = sites.slot[i];
		size_t j;

		if (!s || !s->new_target)
			continue;
		for (j = hash_ip(s->ip, t->mask); t->ent[j].ip; j = (j + 1) & t->mask)
			;
		if (s->ops.n)
			memcpy(&t->pool[nops], s->ops.v, s->ops.n * sizeof(s->ops.v[0]));
		t->ent[j] =
		    (struct rt_ent){s->ip, s->new_target, s->direct, &t->pool[nops], s->ops.n};
		nops += s->ops.n;
	}
	return t;
}

static void rt_free(void *t)
{
	free(t);
}

unsigned long pki_hook_site_target(unsigned long ip)
{
	struct site *s;
	unsigned long t;

	pthread_mutex_lock(&hook_lock);
	s = __site_find(ip);
	t = s ? s->target : 0;
	hook_unlock();
	return t;
}

/* ---- trampolines ---- */

static bool slot_reaches(const struct pki_tslot *t, unsigned long ip)
{
	return t->x && pki_tmem_reaches(ip, t->x) && pki_tmem_reaches(ip, t->x + PKI_TMEM_SLOT);
}

/* @p's trampoline reaching @ip, made on demand (kept until unregister). */
static int __ops_tramp(struct ops_priv *p, unsigned long ip, unsigned long *out)
{
	struct pki_tslot t;
	int err;

	for (size_t i = 0; i < p->ntramps; i++)
		if (slot_reaches(&p->tramps[i], ip)) {
			*out = p->tramps[i].x;
			return 0;
		}
	struct pki_tslot *nt = realloc(p->tramps, (p->ntramps + 1) * sizeof(*nt));

	if (!nt)
		return -ENOMEM;
	p->tramps = nt;
	err = pki_tmem_alloc(ip, &t);
	if (err)
		return err;
	err =
	    pki_tmem_emit(p->ops->flags & PK_OPS_F_NOVEC ? PKI_TRAMP_OPS_NV : PKI_TRAMP_OPS, &t,
			  (unsigned long[]){(unsigned long)p->ops, (unsigned long)p->ops->func}, 2);
	if (err) {
		pki_tmem_free(&t);
		return err;
	}
	p->tramps[p->ntramps++] = t;
	*out = t.x;
	return 0;
}

static void slot_free(void *slot)
{
	pki_tmem_free(slot);
	free(slot);
}

/* Free @t after a grace period (a thread may still be in it). */
static void slot_retire(const struct pki_tslot *t)
{
	struct pki_tslot *c = malloc(sizeof(*c));

	if (!c) { /* rare: pay the grace period now */
		pki_gp_synchronize();
		pki_tmem_free(t);
		return;
	}
	*c = *t;
	pki_gp_defer(slot_free, c);
}

/* Decide what @s calls in the staged state; may make trampolines. */
static int __site_decide(struct site *s)
{
	unsigned long list;
	int err;

	s->new_stub = s->stub;
	if (!s->ops.n && !s->direct) {
		s->new_target = 0;
		return 0;
	}
	if (s->ops.n == 1 && !s->direct)
		return __ops_tramp(s->ops.v[0]->private, s->ip, &s->new_target);
	if (!s->ops.n) {
		if (pki_tmem_reaches(s->ip, s->direct)) {
			s->new_target = s->direct;
			return 0;
		}
		/* Far: a stub near the site; reuse the current one if it fits. */
		if (s->stub.x && s->target == s->stub.x &&
		    *(unsigned long *)((char *)s->stub.w + pki_tramp_size(PKI_TRAMP_STUB) - 8) ==
			s->direct) {
			s->new_target = s->stub.x;
			return 0;
		}
		err = pki_tmem_alloc(s->ip, &s->new_stub);
		if (err)
			return err;
		pki_tmem_emit(PKI_TRAMP_STUB, &s->new_stub, &s->direct, 1);
		s->new_target = s->new_stub.x;
		return 0;
	}
	err = pki_tmem_list_near(s->ip, &list);
	if (err)
		return err;
	s->new_target = list;
	return 0;
}

/* ---- ops_priv lifetime ---- */

/*
 * Forget @p: out of all_ops, and ops->private back to the committed record
 * it replaced in this transaction, if any (see ops_priv.prev).
 */
static void __ops_priv_free(struct ops_priv *p)
{
	for (size_t i = 0; i < all_ops.n; i++)
		if (all_ops.v[i] == p) {
			all_ops.v[i] = all_ops.v[--all_ops.n];
			break;
		}
	if (p->ops->private == p)
		p->ops->private = p->prev;
	for (size_t i = 0; i < all_ops.n; i++)
		if (all_ops.v[i]->prev == p)
			all_ops.v[i]->prev = NULL;
	free(p->tramps);
	free(p->ips);
	free(p);
}

/* ---- transactions ---- */

/* Take the registry unless this thread's transaction holds it. */
static void notify_init(void);
static void __apply_pending(void);
static pthread_once_t notify_once;
/* Loaded/unloaded objects queued (written under pend_lock; read as a hint). */
static bool pend_any;

/*
 * Take hook_lock for one call, once no other thread's transaction is open.
 * Loaded/unloaded objects queued meanwhile are applied first, outside any
 * transaction (inside one: at its end).
 */
static int hook_enter(void)
{
	if (pki_tramp_in_hook())
		return -EDEADLK;
	pthread_once(&notify_once, notify_init);
	pthread_mutex_lock(&hook_lock);
	while (txn_open && !txn_mine)
		pthread_cond_wait(&txn_cv, &hook_lock);
	if (hook_broken) {
		pthread_mutex_unlock(&hook_lock);
		return -ENOTRECOVERABLE;
	}
	if (!txn_open && __atomic_load_n(&pend_any, __ATOMIC_RELAXED))
		__apply_pending(); /* before anything uses the sites */
	return 0;
}

/* Drop staged changes of every dirty site and ops. */
static void __txn_undo(void)
{
	for (size_t i = 0; i < dirty.n; i++) {
		struct site *s = dirty.v[i];

		vec_copy(&s->ops, &s->saved_ops); /* fits: ops.cap >= saved.n */
		s->direct = s->saved_direct;
		s->dirty = false;
	}
	dirty.n = 0;
	/*
	 * Each ops_priv is in `changes` at most once (see __ops_unregister),
	 * so each is freed at most once.  Newest first: a registration made
	 * after an unregister of the same ops gives ops->private back to the
	 * committed record before that record is restored.
	 */
	for (size_t i = changes.n; i-- > 0;) {
		struct ops_priv *p = changes.v[i].p;

		p->staged = p->registered;
		if (!p->registered) {
			/* A failed batch may have run them (mid-batch emulation). */
			for (size_t j = 0; j < p->ntramps; j++)
				slot_retire(&p->tramps[j]);
			__ops_priv_free(p);
		}
	}
	changes.n = 0;
}

/*
 * Apply the staged state: decide every dirty site, publish the runtime
 * table, poke the text in one batch.  On failure everything is as before.
 */
static int __txn_commit(void)
{
	struct pki_poke *pokes = NULL;
	struct rt *old = rt_cur, *t;
	size_t np = 0, decided = 0;
	bool unreg = false;
	int err = 0, gp_err = 0;

	if (!dirty.n && !changes.n && !rt_stale)
		return 0;
	/* Sites not dirty keep their target. */
	for (size_t i = 0; i < sites.cap; i++)
		if (sites.slot[i] && !sites.slot[i]->dirty)
			sites.slot[i]->new_target = sites.slot[i]->target;
	pokes = calloc(dirty.n ? dirty.n : 1, sizeof(*pokes));
	if (!pokes) {
		err = -ENOMEM;
		goto undo;
	}
	for (size_t i = 0; i < dirty.n; i++) {
		struct site *s = dirty.v[i];
		uint8_t b[PKI_SITE_LEN];

		err = __site_decide(s);
		if (err) {
			pki_warn("hooks: site %#lx: no trampoline: %s\n", s->ip, pki_errstr(err));
			goto free_stubs;
		}
		decided = i + 1;
		/*
		 * Off bytes: as found until the site is first attached, then
		 * always one nop5.  A gcc sled (90 x5) is thus converted (with the
		 * patch layer's sled kick) once; later cycles go nop5 <-> call,
		 * which need no kick.  s->cur tracks what is in the text, and is
		 * what the patch layer verifies.
		 */
		if (s->new_target)
			pki_insn_call(b, s->ip, s->new_target);
		else if (s->target)
			memcpy(b, pki_nop5, PKI_SITE_LEN);
		else
			memcpy(b, s->cur, PKI_SITE_LEN);
		if (memcmp(b, s->cur, PKI_SITE_LEN)) {
			pokes[np].addr = s->ip;
			memcpy(pokes[np].old, s->cur, PKI_SITE_LEN);
			memcpy(pokes[np].new, b, PKI_SITE_LEN);
			np++;
		}
	}
	t = __rt_build();
	if (!t) {
		err = -ENOMEM;
		goto free_stubs;
	}
	/* Publish first: see the file comment. */
	__atomic_store_n(&rt_cur, t, __ATOMIC_RELEASE);
	rt_stale = false;
	if (np) {
		err = poke_fn(pokes, np);
		atfork_after_batch(); /* after the patch layer's handlers: see fork */
		if (err) {
			pki_warn("hooks: batch of %zu sites: %s\n", np, pki_errstr(err));
			__atomic_store_n(&rt_cur, old, __ATOMIC_RELEASE);
			pki_gp_defer(rt_free, t);
			goto free_stubs;
		}
	}
	for (size_t i = 0; i < np; i++)
		memcpy(__site_find(pokes[i].addr)->cur, pokes[i].new, PKI_SITE_LEN);
	for (size_t i = 0; i < dirty.n; i++) {
		struct site *s = dirty.v[i];

		if (s->stub.x && s->new_target != s->stub.x)
			slot_retire(&s->stub);
		s->stub = s->new_stub.x && s->new_target == s->new_stub.x ? s->new_stub
									  : (struct pki_tslot){0};
		s->new_stub = (struct pki_tslot){0};
		s->target = s->new_target;
		s->dirty = false;
	}
	dirty.n = 0;
	if (old)
		pki_gp_defer(rt_free, old);
	for (size_t i = 0; i < changes.n; i++) {
		struct ops_priv *p = changes.v[i].p;

		p->registered = p->staged;
		unreg |= !p->registered;
	}
	if (unreg) {
		/*
		 * The callers may free their ops once we return 0.  A grace
		 * period that timed out (unreg_timeout_ns) leaves the ops off
		 * its sites but possibly still in use: the trampolines go after
		 * a later grace period, and the caller keeps its ops.
		 */
		gp_err = pki_gp_synchronize_for(unreg_timeout_ns);
		for (size_t i = 0; i < changes.n; i++) {
			struct ops_priv *p = changes.v[i].p;

			if (p->registered)
				continue;
			for (size_t j = 0; j < p->ntramps; j++)
				if (gp_err)
					slot_retire(&p->tramps[j]);
				else
					pki_tmem_free(&p->tramps[j]);
			__ops_priv_free(p);
		}
	}
	changes.n = 0;
	free(pokes);
	return gp_err;

free_stubs:
	/* New stubs were reachable only through bytes that never stuck. */
	for (size_t i = 0; i < decided; i++) {
		struct site *s = dirty.v[i];

		if (s->new_stub.x && s->new_stub.x != s->stub.x)
			slot_retire(&s->new_stub);
		s->new_stub = (struct pki_tslot){0};
	}
undo:
	free(pokes);
	__txn_undo();
	return err;
}

/* End a public call: commit it unless inside a transaction. */
static int hook_leave(int err)
{
	if (!txn_mine) {
		if (!err)
			err = __txn_commit();
		else
			__txn_undo();
	}
	hook_unlock();
	return err;
}

int pk_txn_begin(void)
{
	int err;

	if (txn_mine)
		return pki_tramp_in_hook() ? -EDEADLK : -EBUSY;
	err = hook_enter();
	if (err)
		return err;
	txn_open = txn_mine = true;
	hook_unlock();
	return 0;
}

/* End this thread's transaction (hook_lock held): let the others in. */
static void __txn_end(void)
{
	txn_open = txn_mine = false;
	pthread_cond_broadcast(&txn_cv);
}

int pk_txn_commit(void)
{
	int err = -ENOTRECOVERABLE;

	if (!txn_mine)
		return -EINVAL;
	if (pki_tramp_in_hook())
		return -EDEADLK;
	pthread_mutex_lock(&hook_lock);
	if (!hook_broken)
		err = __txn_commit();
	__txn_end();
	hook_unlock();
	return err;
}

int pk_txn_abort(void)
{
	if (!txn_mine)
		return -EINVAL;
	if (pki_tramp_in_hook())
		return -EDEADLK;
	pthread_mutex_lock(&hook_lock);
	if (!hook_broken)
		__txn_undo();
	__txn_end();
	hook_unlock();
	return 0;
}

/* ---- ops ---- */

struct collect {
	unsigned long *ips;
	size_t n, cap;
};

/* Duplicates are dropped by __ops_register() (collect_unique). */
static int collect_ip(unsigned long ip, void *arg)
{
	struct collect *c = arg;

	if (c->n == c->cap) {
		size_t cap = c->cap ? 2 * c->cap : 16;
		unsigned long *n = realloc(c->ips, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		c->ips = n;
		c->cap = cap;
	}
	c->ips[c->n++] = ip;
	return 0;
}

static int cmp_ulong(const void *a, const void *b)
{
	unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;

	return x < y ? -1 : x > y;
}

/* Sort and drop duplicates: O(n log n), a filter may name every site. */
static void collect_unique(struct collect *c)
{
	size_t n = 0;

	if (c->n < 2)
		return;
	qsort(c->ips, c->n, sizeof(c->ips[0]), cmp_ulong);
	for (size_t i = 0; i < c->n; i++)
		if (!n || c->ips[i] != c->ips[n - 1])
			c->ips[n++] = c->ips[i];
	c->n = n;
}

static int resolve_filter(const struct pk_ops_filter *f, struct collect *c)
{
	int err = 0;

	if (!f->nips && !f->nglobs)
		return site_src->each(NULL, collect_ip, c);
	for (size_t i = 0; i < f->nips && !err; i++)
		err = collect_ip(f->ips[i], c);
	for (size_t i = 0; i < f->nglobs && !err; i++) {
		size_t before = c->n;

		err = site_src->each(f->globs[i], collect_ip, c);
		if (!err && c->n == before)
			err = -ENOENT;
	}
	return err;
}

static int __ops_register(struct pk_ops *ops)
{
	struct collect c = {0};
	struct ops_priv *p, *prev;
	struct site **ss;
	int err;

	if (!ops || !ops->func || (ops->flags & ~PK_OPS_F_NOVEC))
		return -EINVAL;
	/* Registered, unless its unregister is staged in this transaction. */
	prev = ops->private;
	if (prev && (prev->staged || !prev->registered))
		return -EBUSY;
	err = resolve_filter(&ops->filter, &c);
	if (err)
		goto free_ips;
	p = calloc(1, sizeof(*p));
	ss = calloc(c.n ? c.n : 1, sizeof(*ss));
	if (!p || !ss || GROW(changes, changes.n + 1) || GROW(all_ops, all_ops.n + 1)) {
		err = -ENOMEM;
		goto free_p;
	}
	for (size_t i = 0; i < c.n && !err; i++) {
		err = __site_get(c.ips[i], &ss[i]);
		if (!err)
			c.ips[i] = ss[i]->ip; /* a function's address -> its site */
	}
	if (err)
		goto free_p;
	collect_unique(&c);
	for (size_t i = 0; i < c.n; i++)
		ss[i] = __site_find(c.ips[i]);
	for (size_t i = 0; i < c.n && !err; i++)
		err = __site_prepare(ss[i], 1);
	if (err)
		goto free_p;
	/* Nothing fails from here. */
	*p = (struct ops_priv){.ops = ops,
			       .ips = c.ips,
			       .nips = c.n,
			       .staged = true,
			       .follows = !ops->filter.nips || ops->filter.nglobs,
			       .prev = prev};
	ops->private = p;
	all_ops.v[all_ops.n++] = p;
	for (size_t i = 0; i < c.n; i++)
		ss[i]->ops.v[ss[i]->ops.n++] = ops;
	changes.v[changes.n++] = (struct ops_change){p, true};
	free(ss);
	return 0;

free_p:
	free(ss);
	free(p);
free_ips:
	free(c.ips);
	return err;
}

int pk_ops_register(struct pk_ops *ops)
{
	int err = hook_enter();

	if (err)
		return err;
	return hook_leave(__ops_register(ops));
}

static int __ops_unregister(struct pk_ops *ops)
{
	struct ops_priv *p = ops ? ops->private : NULL;
	int err;

	if (!p || !p->staged)
		return -ENOENT;
	err = p->registered ? GROW(changes, changes.n + 1) : 0;
	for (size_t i = 0; i < p->nips && !err; i++)
		err = __site_prepare(__site_find(p->ips[i]), 0);
	if (err)
		return err;
	for (size_t i = 0; i < p->nips; i++) {
		struct ops_vec *v = &__site_find(p->ips[i])->ops;

		for (unsigned int j = 0; j < v->n; j++)
			if (v->v[j] == ops) {
				memmove(&v->v[j], &v->v[j + 1], (v->n - j - 1) * sizeof(v->v[0]));
				v->n--;
				break;
			}
	}
	p->staged = false;
	if (p->registered) {
		changes.v[changes.n++] = (struct ops_change){p, false};
		return 0;
	}
	/*
	 * Registered in this same transaction: drop its change and the record
	 * now (it has no trampoline yet: those are made at commit), so the net
	 * effect is nothing, and ops->private is what it was at begin.
	 */
	for (size_t i = 0; i < changes.n; i++)
		if (changes.v[i].p == p) {
			memmove(&changes.v[i], &changes.v[i + 1],
				(changes.n - i - 1) * sizeof(changes.v[0]));
			changes.n--;
			break;
		}
	__ops_priv_free(p);
	return 0;
}

int pk_ops_unregister(struct pk_ops *ops)
{
	int err = hook_enter();

	if (err)
		return err;
	return hook_leave(__ops_unregister(ops));
}

/* ---- objects loaded and unloaded (dlopen / dlclose) ---- */

/*
 * The sym layer tells us about every object that joins or leaves its table
 * (pki_sites_set_notify), from the thread running pk_sites_refresh(), under
 * its refresh mutex.  Lock order: hook_lock, then the refresh mutex (a
 * registration may build the site table, or refresh it, under hook_lock);
 * so the notifier never waits for hook_lock.  It queues the event under
 * pend_lock (a leaf lock) and then only TRIES hook_lock: on success it
 * applies the queue itself; otherwise the holder applies it when it lets go
 * of the lock (hook_unlock checks the queue after unlocking, and an event
 * queued before a failed trylock is seen by that check).  Inside the
 * refreshing thread's own transaction the queue waits for its end.
 *
 * Applying: ranges of unloaded objects first, then, if anything was loaded,
 * every ops that follows (globs or empty filter) resolves its filter again
 * and takes the sites it does not have yet; one commit for all of it.
 */
struct range {
	unsigned long lo, hi;
};

static pthread_mutex_t pend_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	struct range *v;
	size_t n, cap;
} pend_gone;
static bool pend_added, pend_lost;

/*
 * Forget every site in @r: their text is gone, so never poke it.  The sites
 * leave the map, the ops' lists and the direct hash; the next commit
 * publishes a table without them (readers of the old one: freed after a
 * grace period, like any table).  Far stubs may still be executed by a
 * thread that entered before the unmap: retired after a grace period.  The
 * struct site itself is writer-side state only (hook_lock): freed now.
 */
static void __forget(const struct range *r, size_t nr)
{
	struct site **keep;
	size_t cap = sites.cap, n = 0;

	if (!cap)
		return;
	keep = calloc(cap, sizeof(*keep));
	if (!keep) {
		pki_warn("hooks: cannot forget unloaded sites: %s\n", pki_errstr(ENOMEM));
		return;
	}
	for (size_t i = 0; i < cap; i++) {
		struct site *st = sites.slot[i];
		bool gone = false;

		for (size_t k = 0; st && k < nr && !gone; k++)
			gone = st->ip >= r[k].lo && st->ip < r[k].hi;
		if (gone) { /* an object loaded since at the same place: keep a record that fits */
			unsigned long ip;

			gone = site_src->lookup(st->ip, &ip) || ip != st->ip ||
			       memcmp((const void *)ip, st->cur, PKI_SITE_LEN);
		}
		if (!gone) {
			if (st)
				keep[n++] = st;
			continue;
		}
		for (size_t j = 0; j < all_ops.n; j++) {
			struct ops_priv *p = all_ops.v[j];

			for (size_t k = 0; k < p->nips; k++)
				if (p->ips[k] == st->ip) {
					p->ips[k] = p->ips[--p->nips];
					break;
				}
		}
		if (st->stub.x)
			slot_retire(&st->stub);
		free(st->ops.v);
		free(st->saved_ops.v);
		free(st);
		rt_stale = true;
	}
	memset(sites.slot, 0, cap * sizeof(*sites.slot));
	sites.n = 0;
	for (size_t i = 0; i < n; i++)
		__sitemap_insert(keep[i]); /* fits: fewer than before */
	free(keep);
}

/* Give every following ops the sites of objects loaded since it resolved. */
static void __follow(void)
{
	for (size_t j = 0; j < all_ops.n; j++) {
		struct ops_priv *p = all_ops.v[j];
		const struct pk_ops_filter *f = &p->ops->filter;
		struct collect c = {0};
		int err = 0;

		if (!p->follows || !p->registered || !p->staged)
			continue;
		if (!f->nglobs)
			err = site_src->each(NULL, collect_ip, &c);
		for (size_t i = 0; i < f->nglobs && !err; i++)
			err = site_src->each(f->globs[i], collect_ip, &c);
		for (size_t i = 0; i < c.n && !err; i++) {
			struct site *st = NULL;
			bool have = false;
			unsigned long *ips;

			for (size_t k = 0; k < p->nips && !have; k++)
				have = p->ips[k] == c.ips[i];
			if (have)
				continue;
			err = __site_get(c.ips[i], &st);
			if (err == -EBUSY) { /* someone else's code there: not ours */
				err = 0;
				continue;
			}
			ips = err ? NULL : realloc(p->ips, (p->nips + 1) * sizeof(*ips));
			if (!err && !ips)
				err = -ENOMEM;
			if (!err)
				err = __site_prepare(st, 1);
			if (err)
				break;
			p->ips = ips;
			p->ips[p->nips++] = c.ips[i];
			st->ops.v[st->ops.n++] = p->ops;
		}
		if (err)
			pki_warn("hooks: ops %p: sites of a new object: %s\n", (void *)p->ops,
				 pki_errstr(err));
		free(c.ips);
	}
}

/* Apply the queue.  hook_lock held, no transaction open. */
static void __apply_pending(void)
{
	struct range *gone;
	size_t ngone;
	bool added, lost;
	int err;

	pthread_mutex_lock(&pend_lock);
	gone = pend_gone.v;
	ngone = pend_gone.n;
	added = pend_added;
	lost = pend_lost;
	pend_gone.v = NULL;
	pend_gone.n = pend_gone.cap = 0;
	pend_added = pend_lost = false;
	__atomic_store_n(&pend_any, false, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&pend_lock);
	if (lost)
		pki_warn("hooks: lost track of an unloaded object (its sites stay known): %s\n",
			 pki_errstr(ENOMEM));
	if (ngone)
		__forget(gone, ngone);
	free(gone);
	if (added)
		__follow();
	err = __txn_commit();
	if (err)
		pki_warn("hooks: applying loaded/unloaded objects: %s\n", pki_errstr(err));
}

static void sites_changed(const struct pki_sym_object *obj, bool added)
{
	pthread_mutex_lock(&pend_lock);
	if (added) {
		pend_added = true;
	} else if (obj->nsites) {
		if (!GROW(pend_gone, pend_gone.n + 1))
			pend_gone.v[pend_gone.n++] = (struct range){obj->lo, obj->hi};
		else
			pend_lost = true;
	}
	__atomic_store_n(&pend_any, true, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&pend_lock);
	if (!pthread_mutex_trylock(&hook_lock)) {
		if (!txn_open && !hook_broken) /* else: applied when the transaction ends */
			__apply_pending();
		hook_unlock();
	}
}

static void hook_unlock(void)
{
	for (;;) {
		pthread_mutex_unlock(&hook_lock);
		pthread_mutex_lock(&pend_lock);
		bool any = pend_any;

		pthread_mutex_unlock(&pend_lock);
		if (!any || pthread_mutex_trylock(&hook_lock))
			return;
		if (txn_open || hook_broken) { /* applied when the transaction ends */
			pthread_mutex_unlock(&hook_lock);
			return;
		}
		__apply_pending();
	}
}

static pthread_once_t notify_once = PTHREAD_ONCE_INIT;

static void notify_init(void)
{
	pki_sites_set_notify(sites_changed);
	pki_hook_atfork_init();
}

/* ---- fork ---- */

/*
 * fork() while other threads use the registry.  In the child only the
 * forking thread exists, so a lock another thread held stays held forever,
 * and a transaction another thread had open never ends.  Our atfork
 * handlers take, before fork(), every lock of the layer in its order:
 * hook_lock (so no call is half done: the registry is consistent), then
 * the site table's refresh lock (sym/sites.c: a refresh is never half done
 * either), pend_lock, the grace-period queue's lock (gp.c) and tmem_lock (whose
 * handler also snapshots trampoline memory for the child, tmem.c).  Each is
 * held only for one call or less, and a transaction does not hold hook_lock
 * between its calls, so fork() waits at most for one call in flight.  Calls
 * can still be long (a grace period waits for a thread that blocks our
 * signal; a patch batch waits up to its own timeout), so the wait for
 * hook_lock is bounded (FORK_WAIT_S): past it fork() goes on without it, and
 * the child refuses every call with -ENOTRECOVERABLE (its registry may be
 * half changed; the hooks it inherited keep working).  In the child:
 *  - a transaction open in another thread is dropped: the child's registry
 *    is the committed state (the staged state was consistent: no call in
 *    flight).  The forking thread's own transaction stays open, its own.
 *  - the locks and condition variables are made anew (their waiters are gone).
 *
 * Order against the patch layer: its atfork handlers (poke.c) hold the patch
 * lock across fork(), and a call holding hook_lock may be about to take it.
 * Prepare handlers run in reverse order of registration, so ours must be
 * registered after the patch layer's, or the forking thread would hold the
 * patch lock while waiting for hook_lock.  The patch layer registers at its
 * first batch: we register once at first use (for forks before any batch)
 * and once more after the first batch; fork_depth makes the second set of
 * calls a no-op (glibc serialises fork()s, handlers included).
 */
#define FORK_WAIT_S 2

static unsigned int fork_depth; /* prepare calls in this fork() */
static bool fork_held;		/* prepare got hook_lock */

static void hook_fork_prepare(void)
{
	struct timespec until;

	if (fork_depth++)
		return;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += FORK_WAIT_S;
	fork_held = !pthread_mutex_clocklock(&hook_lock, CLOCK_MONOTONIC, &until);
	if (!fork_held)
		pki_warn("hooks: fork() while a hook call of another thread ran for over %d s: "
			 "the child's hook calls will fail: %s\n",
			 FORK_WAIT_S, pki_errstr(ENOTRECOVERABLE));
	pki_sites_fork_prepare();
	pthread_mutex_lock(&pend_lock);
	pki_gp_fork_prepare();
	pki_tmem_fork_prepare();
}

static void hook_fork_parent(void)
{
	if (!fork_depth)
		return;
	fork_depth = 0;
	pki_tmem_fork_parent();
	pki_gp_fork_parent();
	pthread_mutex_unlock(&pend_lock);
	pki_sites_fork_parent();
	if (fork_held)
		pthread_mutex_unlock(&hook_lock);
}

static void hook_fork_child(void)
{
	if (!fork_depth)
		return;
	fork_depth = 0;
	pki_tmem_fork_child(); /* first: before anything else runs a trampoline */
	pki_gp_fork_child();
	pthread_mutex_unlock(&pend_lock);
	pki_sites_fork_child();
	pthread_mutex_init(&hook_lock, NULL); /* held by us, or by a thread that is gone */
	pthread_cond_init(&txn_cv, NULL);
	if (!fork_held) {
		hook_broken = true;
		return;
	}
	if (txn_open && !txn_mine) {
		__txn_undo();
		txn_open = false;
	}
}

static void atfork_register(void)
{
	int err = pthread_atfork(hook_fork_prepare, hook_fork_parent, hook_fork_child);

	if (err)
		pki_warn("hooks: cannot register fork handlers: %s\n", pki_errstr(err));
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT, atfork_again = PTHREAD_ONCE_INIT;

void pki_hook_atfork_init(void)
{
	pthread_once(&atfork_once, atfork_register);
}

static void atfork_after_batch(void)
{
	pthread_once(&atfork_again, atfork_register);
}

/* ---- direct ---- */

enum direct_op { DIRECT_ADD, DIRECT_DEL, DIRECT_MOD };

static int cmp_ptr(const void *a, const void *b)
{
	const struct site *const *pa = a, *const *pb = b;
	uintptr_t x = (uintptr_t)*pa, y = (uintptr_t)*pb;

	return x < y ? -1 : x > y;
}

/* -EINVAL if a site appears twice in @ss (sorting a copy: batches may be big). */
static int sites_unique(struct site *const *ss, size_t n)
{
	struct site **v;
	int err = 0;

	if (n < 2)
		return 0;
	v = malloc(n * sizeof(*v));
	if (!v)
		return -ENOMEM;
	memcpy(v, ss, n * sizeof(*v));
	qsort(v, n, sizeof(*v), cmp_ptr);
	for (size_t i = 1; i < n && !err; i++)
		if (v[i] == v[i - 1])
			err = -EINVAL;
	free(v);
	return err;
}

static int __direct_stage(enum direct_op op, const unsigned long *ips,
			  const struct pk_direct_entry *e, size_t n)
{
	struct site **ss = calloc(n ? n : 1, sizeof(*ss));
	int err = 0;

	if (!ss)
		return -ENOMEM;
	for (size_t i = 0; i < n && !err; i++) {
		unsigned long ip = e ? e[i].ip : ips[i];

		if (e && !e[i].addr) {
			err = -EINVAL;
			break;
		}
		err = __site_get(ip, &ss[i]);
		if (err)
			break;
		if (op == DIRECT_ADD && ss[i]->direct)
			err = -EEXIST;
		else if (op != DIRECT_ADD && !ss[i]->direct)
			err = -ENOENT;
	}
	if (!err)
		err = sites_unique(ss, n);
	for (size_t i = 0; i < n && !err; i++)
		err = __site_prepare(ss[i], 0);
	if (!err)
		for (size_t i = 0; i < n; i++)
			ss[i]->direct = op == DIRECT_DEL ? 0 : e[i].addr;
	free(ss);
	return err;
}

int pk_direct_add(const struct pk_direct_entry *e, size_t n)
{
	int err = hook_enter();

	if (err)
		return err;
	return hook_leave(__direct_stage(DIRECT_ADD, NULL, e, n));
}

int pk_direct_del(const unsigned long *ips, size_t n)
{
	int err = hook_enter();

	if (err)
		return err;
	return hook_leave(__direct_stage(DIRECT_DEL, ips, NULL, n));
}

int pk_direct_mod(const struct pk_direct_entry *e, size_t n)
{
	int err = hook_enter();

	if (err)
		return err;
	return hook_leave(__direct_stage(DIRECT_MOD, NULL, e, n));
}

int pk_direct_sync(void)
{
	return pki_gp_synchronize();
}

/* ---- trampolines for C handlers ---- */

struct pk_tramp {
	struct pki_tslot slot;
};

static pthread_once_t list_once = PTHREAD_ONCE_INIT;

static void set_list_func(void)
{
	pki_tmem_set_list_func((unsigned long)pki_hook_list_func);
}

__attribute__((constructor)) static void hook_init(void)
{
	pthread_once(&list_once, set_list_func);
}

struct pk_tramp *pk_tramp_new(pk_tramp_fn handler, unsigned int flags)
{
	struct pk_tramp *t;
	int err;

	if (!handler || (flags & ~PK_TRAMP_F_NOVEC)) {
		errno = EINVAL;
		return NULL;
	}
	pki_hook_atfork_init(); /* its memory must be unshared at fork() too */
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	err = pki_tmem_alloc(0, &t->slot);
	if (err)
		goto free_t;
	err = pki_tmem_emit(flags & PK_TRAMP_F_NOVEC ? PKI_TRAMP_HANDLER_NV : PKI_TRAMP_HANDLER,
			    &t->slot, (unsigned long[]){(unsigned long)handler}, 1);
	if (err)
		goto free_slot;
	/* Callable at once, even before any patch batch synced the cores. */
	pki_tramp_sync_cores();
	return t;

free_slot:
	pki_tmem_free(&t->slot);
free_t:
	free(t);
	errno = -err;
	return NULL;
}

unsigned long pk_tramp_addr(const struct pk_tramp *t)
{
	return t->slot.x;
}

int pk_tramp_free(struct pk_tramp *t)
{
	int err;

	if (!t)
		return 0;
	err = hook_enter();
	if (err)
		return err;
	for (size_t i = 0; i < sites.cap; i++) {
		struct site *s = sites.slot[i];

		if (s && (s->direct == t->slot.x || (s->dirty && s->saved_direct == t->slot.x)))
			err = -EBUSY;
	}
	hook_unlock();
	if (err)
		return err;
	slot_retire(&t->slot);
	free(t);
	return 0;
}
