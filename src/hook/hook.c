// SPDX-License-Identifier: MIT
/*
 * The hook registry: sites, the ops on each, and ONE internal direct ops
 * owning the ip->addr hash of all direct entries (seed 003).  For each site
 * it decides what the 5 bytes call and what the site's entry E (tramp.S:
 * one per site, made at its first attach, never freed) jumps to:
 *
 *   ops  direct  site calls  E.target              E.user (after the ops)
 *   0    no      nothing     (X_RET)               -
 *   1    no      E           the ops' body         -
 *   0    yes     addr        - (user code within reach)
 *   0    yes     E           X_USER (far), or B    -
 *   >=2  no      E           the list dispatcher   X_RET
 *   >=1  yes     E           the list dispatcher   X_USER, or B
 *
 * X_USER jumps to E.direct, the direct address.  B: when the direct address
 * is a live pk_tramp's, the site goes through its own entry straight to the
 * handler body, counted, never through the pk_tramp's entry: a thread that
 * is on its way into a trampoline is then counted, and a freed pk_tramp
 * cannot be entered late (see pk_tramp below).
 *
 * Writers.  hook_lock serialises everything below, held for the length of
 * one public call.  A transaction is an ownership of the registry, not of
 * the lock: pk_txn_begin() marks it open and owned by the calling thread
 * (txn_open, txn_mine), other threads' calls wait on txn_cv until its
 * commit or abort; between calls the owner holds no lock.  So fork() only
 * waits for a call in flight, never for an open transaction (see "fork"
 * below).  Every public call stages its change on the sites (keeping an
 * undo copy of each site it touches first: the "dirty" list), and the commit
 * decides every dirty site, publishes their entry words, then hands all
 * pokes to the patch layer in ONE batch.  A commit costs O(dirty sites):
 * nothing is rebuilt whole.
 *
 * Readers (hot path) see only entry words, published per site
 * (pki_tmem_entry_set: ops array, direct, user, target, in that order), and the ops
 * array a list dispatcher finds in its entry: immutable, replaced whole per
 * change of the site, the old one freed after a grace period (gp.c).  The
 * words of a site whose text will call its entry are published BEFORE the
 * text is poked, so a thread entering through old or new bytes finds the
 * new state; those of a site whose text stops calling it, after (a thread
 * that entered through the old bytes then finds a way on that does the
 * same as the new bytes: X_USER to the direct address, or X_RET).
 *
 * Freeing.  pk_direct_del()/mod() retire ops arrays and bodies with
 * pki_gp_defer() (background, batched: no wait per call).
 * pk_ops_unregister() waits for one grace period, because the caller may
 * free the ops right after.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <probekit/hook.h>
#include <probekit/sites.h>

#include "arch/arch.h"
#include "base/grow.h"
#include "base/umap.h"
#include "hook/gp.h"
#include "hook/hook_int.h"
#include "base/log.h"
#include "hook/tmem.h"
#include "sym/sites.h"

/* ---- writer-side state, under hook_lock ---- */

struct ops_vec {
	struct pk_ops **v;
	unsigned int n, cap;
};

/* An ops array as a list dispatcher reads it from an entry: immutable. */
struct opsv {
	unsigned long n;
	struct pk_ops *v[];
};

struct site {
	unsigned long ip;
	uint8_t cur[PKI_SITE_LEN]; /* bytes in the text now */
	unsigned long call;	   /* what they call (0: nothing): ent.x or the direct addr */
	struct pki_tentry ent;	   /* the site's entry (ent.x 0: none yet), never freed */
	struct opsv *opsv;	   /* what ent.ops points to (kept until replaced) */
	/* staged state */
	struct ops_vec ops;
	unsigned long direct; /* the direct ops' hash: ip -> addr (0: none) */
	/* undo copy while dirty in the open transaction */
	bool dirty;
	struct ops_vec saved_ops;
	unsigned long saved_direct;
	/* commit scratch */
	unsigned long new_call;
	struct pki_tramp_entry new_ent, old_ent;
	struct opsv *new_opsv;
};

