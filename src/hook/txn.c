// SPDX-License-Identifier: MIT
/*
 * The registry's lock, its transactions and the commit.
 *
 * pki_reg.lock (a struct pki_held_mutex, base/held.h: every `__pki_hook_`
 * function checks it) serialises everything below, held for the length of
 * one public call.  A transaction is an ownership of the registry, not of
 * the lock: pk_txn_begin() marks it open and owned by the calling thread
 * (pki_reg.txn_open, txn_mine), other threads' calls wait on txn_cv until its
 * commit or abort; between calls the owner holds no lock.  So fork() only
 * waits for a call in flight, never for an open transaction (see "fork"
 * below).  Every public call stages its change on the sites (keeping an
 * undo copy of each site it touches first: the "dirty" list), and the commit
 * decides every dirty site, publishes their entry words, then hands all
 * pokes to the patch layer in ONE batch.  A commit costs O(dirty sites):
 * nothing is rebuilt whole.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/held.h"
#include "base/log.h"
#include "hook/gp.h"
#include "hook/registry.h"
#include "sym/sites.h"

struct pki_registry pki_reg = {
    .lock = PKI_HELD_MUTEX_INIT,
    .sites = PKI_UMAP_INIT(struct site, ip),
    .src = &pki_hook_default_src,
};
static pthread_cond_t txn_cv = PTHREAD_COND_INITIALIZER; /* txn_open went false */
static __thread bool txn_mine;

static void atfork_after_batch(void);

/* How long an unregister waits for its grace period (0: for ever); see hook_int.h. */
static long unreg_timeout_ns;

void pki_hook_set_unregister_timeout(long ns)
{
	__atomic_store_n(&unreg_timeout_ns, ns, __ATOMIC_RELAXED);
}

static pki_poke_fn poke_fn = pki_text_poke_batch;

void pki_hook_set_poke(pki_poke_fn fn)
{
	poke_fn = fn ? fn : pki_text_poke_batch;
}

/* ---- calls and transactions ---- */

/*
 * Take pki_reg.lock for one call, once no other thread's transaction is open.
 * Loaded/unloaded objects queued meanwhile are applied first, outside any
 * transaction (inside one: at its end).
 */
int pki_hook_enter(void)
{
	if (pki_tramp_in_hook()) {
		pki_warn("hooks: called from inside a hook: hooks cannot be changed from a hook's "
			 "callback: %s\n",
			 pki_errstr(EDEADLK));
		return -EDEADLK;
	}
	pki_hook_notify_init();
	pki_hook_shstk_init();
	pki_held_lock(&pki_reg.lock);
	/* Broken first: in such a fork child nobody is left to end another thread's transaction. */
	while (!pki_reg.broken && pki_reg.txn_open && !txn_mine)
		pki_held_cond_wait(&txn_cv, &pki_reg.lock);
	if (pki_reg.broken) {
		pki_held_unlock(&pki_reg.lock);
		pki_warn("hooks: this fork child cannot change hooks: another thread of the "
			 "parent was inside a hook call at fork(): %s\n",
			 pki_errstr(ENOTRECOVERABLE));
		return -ENOTRECOVERABLE;
	}
	if (!pki_reg.txn_open && pki_hook_objects_pending())
		__pki_hook_objects_apply(); /* before anything uses the sites */
	return 0;
}

/* Drop staged changes of every dirty site and ops. */
void __pki_hook_undo(void)
{
	PKI_HELD(&pki_reg.lock);
	for (size_t i = 0; i < pki_reg.dirty.n; i++) {
		struct site *s = pki_reg.dirty.v[i];

		pki_hook_vec_copy(&s->ops, &s->saved_ops); /* fits: ops.cap >= saved.n */
		s->direct = s->saved_direct;
		s->dirty = false;
	}
	pki_reg.dirty.n = 0;
	/*
	 * Each ops_priv is in `changes` at most once (see __pki_hook_ops_unregister, ops.c),
	 * so each is freed at most once.  Newest first: a registration made
	 * after an unregister of the same ops gives ops->private back to the
	 * committed record before that record is restored.
	 */
	for (size_t i = pki_reg.changes.n; i-- > 0;) {
		struct ops_priv *p = pki_reg.changes.v[i].p;

		p->staged = p->registered;
		if (!p->registered) {
			/* A failed batch may have run it (mid-batch emulation). */
			if (p->tramp.x)
				pki_hook_slot_retire(&p->tramp);
			if (p->tramp_reloc.x)
				pki_hook_slot_retire(&p->tramp_reloc);
			__pki_hook_ops_priv_free(p);
		}
	}
	pki_reg.changes.n = 0;
}

