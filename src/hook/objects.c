// SPDX-License-Identifier: MIT
/*
 * Objects loaded and unloaded (dlopen / dlclose) while hooks exist.
 *
 * The sym layer tells us about every object that joins or leaves its table
 * (pki_sites_set_notify), from the thread running pk_sites_refresh(), under
 * its refresh mutex.  Lock order: pki_reg.lock, then the refresh mutex (a
 * registration may build the site table, or refresh it, under pki_reg.lock);
 * so the notifier never waits for pki_reg.lock.  It queues the event under
 * pend_lock (a leaf lock) and then only TRIES pki_reg.lock: on success it
 * applies the queue itself; otherwise the holder applies it when it lets go
 * of the lock (pki_hook_unlock checks the queue after unlocking, and an event
 * queued before a failed trylock is seen by that check).  Inside the
 * refreshing thread's own transaction the queue waits for its end.
 *
 * Applying: ranges of unloaded objects first, then, if anything was loaded,
 * every ops that follows (globs or empty filter) resolves its filter again
 * and takes the sites it does not have yet; one commit for all of it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/held.h"
#include "base/log.h"
#include "hook/gp.h"
#include "hook/registry.h"
#include "sym/sites.h"

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
static bool pend_any; /* something queued (under pend_lock) */

/*
 * Forget every site in @r: their text is gone, so never poke it.  The sites
 * leave the map, the ops' lists and the direct hash.  Their entries stay
 * (never freed); their ops arrays go after a grace period (a thread that
 * entered before the unmap may still read one).  The struct site itself is
 * writer-side state only (pki_reg.lock): freed now.
 */