struct ops_priv {
	struct pk_ops *ops;
	unsigned long *ips; /* its sites */
	size_t nips, cap_ips;
	size_t nips_before;	/* before __follow(): what a failed commit goes back to */
	struct pki_tslot tramp; /* its body (tramp.x 0: none yet), any chunk */
	bool registered;	/* committed state */
	bool staged;		/* staged state */
	bool follows;		/* filter by globs or empty: takes sites of objects loaded later */
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

static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
/* The pk_tramp records (see pk_tramp below); taken under hook_lock, never the other way. */
static pthread_mutex_t tramp_lock = PTHREAD_MUTEX_INITIALIZER;
/* ip -> struct site (removed only by __forget(), which rebuilds it). */
static struct pki_umap sites = PKI_UMAP_INIT(struct site, ip);
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
	unsigned long lo, hi;
};

static int each_one(const struct pk_site *s, void *ctx)
{
	struct each_ctx *c = ctx;
	int err = c->cb(s->ip, c->arg);

	return err < 0 ? err : 0;
}

static int each_in_range(const struct pki_site *s, void *ctx)
{
	const struct each_ctx *c = ctx;

	if (s->ip < c->lo || s->ip >= c->hi)
		return 0;
	return c->cb(s->ip, c->arg);
}

static int sym_each(const char *glob, unsigned long lo, unsigned long hi,
		    int (*cb)(unsigned long, void *), void *arg)
{
	struct each_ctx c = {cb, arg, lo, hi};
	int ret;

	if (!lo && hi == ~0ul) { /* builds the table on first use */
		ret = pk_sites_match(glob, each_one, &c);
		return ret < 0 ? ret : 0;
	}
	pki_sites_read_lock();
	ret = pki_sites_match_in(glob, lo, hi, each_in_range, &c);
	pki_sites_read_unlock();
	return ret;
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

static struct site *__site_find(unsigned long ip)
{
	return pki_umap_find(&sites, ip);
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
	err = pki_umap_insert(&sites, s);
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

#define GROW(arr, want) PKI_GROW((arr).v, (arr).cap, (want))

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

/* ---- what readers see ---- */

/*
 * Hot path, from the list dispatcher (counted, tramp.S): every ops of the
 * site's current array, unless recursing.  @entry is the executable view of
 * the site's entry; the site is where its call returns to, minus 5.
 */
void pki_hook_list_func(const void *entry, unsigned long parent_ip, void *regs, int recursing)
{
	const struct pki_tramp_entry *e =
	    (const void *)((const char *)entry + PKI_TRAMP_ENTRY_DATA);
	const struct opsv *v = (const void *)__atomic_load_n(&e->ops, __ATOMIC_ACQUIRE);
	/* regs->sp is the function's entry sp: the site's call pushed ip + 5 below it. */
	unsigned long ip = ((const unsigned long *)((struct pk_regs *)regs)->sp)[-1] - 5;

	if (recursing || !v)
		return;
	for (unsigned long i = 0; i < v->n; i++)
		v->v[i]->func(ip, parent_ip, v->v[i], regs);
}

static void opsv_free(void *v)
{
	free(v);
}

unsigned long pki_hook_site_target(unsigned long ip)
{
	struct site *s;
	unsigned long t;

	pthread_mutex_lock(&hook_lock);
	s = __site_find(ip);
	t = s ? s->call : 0;
	hook_unlock();
	return t;
}

unsigned long pki_hook_site_entry_target(unsigned long ip)
{
	struct pki_tramp_entry e = {0};
	struct site *s;

	pthread_mutex_lock(&hook_lock);
	s = __site_find(ip);
	if (s && s->ent.x)
		pki_tmem_entry_get(&s->ent, &e);
	hook_unlock();
	return e.target;
}

unsigned long pki_hook_site_list(unsigned long ip)
{
	struct site *s;
	unsigned long l = 0;

	pthread_mutex_lock(&hook_lock);
	s = __site_find(ip);
	if (s && s->ent.x)
		l = pki_tmem_list(&s->ent);
	hook_unlock();
	return l;
}

/* ---- trampolines ---- */

/* @p's body, made on demand (kept until unregister): entries reach it from anywhere. */
static int __ops_tramp(struct ops_priv *p, unsigned long *out)
{
	struct pki_tslot t;
	int err;

	if (!p->tramp.x) {
		err = pki_tmem_alloc(0, &t);
		if (err)
			return err;
		err = pki_tmem_emit(
		    p->ops->flags & PK_OPS_F_NOVEC ? PKI_TRAMP_OPS_NV : PKI_TRAMP_OPS, &t,
		    (unsigned long[]){(unsigned long)p->ops, (unsigned long)p->ops->func}, 2);
		if (err) {
			pki_tmem_free(&t);
			return err;
		}
		p->tramp = t;
	}
	*out = p->tramp.x;
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

/* A copy of @s's staged ops, for a list dispatcher. */
static struct opsv *opsv_new(const struct ops_vec *ops)
{
	struct opsv *v = malloc(sizeof(*v) + ops->n * sizeof(v->v[0]));

	if (v) {
		v->n = ops->n;
		memcpy(v->v, ops->v, ops->n * sizeof(v->v[0]));
	}
	return v;
}

static unsigned long tramp_body_of(unsigned long addr);

/*
 * Decide what @s calls in the staged state (see the table above); may make
 * bodies.  The entry words cover a site whose text does not call its entry
 * (any more) too: a thread that entered through old bytes does what the
 * new bytes do.
 */
static int __site_decide(struct site *s)
{
	unsigned long body = s->direct ? tramp_body_of(s->direct) : 0;
	/* The text calls the entry, unless it calls nothing or user code within reach. */
	bool via_entry = s->ops.n || (s->direct && (body || !pki_tmem_reaches(s->ip, s->direct)));
	struct pki_tramp_exits x;
	int err;

	s->new_opsv = s->opsv;
	s->new_call = s->direct;
	if (!s->ent.x) {
		if (!via_entry)
			return 0;
		err = pki_tmem_entry_new(s->ip, &s->ent);
		if (err)
			return err;
	}
	if (pki_tmem_entry_frozen(&s->ent))
		return -ENOTRECOVERABLE; /* shared with the parent: never written here */
	if (via_entry)
		s->new_call = s->ent.x;
	pki_tmem_exits(&s->ent, &x);
	/* What the direct address (or its absence) needs, counted. */
	s->new_ent = (struct pki_tramp_entry){x.ret, x.ret, (unsigned long)s->opsv, x.ret_ret};
	if (s->direct) {
		s->new_ent.user = s->new_ent.target = body ? body : x.user;
		s->new_ent.direct = s->direct;
	}
	if (!s->ops.n)
		return 0;
	if (s->ops.n == 1 && !s->direct)
		return __ops_tramp(s->ops.v[0]->private, &s->new_ent.target);
	s->new_opsv = opsv_new(&s->ops);
	if (!s->new_opsv)
		return -ENOMEM;
	s->new_ent.ops = (unsigned long)s->new_opsv;
	s->new_ent.target = pki_tmem_list(&s->ent);
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
	/* Broken first: in such a fork child nobody is left to end another thread's transaction. */
	while (!hook_broken && txn_open && !txn_mine)
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
			/* A failed batch may have run it (mid-batch emulation). */
			if (p->tramp.x)
				slot_retire(&p->tramp);
			__ops_priv_free(p);
		}
	}
	changes.n = 0;
}

/* The 5 bytes @s gets: a call of new_call, else nop5 (as found until first attached). */
static void site_bytes(const struct site *s, uint8_t b[PKI_SITE_LEN])
{
	/*
	 * A gcc sled (90 x5) is thus converted (with the patch layer's sled
	 * kick) once; later cycles go nop5 <-> call, which need no kick.
	 * s->cur tracks what is in the text, and is what the patch layer
	 * verifies.
	 */
	if (s->new_call)
		pki_insn_call(b, s->ip, s->new_call);
	else if (s->call)
		memcpy(b, pki_nop5, PKI_SITE_LEN);
	else
		memcpy(b, s->cur, PKI_SITE_LEN);
}

/* Pre-poke: publish the entries the new bytes will call (see the file comment). */
static void __entries_publish(void)
{
	for (size_t i = 0; i < dirty.n; i++) {
		struct site *s = dirty.v[i];

		if (s->ent.x && s->new_call == s->ent.x) {
			pki_tmem_entry_get(&s->ent, &s->old_ent);
			pki_tmem_entry_set(&s->ent, &s->new_ent);
		}
	}
}

/* The batch failed: the published entries go back (threads may have used the new words). */
static void __entries_unpublish(void)
{
	for (size_t i = 0; i < dirty.n; i++) {
		struct site *s = dirty.v[i];

		if (s->ent.x && s->new_call == s->ent.x)
			pki_tmem_entry_set(&s->ent, &s->old_ent);
	}
}

/* Free what decide made for the first @n dirty sites and the commit will not keep. */
static void __decided_drop(size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct site *s = dirty.v[i];

		if (s->new_opsv != s->opsv)
			pki_gp_defer(opsv_free, s->new_opsv);
		s->new_opsv = NULL;
	}
}