/*
 * An unregistered ops' body @t, after the grace period: freed, or retired
 * (freed after a later one) if the grace period timed out (@gp_err).
 */
static void ops_body_free(struct pki_tslot *t, int gp_err)
{
	if (!t->x)
		return;
	if (gp_err)
		pki_hook_slot_retire(t);
	else
		pki_tmem_free(t);
}

/* Pre-poke: publish the entries the new bytes will call (see the file comment). */
static void __entries_publish(void)
{
	PKI_HELD(&pki_reg.lock);
	for (size_t i = 0; i < pki_reg.dirty.n; i++) {
		struct site *s = pki_reg.dirty.v[i];

		if (s->ent.x && s->new_call == s->ent.x) {
			pki_tmem_entry_get(&s->ent, &s->old_ent);
			pki_tmem_entry_set(&s->ent, &s->new_ent);
		}
	}
}

/* The batch failed: the published entries go back (threads may have used the new words). */
static void __entries_unpublish(void)
{
	PKI_HELD(&pki_reg.lock);
	for (size_t i = 0; i < pki_reg.dirty.n; i++) {
		struct site *s = pki_reg.dirty.v[i];

		if (s->ent.x && s->new_call == s->ent.x)
			pki_tmem_entry_set(&s->ent, &s->old_ent);
	}
}

/* Free what decide made for the first @n dirty sites and the commit will not keep. */
static void __decided_drop(size_t n)
{
	PKI_HELD(&pki_reg.lock);
	for (size_t i = 0; i < n; i++) {
		struct site *s = pki_reg.dirty.v[i];

		if (s->new_opsv != s->opsv)
			pki_gp_defer(pki_hook_opsv_free, s->new_opsv);
		s->new_opsv = NULL;
	}
}

/* After the batch: park the entries the text no longer calls, retire what they replaced. */
static void __sites_settle(void)
{
	PKI_HELD(&pki_reg.lock);
	for (size_t i = 0; i < pki_reg.dirty.n; i++) {
		struct site *s = pki_reg.dirty.v[i];

		if (s->saved_direct != s->direct) { /* committed direct addresses: see pk_tramp */
			pki_hook_tramp_use(s->saved_direct, -1);
			pki_hook_tramp_use(s->direct, 1);
		}

		if (s->ent.x && s->new_call != s->ent.x)
			pki_tmem_entry_set(&s->ent, &s->new_ent);
		if (s->new_opsv != s->opsv) {
			if (s->opsv)
				pki_gp_defer(pki_hook_opsv_free, s->opsv);
			s->opsv = s->new_opsv;
		}
		s->call = s->new_call;
		s->dirty = false;
	}
	pki_reg.dirty.n = 0;
}