static void __forget(const struct range *r, size_t nr)
{
	PKI_HELD(&pki_reg.lock);
	struct site **keep;
	size_t cap = pki_reg.sites.cap, n = 0;

	if (!cap)
		return;
	keep = calloc(cap, sizeof(*keep));
	if (!keep) {
		pki_warn("hooks: cannot forget unloaded sites: %s\n", pki_errstr(ENOMEM));
		return;
	}
	for (size_t i = 0; i < cap; i++) {
		struct site *st = pki_reg.sites.slot[i];
		bool gone = false;

		for (size_t k = 0; st && k < nr && !gone; k++)
			gone = st->ip >= r[k].lo && st->ip < r[k].hi;
		if (gone) { /* an object loaded since at the same place: keep a record that fits */
			unsigned long ip;

			gone = pki_reg.src->lookup(st->ip, &ip) || ip != st->ip ||
			       memcmp((const void *)ip, st->cur, PKI_SITE_LEN);
		}
		if (!gone) {
			if (st)
				keep[n++] = st;
			continue;
		}
		for (size_t j = 0; j < pki_reg.all_ops.n; j++) {
			struct ops_priv *p = pki_reg.all_ops.v[j];

			for (size_t k = 0; k < p->nips; k++)
				if (p->ips[k] == st->ip) {
					p->ips[k] = p->ips[--p->nips];
					break;
				}
		}
		if (st->opsv)
			pki_gp_defer(pki_hook_opsv_free, st->opsv);
		if (st->reloc && st->reloc->int3) /* a trap there is no longer this site's */
			pki_arch_trap_site_del(st->ip);
		pki_hook_tramp_use(st->direct, -1); /* outside any transaction: the committed one */
		free(st->ops.v);
		free(st->saved_ops.v);
		free(st->reloc);
		free(st);
	}
	pki_umap_clear(&pki_reg.sites);
	for (size_t i = 0; i < n; i++)
		pki_umap_insert(&pki_reg.sites, keep[i]); /* fits: fewer than before */
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
	PKI_HELD(&pki_reg.lock);
	const struct pk_ops_filter *f = &p->filter; /* not the caller's: its size may differ */
	struct collect c = {0};
	int err = 0;

	if (!f->nglobs)
		err = pki_reg.src->each(NULL, lo, hi, pki_hook_collect_ip, &c);
	for (size_t i = 0; i < f->nglobs && !err; i++)
		err = pki_reg.src->each(f->globs[i], lo, hi, pki_hook_collect_ip, &c);
	for (size_t i = 0; i < c.n && !err; i++) {
		struct site *st = __pki_hook_site_find(c.ips[i]);

		if (st && site_has_ops(st, p->ops)) /* a glob matched twice, or a record kept */
			continue;
		err = __pki_hook_site_get(c.ips[i], &st);
		if (err == -EBUSY) { /* someone else's code there: not ours */
			err = 0;
			continue;
		}
		if (!err)
			err = PKI_GROW(p->ips, p->cap_ips, p->nips + 1);
		if (!err)
			err = __pki_hook_site_prepare(st, 1);
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
	PKI_HELD(&pki_reg.lock);
	for (size_t j = 0; j < pki_reg.all_ops.n; j++) {
		struct ops_priv *p = pki_reg.all_ops.v[j];
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

/* Apply the queue.  pki_reg.lock held, no transaction open. */
void __pki_hook_objects_apply(void)
{
	PKI_HELD(&pki_reg.lock);
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
	for (size_t j = 0; j < pki_reg.all_ops.n; j++)
		pki_reg.all_ops.v[j]->nips_before = pki_reg.all_ops.v[j]->nips;
	if (added)
		__follow(added == 1 ? added_r : NULL, nadded);
	free(added_r);
	err = __pki_hook_commit();
	if (err) {
		/* The sites' ops went back (__pki_hook_undo): so do the ops' lists of sites. */
		for (size_t j = 0; j < pki_reg.all_ops.n; j++)
			if (pki_reg.all_ops.v[j]->nips > pki_reg.all_ops.v[j]->nips_before)
				pki_reg.all_ops.v[j]->nips = pki_reg.all_ops.v[j]->nips_before;
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
	if (pki_held_trylock(&pki_reg.lock)) {
		if (!pki_reg.txn_open &&
		    !pki_reg.broken) /* else: applied when the transaction ends */
			__pki_hook_objects_apply();
		pki_hook_unlock();
	}
}

/* The range of sorted, disjoint @r[0, @n) that holds @ip, or @n. */
static size_t range_of(const struct pki_hook_range *r, size_t n, unsigned long ip)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ip < r[mid].lo)
			hi = mid;
		else if (ip >= r[mid].hi)
			lo = mid + 1;
		else
			return mid;
	}
	return n;
}

/*
 * See hook_int.h.  A site the committed state makes call something holds
 * bytes of ours while the instance that was hooked is mapped: a call, or
 * what the patch layer wrote for it (a relayed sled's e8 90.., a jump
 * relay's e9.., a breakpoint), never the bytes the object itself had there
 * (st->found), which are what an instance loaded since holds.  The text is
 * read, never written (pki_reg.lock: no batch runs).
 */
int pki_hook_text_lost(const struct pki_hook_range *r, size_t n, bool *lost)
{
	int err;

	memset(lost, 0, n * sizeof(*lost));
	if (!n)
		return 0;
	err = pki_hook_enter();
	if (err)
		return err;
	for (size_t i = 0; i < pki_reg.sites.cap; i++) {
		const struct site *st = pki_reg.sites.slot[i];
		size_t k;

		if (!st || !st->call || (k = range_of(r, n, st->ip)) == n || lost[k])
			continue;
		lost[k] = !memcmp((const void *)st->ip, st->found, PKI_SITE_LEN);
	}
	pki_hook_unlock();
	return 0;
}

static pthread_once_t notify_once = PTHREAD_ONCE_INIT;

static void notify_once_init(void)
{
	pki_sites_set_notify(sites_changed);
	pki_hook_atfork_init();
}

void pki_hook_notify_init(void)
{
	pthread_once(&notify_once, notify_once_init);
}

/*
 * Under pend_lock: ordered against sites_changed()'s queueing, so a caller
 * that let go of pki_reg.lock sees an event whose trylock it made fail.
 */
bool pki_hook_objects_pending(void)
{
	bool any;

	pthread_mutex_lock(&pend_lock);
	any = pend_any;
	pthread_mutex_unlock(&pend_lock);
	return any;
}

void pki_hook_objects_fork(enum pki_hook_fork stage)
{
	pki_hook_mutex_fork(&pend_lock, stage);
}