/* After the batch: park the entries the text no longer calls, retire what they replaced. */
static void tramp_use(unsigned long addr, int delta);

static void __sites_settle(void)
{
	for (size_t i = 0; i < dirty.n; i++) {
		struct site *s = dirty.v[i];

		if (s->saved_direct != s->direct) { /* committed direct addresses: see pk_tramp */
			tramp_use(s->saved_direct, -1);
			tramp_use(s->direct, 1);
		}

		if (s->ent.x && s->new_call != s->ent.x)
			pki_tmem_entry_set(&s->ent, &s->new_ent);
		if (s->new_opsv != s->opsv) {
			if (s->opsv)
				pki_gp_defer(opsv_free, s->opsv);
			s->opsv = s->new_opsv;
		}
		s->call = s->new_call;
		s->dirty = false;
	}
	dirty.n = 0;
}

/* Committed unregistrations: their ops' bodies go after a grace period. */
static int __ops_retire(void)
{
	bool unreg = false;
	int gp_err;

	for (size_t i = 0; i < changes.n; i++) {
		struct ops_priv *p = changes.v[i].p;

		p->registered = p->staged;
		unreg |= !p->registered;
	}
	if (!unreg)
		return 0;
	/*
	 * The callers may free their ops once we return 0.  A grace period
	 * that timed out (unreg_timeout_ns) leaves the ops off its sites but
	 * possibly still in use: the bodies go after a later grace period,
	 * and the caller keeps its ops.
	 */
	gp_err = pki_gp_synchronize_for(unreg_timeout_ns);
	for (size_t i = 0; i < changes.n; i++) {
		struct ops_priv *p = changes.v[i].p;

		if (p->registered)
			continue;
		if (p->tramp.x) {
			if (gp_err)
				slot_retire(&p->tramp);
			else
				pki_tmem_free(&p->tramp);
		}
		__ops_priv_free(p);
	}
	return gp_err;
}