/* Committed unregistrations: their ops' bodies go after a grace period. */
static int __ops_retire(void)
{
	PKI_HELD(&pki_reg.lock);
	bool unreg = false;
	int gp_err;

	for (size_t i = 0; i < pki_reg.changes.n; i++) {
		struct ops_priv *p = pki_reg.changes.v[i].p;

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
	for (size_t i = 0; i < pki_reg.changes.n; i++) {
		struct ops_priv *p = pki_reg.changes.v[i].p;

		if (p->registered)
			continue;
		ops_body_free(&p->tramp, gp_err);
		ops_body_free(&p->tramp_reloc, gp_err);
		__pki_hook_ops_priv_free(p);
	}
	return gp_err;
}

/*
 * Apply the staged state: decide every dirty site, publish entries, poke
 * the text in one batch.  On failure everything is as before.
 */
int __pki_hook_commit(void)
{
	PKI_HELD(&pki_reg.lock);
	struct pki_poke *pokes = NULL;
	size_t np = 0, decided = 0;
	int err = 0;

	if (!pki_reg.dirty.n && !pki_reg.changes.n)
		return 0;
	pokes = calloc(pki_reg.dirty.n ? pki_reg.dirty.n : 1, sizeof(*pokes));
	if (!pokes) {
		err = -ENOMEM;
		goto undo;
	}
	for (size_t i = 0; i < pki_reg.dirty.n; i++) {
		struct site *s = pki_reg.dirty.v[i];
		uint8_t b[PKI_SITE_LEN];

		err = __pki_hook_site_decide(s);
		decided = i + 1;
		if (err) {
			pki_warn("hooks: site %#lx: no trampoline: %s\n", s->ip, pki_errstr(err));
			goto drop;
		}
		pki_hook_site_bytes(s, b);
		if (memcmp(b, s->cur, PKI_SITE_LEN)) {
			pokes[np].addr = s->ip;
			memcpy(pokes[np].old, s->cur, PKI_SITE_LEN);
			memcpy(pokes[np].new, b, PKI_SITE_LEN);
			pokes[np].trap = s->reloc && s->reloc->int3;
			/* Bytes 1..4 its function's own: the jump relay may stand for the trap. */
			if (pokes[np].trap &&
			    s->reloc->func + s->reloc->size >= s->ip + PKI_SITE_LEN)
				pokes[np].relay_to = s->ent.x;
			pokes[np].reloc = s->reloc && !s->reloc->int3 ? &s->reloc->poke : NULL;
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
		memcpy(__pki_hook_site_find(pokes[i].addr)->cur, pokes[i].new, PKI_SITE_LEN);
	__sites_settle();
	free(pokes);
	err = __ops_retire();
	pki_reg.changes.n = 0;
	return err;

drop:
	__decided_drop(decided);
undo:
	free(pokes);
	__pki_hook_undo();
	return err;
}

/* End a public call: commit it unless inside a transaction. */
int pki_hook_leave(int err)
{
	if (!txn_mine) {
		if (!err)
			err = __pki_hook_commit();
		else
			__pki_hook_undo();
	}
	pki_hook_unlock();
	return err;
}

/*
 * A thread that ends with its transaction open would leave every other
 * thread waiting for it for ever: a thread-specific value set while the
 * transaction is open makes its exit (pthread_exit(), a return from its
 * start function) run txn_exited(), which drops the transaction as
 * pk_txn_abort() does.  Key destructors run in the exiting thread itself,
 * with its thread-local txn_mine still readable, holding no lock of ours.
 */
static pthread_key_t txn_key;
static bool txn_key_made;
static pthread_once_t txn_key_once = PTHREAD_ONCE_INIT;

static void txn_exited(void *arg)
{
	(void)arg;
	if (txn_mine) {
		pki_warn("hooks: a thread exited with its transaction open: dropped, as by "
			 "pk_txn_abort()\n");
		pk_txn_abort();
	}
}

static void txn_key_make(void)
{
	txn_key_made = !pthread_key_create(&txn_key, txn_exited);
}

int pk_txn_begin(void)
{
	int err;

	if (txn_mine) {
		pki_warn("hooks: pk_txn_begin: %s: %s\n",
			 pki_tramp_in_hook() ? "called from inside a hook"
					     : "this thread's transaction is open already",
			 pki_errstr(pki_tramp_in_hook() ? EDEADLK : EBUSY));
		return pki_tramp_in_hook() ? -EDEADLK : -EBUSY;
	}
	pthread_once(&txn_key_once, txn_key_make);
	/* Before the transaction opens: the value may need memory (-ENOMEM, nothing open). */
	if (!txn_key_made || pthread_setspecific(txn_key, &txn_key_made)) {
		pki_warn("hooks: pk_txn_begin: cannot watch this thread's exit: %s\n",
			 pki_errstr(ENOMEM));
		return -ENOMEM;
	}
	err = pki_hook_enter();
	if (err) {
		pthread_setspecific(txn_key, NULL);
		return err;
	}
	pki_reg.txn_open = txn_mine = true;
	pki_hook_unlock();
	return 0;
}

/*
 * End this thread's transaction by committing it (@commit) or dropping it,
 * and let the others in.  In a broken fork child there is nothing to apply.
 */
static int txn_end(bool commit)
{
	int err = -ENOTRECOVERABLE;

	if (!txn_mine) {
		pki_warn("hooks: %s: this thread has no transaction open (pk_txn_begin): %s\n",
			 commit ? "pk_txn_commit" : "pk_txn_abort", pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (pki_tramp_in_hook()) {
		pki_warn("hooks: %s: called from inside a hook: %s\n",
			 commit ? "pk_txn_commit" : "pk_txn_abort", pki_errstr(EDEADLK));
		return -EDEADLK;
	}
	pki_held_lock(&pki_reg.lock);
	if (!pki_reg.broken) {
		err = 0;
		if (commit)
			err = __pki_hook_commit();
		else
			__pki_hook_undo();
	}
	pki_reg.txn_open = txn_mine = false;
	pthread_cond_broadcast(&txn_cv);
	pki_hook_unlock();
	pthread_setspecific(txn_key, NULL); /* made by pk_txn_begin(): no allocation */
	return err;
}

int pk_txn_commit(void)
{
	return txn_end(true);
}

int pk_txn_abort(void)
{
	int err = txn_end(false);

	return err == -ENOTRECOVERABLE ? 0 : err;
}

void pki_hook_unlock(void)
{
	for (;;) {
		pki_held_unlock(&pki_reg.lock);
		if (!pki_hook_objects_pending() || !pki_held_trylock(&pki_reg.lock))
			return;
		if (pki_reg.txn_open || pki_reg.broken) { /* applied when the transaction ends */
			pki_held_unlock(&pki_reg.lock);
			return;
		}
		__pki_hook_objects_apply();
	}
}

/* ---- fork ---- */

/*
 * fork() while other threads use the registry.  In the child only the
 * forking thread exists, so a lock another thread held stays held forever,
 * and a transaction another thread had open never ends.  Our atfork
 * handlers take, before fork(), every lock of the layer in its order:
 * pki_reg.lock (so no call is half done: the registry is consistent), then
 * the site table's refresh lock (sym/sites.c: a refresh is never half done
 * either), pend_lock, the grace-period queue's lock (gp.c) and tmem_lock (whose
 * handler also snapshots trampoline memory for the child, tmem.c).  Each is
 * held only for one call or less, and a transaction does not hold pki_reg.lock
 * between its calls, so fork() waits at most for one call in flight.  Calls
 * can still be long (a grace period waits for a thread that blocks our
 * signal; a patch batch waits up to its own timeout), so the wait for
 * pki_reg.lock is bounded (FORK_WAIT_S): past it fork() goes on without it, and
 * the child refuses every call with -ENOTRECOVERABLE (its registry may be
 * half changed; the hooks it inherited keep working).  In the child:
 *  - a transaction open in another thread is dropped: the child's registry
 *    is the committed state (the staged state was consistent: no call in
 *    flight).  The forking thread's own transaction stays open, its own.
 *  - the locks and condition variables are made anew (their waiters are gone).
 *
 * Order against the patch layer: its atfork handlers (poke.c) hold the patch
 * lock across fork(), and a call holding pki_reg.lock may be about to take it.
 * Prepare handlers run in reverse order of registration, so ours must be
 * registered after the patch layer's, or the forking thread would hold the
 * patch lock while waiting for pki_reg.lock.  The patch layer registers at its
 * first batch: we register once at first use (for forks before any batch)
 * and once more after the first batch; fork_depth makes the second set of
 * calls a no-op (glibc serialises fork()s, handlers included).
 */
#define FORK_WAIT_S 2

static unsigned int fork_depth; /* prepare calls in this fork() */
static bool fork_held;		/* prepare got pki_reg.lock */

static void hook_fork_prepare(void)
{
	struct timespec until;

	if (fork_depth++)
		return;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += FORK_WAIT_S;
	fork_held = !pki_held_clocklock(&pki_reg.lock, CLOCK_MONOTONIC, &until);
	if (!fork_held)
		pki_warn("hooks: fork() while a hook call of another thread ran for over %d s: "
			 "the child's hook calls will fail: %s\n",
			 FORK_WAIT_S, pki_errstr(ENOTRECOVERABLE));
	pki_sites_fork_prepare();
	pki_hook_objects_fork(PKI_HOOK_FORK_PREPARE);
	pki_hook_tramps_fork(PKI_HOOK_FORK_PREPARE);
	pki_gp_fork_prepare();
	pki_tmem_fork_prepare();
	pki_fprobe_fork(PKI_HOOK_FORK_PREPARE); /* a leaf: last */
}

static void hook_fork_parent(void)
{
	if (!fork_depth)
		return;
	fork_depth = 0;
	pki_fprobe_fork(PKI_HOOK_FORK_PARENT);
	pki_tmem_fork_parent();
	pki_gp_fork_parent();
	pki_hook_tramps_fork(PKI_HOOK_FORK_PARENT);
	pki_hook_objects_fork(PKI_HOOK_FORK_PARENT);
	pki_sites_fork_parent();
	if (fork_held)
		pki_held_unlock(&pki_reg.lock);
}

static void hook_fork_child(void)
{
	if (!fork_depth)
		return;
	fork_depth = 0;
	pki_tmem_fork_child(); /* first: before anything else runs a trampoline */
	pki_fprobe_fork(PKI_HOOK_FORK_CHILD);
	pki_hook_forced_fork_child();
	pki_gp_fork_child();
	pki_hook_tramps_fork(PKI_HOOK_FORK_CHILD);
	pki_hook_objects_fork(PKI_HOOK_FORK_CHILD);
	pki_sites_fork_child();
	pki_held_init(&pki_reg.lock); /* held by us, or by a thread that is gone */
	pthread_cond_init(&txn_cv, NULL);
	if (!fork_held) {
		pki_reg.broken = true;
		return;
	}
	if (pki_reg.txn_open && !txn_mine) {
		pki_held_lock(&pki_reg.lock); /* the child's only thread: never waits */
		__pki_hook_undo();
		pki_reg.txn_open = false;
		pki_held_unlock(&pki_reg.lock);
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