/*
 * Apply the staged state: decide every dirty site, publish entries, poke
 * the text in one batch.  On failure everything is as before.
 */
static int __txn_commit(void)
{
	struct pki_poke *pokes = NULL;
	size_t np = 0, decided = 0;
	int err = 0;

	if (!dirty.n && !changes.n)
		return 0;
	pokes = calloc(dirty.n ? dirty.n : 1, sizeof(*pokes));
	if (!pokes) {
		err = -ENOMEM;
		goto undo;
	}
	for (size_t i = 0; i < dirty.n; i++) {
		struct site *s = dirty.v[i];
		uint8_t b[PKI_SITE_LEN];

		err = __site_decide(s);
		decided = i + 1;
		if (err) {
			pki_warn("hooks: site %#lx: no trampoline: %s\n", s->ip, pki_errstr(err));
			goto drop;
		}
		site_bytes(s, b);
		if (memcmp(b, s->cur, PKI_SITE_LEN)) {
			pokes[np].addr = s->ip;
			memcpy(pokes[np].old, s->cur, PKI_SITE_LEN);
			memcpy(pokes[np].new, b, PKI_SITE_LEN);
			np++;
		}
	}
	__entries_publish();
	if (np) {
		err = poke_fn(pokes, np);
		atfork_after_batch(); /* after the patch layer's handlers: see fork */
		if (err) {
			pki_warn("hooks: batch of %zu sites: %s\n", np, pki_errstr(err));
			__entries_unpublish();
			goto drop;
		}
	}
	for (size_t i = 0; i < np; i++)
		memcpy(__site_find(pokes[i].addr)->cur, pokes[i].new, PKI_SITE_LEN);
	__sites_settle();
	free(pokes);
	err = __ops_retire();
	changes.n = 0;
	return err;

drop:
	__decided_drop(decided);
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
		return site_src->each(NULL, 0, ~0ul, collect_ip, c);
	for (size_t i = 0; i < f->nips && !err; i++)
		err = collect_ip(f->ips[i], c);
	for (size_t i = 0; i < f->nglobs && !err; i++) {
		size_t before = c->n;

		err = site_src->each(f->globs[i], 0, ~0ul, collect_ip, c);
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
			       .cap_ips = c.n,
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
} pend_gone, pend_new;
static int pend_added; /* 0, 1: ranges in pend_new, 2: some not known */
static bool pend_lost;

/*
 * Forget every site in @r: their text is gone, so never poke it.  The sites
 * leave the map, the ops' lists and the direct hash.  Their entries stay
 * (never freed); their ops arrays go after a grace period (a thread that
 * entered before the unmap may still read one).  The struct site itself is
 * writer-side state only (hook_lock): freed now.
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
		if (st->opsv)
			pki_gp_defer(opsv_free, st->opsv);
		tramp_use(st->direct, -1); /* outside any transaction: the committed one */
		free(st->ops.v);
		free(st->saved_ops.v);
		free(st);
	}
	pki_umap_clear(&sites);
	for (size_t i = 0; i < n; i++)
		pki_umap_insert(&sites, keep[i]); /* fits: fewer than before */
	free(keep);
}

static bool site_has_ops(const struct site *s, const struct pk_ops *ops)
{
	for (unsigned int i = 0; i < s->ops.n; i++)
		if (s->ops.v[i] == ops)
			return true;
	return false;
}

/* Give @p the sites in [@lo, @hi) its filter matches: O(the sites there). */
static int __follow_range(struct ops_priv *p, unsigned long lo, unsigned long hi)
{
	const struct pk_ops_filter *f = &p->ops->filter;
	struct collect c = {0};
	int err = 0;

	if (!f->nglobs)
		err = site_src->each(NULL, lo, hi, collect_ip, &c);
	for (size_t i = 0; i < f->nglobs && !err; i++)
		err = site_src->each(f->globs[i], lo, hi, collect_ip, &c);
	for (size_t i = 0; i < c.n && !err; i++) {
		struct site *st = __site_find(c.ips[i]);

		if (st && site_has_ops(st, p->ops)) /* a glob matched twice, or a record kept */
			continue;
		err = __site_get(c.ips[i], &st);
		if (err == -EBUSY) { /* someone else's code there: not ours */
			err = 0;
			continue;
		}
		if (!err)
			err = PKI_GROW(p->ips, p->cap_ips, p->nips + 1);
		if (!err)
			err = __site_prepare(st, 1);
		if (err)
			break;
		p->ips[p->nips++] = c.ips[i];
		st->ops.v[st->ops.n++] = p->ops;
	}
	free(c.ips);
	return err;
}

/*
 * Give every following ops the sites of the objects loaded since it
 * resolved (@r: their ranges; NULL: not known, every site is looked at).
 */
static void __follow(const struct range *r, size_t nr)
{
	for (size_t j = 0; j < all_ops.n; j++) {
		struct ops_priv *p = all_ops.v[j];
		int err = 0;

		if (!p->follows || !p->registered || !p->staged)
			continue;
		if (!r)
			err = __follow_range(p, 0, ~0ul);
		for (size_t k = 0; r && k < nr && !err; k++)
			err = __follow_range(p, r[k].lo, r[k].hi);
		if (err)
			pki_warn("hooks: ops %p: sites of a new object: %s\n", (void *)p->ops,
				 pki_errstr(err));
	}
}

/* Apply the queue.  hook_lock held, no transaction open. */
static void __apply_pending(void)
{
	struct range *gone, *added_r;
	size_t ngone, nadded;
	int added;
	bool lost;
	int err;

	pthread_mutex_lock(&pend_lock);
	gone = pend_gone.v;
	ngone = pend_gone.n;
	added_r = pend_new.v;
	nadded = pend_new.n;
	added = pend_added;
	lost = pend_lost;
	pend_gone.v = pend_new.v = NULL;
	pend_gone.n = pend_gone.cap = pend_new.n = pend_new.cap = 0;
	pend_added = pend_lost = false;
	__atomic_store_n(&pend_any, false, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&pend_lock);
	if (lost)
		pki_warn("hooks: lost track of an unloaded object (its sites stay known): %s\n",
			 pki_errstr(ENOMEM));
	if (ngone)
		__forget(gone, ngone);
	free(gone);
	/* A range that could not be queued makes every site looked at (added_r NULL). */
	for (size_t j = 0; j < all_ops.n; j++)
		all_ops.v[j]->nips_before = all_ops.v[j]->nips;
	if (added)
		__follow(added == 1 ? added_r : NULL, nadded);
	free(added_r);
	err = __txn_commit();
	if (err) {
		/* The sites' ops went back (__txn_undo): so do the ops' lists of sites. */
		for (size_t j = 0; j < all_ops.n; j++)
			if (all_ops.v[j]->nips > all_ops.v[j]->nips_before)
				all_ops.v[j]->nips = all_ops.v[j]->nips_before;
		pki_warn("hooks: applying loaded/unloaded objects: %s\n", pki_errstr(err));
	}
}

static void sites_changed(const struct pki_sym_object *obj, bool added)
{
	pthread_mutex_lock(&pend_lock);
	if (added) {
		if (pend_added != 2 && !GROW(pend_new, pend_new.n + 1))
			pend_new.v[pend_new.n++] = (struct range){obj->lo, obj->hi};
		else
			pend_added = 2; /* not all known: look at every site */
		if (!pend_added)
			pend_added = 1;
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
	pthread_mutex_lock(&tramp_lock);
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
	pthread_mutex_unlock(&tramp_lock);
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
	pthread_mutex_unlock(&tramp_lock);
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

/*
 * A pk_tramp is an entry (what pk_tramp_addr() gives, never freed: a thread
 * may be about to run it, R1 in gp.c) and a handler body it jumps to.  Sites
 * never call that entry: they go through their own to the body, counted
 * (the table at the top), so once pk_tramp_free() found no site using it and
 * a grace period passed, no thread of ours can run the handler.  Freed, its
 * body goes after a grace period and its entry is parked (X_RET, for code
 * of the user's own that called the address) with its struct, kept for a
 * later pk_tramp_new() of the same handler and flags: a program making and
 * freeing trampolines in a loop does not grow.  Every pk_tramp ever made is
 * in `tramps` (entry address -> struct), which is how the registry knows a
 * direct address is one.
 */
struct pk_tramp {
	struct pki_tentry ent;
	struct pki_tslot body;
	pk_tramp_fn handler;
	unsigned int flags;
	unsigned long uses;    /* committed sites whose direct address it is (tramp_lock) */
	struct pk_tramp *next; /* on the list of parked ones */
};

static struct pk_tramp *parked; /* under tramp_lock, like tramps */
/* ent.x -> struct pk_tramp, every one ever made (never removed). */
static struct pki_umap tramps = PKI_UMAP_INIT(struct pk_tramp, ent.x);

/* A committed site's direct address became (@delta 1) or stopped being (-1) @addr. */
static void tramp_use(unsigned long addr, int delta)
{
	struct pk_tramp *t;

	if (!addr || !pki_tmem_contains(addr))
		return;
	pthread_mutex_lock(&tramp_lock);
	t = pki_umap_find(&tramps, addr);
	if (t)
		t->uses += (unsigned long)(long)delta;
	pthread_mutex_unlock(&tramp_lock);
}

/* The handler body of the live pk_tramp whose address is @addr, or 0. */
static unsigned long tramp_body_of(unsigned long addr)
{
	struct pk_tramp *t;
	unsigned long body = 0;

	if (!pki_tmem_contains(addr))
		return 0;
	pthread_mutex_lock(&tramp_lock);
	t = pki_umap_find(&tramps, addr);
	if (t)
		body = t->body.x;
	pthread_mutex_unlock(&tramp_lock);
	return body;
}
static pthread_once_t list_once = PTHREAD_ONCE_INIT;

static void set_list_func(void)
{
	pki_tmem_set_list_func((unsigned long)pki_hook_list_func);
}

__attribute__((constructor)) static void hook_init(void)
{
	pthread_once(&list_once, set_list_func);
}

/* A parked trampoline of @handler and @flags, or NULL. */
static struct pk_tramp *tramp_unpark(pk_tramp_fn handler, unsigned int flags)
{
	struct pk_tramp **pp, *t = NULL;

	pthread_mutex_lock(&tramp_lock);
	for (pp = &parked; *pp; pp = &(*pp)->next)
		if ((*pp)->handler == handler && (*pp)->flags == flags) {
			t = *pp;
			*pp = t->next;
			break;
		}
	pthread_mutex_unlock(&tramp_lock);
	return t;
}

struct pk_tramp *pk_tramp_new(pk_tramp_fn handler, unsigned int flags)
{
	struct pki_tramp_exits x;
	struct pk_tramp *t;
	int err;

	if (!handler || (flags & ~PK_TRAMP_F_NOVEC)) {
		errno = EINVAL;
		return NULL;
	}
	pki_hook_atfork_init(); /* its memory must be unshared at fork() too */
	t = tramp_unpark(handler, flags);
	if (!t) {
		t = calloc(1, sizeof(*t));
		if (!t)
			return NULL;
		err = pki_tmem_entry_new(0, &t->ent);
		if (!err) {
			pthread_mutex_lock(&tramp_lock);
			err = pki_umap_insert(&tramps, t);
			pthread_mutex_unlock(&tramp_lock);
		}
		if (err) { /* the entry, if made, stays unused */
			free(t);
			errno = -err;
			return NULL;
		}
		t->handler = handler;
		t->flags = flags;
	}
	err = pki_tmem_alloc(0, &t->body);
	if (!err)
		err = pki_tmem_emit(flags & PK_TRAMP_F_NOVEC ? PKI_TRAMP_HANDLER_NV
							     : PKI_TRAMP_HANDLER,
				    &t->body, (unsigned long[]){(unsigned long)handler}, 1);
	if (err) {
		if (t->body.x)
			pki_tmem_free(&t->body);
		t->body = (struct pki_tslot){0};
		pthread_mutex_lock(&tramp_lock);
		t->next = parked;
		parked = t;
		pthread_mutex_unlock(&tramp_lock);
		errno = -err;
		return NULL;
	}
	pki_tmem_exits(&t->ent, &x);
	pki_tmem_entry_set(&t->ent, &(struct pki_tramp_entry){t->body.x, x.ret, 0, x.ret_ret});
	return t;
}

unsigned long pk_tramp_addr(const struct pk_tramp *t)
{
	return t->ent.x;
}

int pk_tramp_free(struct pk_tramp *t)
{
	struct pki_tramp_exits x;
	int err;

	if (!t)
		return 0;
	struct pki_tslot body;

	err = hook_enter();
	if (err)
		return err;
	/* Used by a committed site, or staged for one in our transaction: O(dirty sites). */
	pthread_mutex_lock(&tramp_lock);
	if (t->uses)
		err = -EBUSY;
	pthread_mutex_unlock(&tramp_lock);
	for (size_t i = 0; i < dirty.n && !err; i++)
		if (dirty.v[i]->direct == t->ent.x)
			err = -EBUSY;
	/*
	 * Still under hook_lock: no commit can route a site to the body
	 * between the check and the parking (tramp_body_of() reads it as 0).
	 */
	if (!err) {
		pki_tmem_exits(&t->ent, &x);
		pki_tmem_entry_set(&t->ent, &(struct pki_tramp_entry){x.ret, x.ret, 0, x.ret_ret});
		pthread_mutex_lock(&tramp_lock);
		body = t->body;
		t->body = (struct pki_tslot){0};
		t->next = parked;
		parked = t;
		pthread_mutex_unlock(&tramp_lock);
		slot_retire(&body); /* outside tramp_lock: it may wait for a grace period */
	}
	hook_unlock();
	return err;
}
