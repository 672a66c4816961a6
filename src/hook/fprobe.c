// SPDX-License-Identifier: MIT
/*
 * pk_fprobe_register() and pk_fprobe_unregister() (include/probekit/
 * fprobe.h): a fprobe is an ops whose callback (fprobe_hot.c) runs the
 * entry and hijacks the return, and a place in the table its pending exits
 * find it by (doc/design/exit-hooks.md, X2, X6, X7).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/err.h"
#include "base/log.h"
#include "base/opts.h"
#include "hook/fprobe_int.h"
#include "hook/gp.h"
#include "hook/registry.h"

/* Under the registry's lock (pki_hook_enter), which fork() handles. */
static uint64_t fp_gen;
static uint32_t fp_hint;

/* X2: a free index for @p, its handle made; -ENOSPC. */
static int slot_claim(struct pki_fprobe *p)
{
	for (uint32_t k = 0; k < PKI_FPROBE_MAX; k++) {
		uint32_t i = (fp_hint + k) % PKI_FPROBE_MAX;

		if (pki_fprobe_table[i])
			continue;
		p->handle = ++fp_gen << 17 | (i + 1);
		__atomic_store_n(&pki_fprobe_table[i], p, __ATOMIC_RELEASE);
		fp_hint = i + 1;
		return 0;
	}
	return -ENOSPC;
}

static void slot_free(const struct pki_fprobe *p)
{
	__atomic_store_n(&pki_fprobe_table[PKI_FPROBE_IDX(p->handle)], NULL, __ATOMIC_RELEASE);
}

/* The name of a function of @p's sites that cannot have an exit (X6), or NULL. */
static const char *cannot_exit(const struct pki_fprobe *p)
{
	const struct ops_priv *o = p->ops.private;
	struct pki_no_exit_set set;
	const char *name = NULL;

	pki_no_exit_resolve(&set);
	for (size_t i = 0; !name && i < o->nips; i++)
		name = pki_no_exit_in(&set, o->ips[i]);
	return name;
}

/*
 * @fp as this library knows it into @f (sized: pki_hook_filtered_in(), as
 * an ops), then its fields; for pk_fprobe_tramp_new() if @tramp (the log
 * names the caller).
 */
static int fprobe_in(const struct pk_fprobe *fp, struct pk_fprobe *f, bool tramp)
{
	const char *fn = tramp ? "pk_fprobe_tramp_new" : "pk_fprobe_register", *why = NULL;
	int err;

	if (!fp) {
		pki_warn("hooks: %s: no fprobe: %s\n", fn, pki_errstr(EINVAL));
		return -EINVAL;
	}
	err = pki_hook_filtered_in(f, sizeof(*f), fp, PKI_OPTS_END(struct pk_fprobe, filter),
				   offsetof(struct pk_fprobe, filter),
				   tramp ? "hooks: pk_fprobe_tramp_new: fprobe"
					 : "hooks: pk_fprobe_register: fprobe");
	if (err)
		return err;
	if (!f->entry && !f->exit)
		why = "neither an entry nor an exit callback";
	else if (f->data_size > PK_FPROBE_DATA_MAX)
		why = "data_size is above PK_FPROBE_DATA_MAX";
	else if (f->flags & ~PK_FPROBE_F_NOVEC)
		why = "unknown flags";
	if (why) {
		pki_warn("hooks: %s: %s: %s\n", fn, why, pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (f->private) {
		pki_warn("hooks: %s: this fprobe is registered already: %s\n", fn,
			 pki_errstr(EBUSY));
		return -EBUSY;
	}
	return 0;
}

/* X7: what exits need once per process: the shadow stacks, and where their exits go. */
static int exits_ready(void)
{
	int err;

	if (pki_fgraph_shstk()) {
		pki_warn("hooks: pk_fprobe_register: this thread runs with a CET shadow stack, "
			 "which a hijacked return would break: exit callbacks are refused: %s\n",
			 pki_errstr(EOPNOTSUPP));
		return -EOPNOTSUPP;
	}
	err = pki_fgraph_init();
	if (!err)
		pki_fgraph_probe_exit = pki_fprobe_exit;
	return err;
}

/*
 * Under the registry: stage @p's ops, refused if one of its functions
 * cannot have its return replaced, and give it its place in the table (X2).
 */
static int stage(struct pki_fprobe *p)
{
	const char *name;
	int err;

	if (pki_reg.txn_open) {
		pki_warn("hooks: pk_fprobe_register: not inside a transaction: %s\n",
			 pki_errstr(EBUSY));
		return -EBUSY;
	}
	err = p->fp->exit ? exits_ready() : 0;
	if (!err)
		err = __pki_hook_ops_register(&p->ops);
	if (err)
		return err;
	name = p->fp->exit ? cannot_exit(p) : NULL;
	if (name) {
		__pki_hook_ops_unregister(&p->ops); /* staged only: nothing was written */
		pki_warn("hooks: pk_fprobe_register: %s returns twice, on another stack, or reads "
			 "its return address; an exit callback cannot follow it (register it with "
			 "an entry callback only): %s\n",
			 name, pki_errstr(EINVAL));
		return -EINVAL;
	}
	err = slot_claim(p);
	if (err) {
		__pki_hook_ops_unregister(&p->ops);
		pki_warn("hooks: pk_fprobe_register: %d fprobes are registered already: %s\n",
			 PKI_FPROBE_MAX, pki_errstr(ENOSPC));
	}
	return err;
}

int pk_fprobe_register(struct pk_fprobe *fp)
{
	struct pk_fprobe f;
	struct pki_fprobe *p;
	int err = fprobe_in(fp, &f, false);

	if (err)
		return err;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	*p = (struct pki_fprobe){.ops = {.sz = sizeof(p->ops),
					 .func = pki_fprobe_entry,
					 .data = p,
					 .flags = f.flags & PK_FPROBE_F_NOVEC ? PK_OPS_F_NOVEC : 0,
					 .filter = f.filter},
				 .fp = fp};
	err = pki_hook_enter();
	if (err) {
		free(p);
		return err;
	}
	err = stage(p);
	if (err) {
		pki_hook_leave(err);
		free(p); /* never published */
		return err;
	}
	err = pki_hook_leave(0); /* the commit */
	if (err) {
		/*
		 * No entry ran, but the place was published: a pending exit of an
		 * earlier fprobe of the same place may be reading the record.
		 */
		slot_free(p);
		pki_gp_defer(free, p);
		return err;
	}
	fp->private = p;
	if (f.exit)
		pki_hook_forced_unwind(); /* once: thread cancellation (X8) */
	return 0;
}

/*
 * X5: the entry hook off (its grace period: no thread is inside the entry
 * callback), then the table's place emptied and a second grace period: no
 * thread is inside the exit callback, and a pending exit finds the place
 * empty or another fprobe's handle from now on.
 */
int pk_fprobe_unregister(struct pk_fprobe *fp)
{
	struct pki_fprobe *p = fp ? fp->private : NULL;
	int err;

	if (!p) {
		pki_warn("hooks: pk_fprobe_unregister: this fprobe is not registered: %s\n",
			 pki_errstr(ENOENT));
		return -ENOENT;
	}
	if (p->tramp) {
		pki_warn("hooks: pk_fprobe_unregister: this fprobe is a trampoline's: "
			 "pk_tramp_free() ends it: %s\n",
			 pki_errstr(EINVAL));
		return -EINVAL;
	}
	err = pki_hook_enter();
	if (err)
		return err;
	if (pki_reg.txn_open) {
		pki_hook_unlock();
		pki_warn("hooks: pk_fprobe_unregister: not inside a transaction: %s\n",
			 pki_errstr(EBUSY));
		return -EBUSY;
	}
	if (p->ops.private) {
		err = pki_hook_leave(__pki_hook_ops_unregister(&p->ops));
		if (err)
			return err;
	} else {
		pki_hook_unlock(); /* a call again after a failed grace period (below) */
	}
	slot_free(p);
	err = pki_gp_synchronize();
	if (err) /* the entries are off; a call again retries the rest */
		return err;
	fp->private = NULL;
	free(p);
	return 0;
}

int pk_fprobe_stats(const struct pk_fprobe *fp, struct pk_fprobe_stats *st)
{
	const struct pki_fprobe *p = fp ? fp->private : NULL;
	struct pk_fprobe_stats s = {.sz = sizeof(s)};

	if (!st || pki_opts_out_check(st, PKI_OPTS_END(struct pk_fprobe_stats, dropped),
				      "hooks: pk_fprobe_stats: st"))
		return -EINVAL;
	s.dropped = __atomic_load_n(&pki_fprobe_dropped, __ATOMIC_RELAXED);
	if (p) {
		s.unwound = __atomic_load_n(&p->unwound, __ATOMIC_RELAXED);
		s.deep = __atomic_load_n(&p->deep, __ATOMIC_RELAXED);
		s.skipped = __atomic_load_n(&p->skipped, __ATOMIC_RELAXED);
	}
	pki_opts_out(st, &s, sizeof(s));
	return p || !fp ? 0 : -ENOENT;
}

/*
 * Fprobe trampolines (pk_fprobe_tramp_new()): a pk_tramp whose handler is
 * pki_fprobe_tramp_entry(), given the fprobe's record, which has a place in
 * the table like a registered fprobe's but no ops.  Records are recycled:
 * a parked trampoline comes back only with the record it was made for
 * (tramp.c), so reusing records keeps a program that makes and frees
 * fprobe trampolines in a loop from growing.
 */
static pthread_mutex_t recs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pki_fprobe *recs_free; /* linked through fp */

static struct pki_fprobe *rec_get(void)
{
	struct pki_fprobe *p;

	pthread_mutex_lock(&recs_lock);
	p = recs_free;
	if (p)
		recs_free = (struct pki_fprobe *)p->fp;
	pthread_mutex_unlock(&recs_lock);
	return p ? p : calloc(1, sizeof(*p));
}

static void rec_put(void *arg)
{
	struct pki_fprobe *p = arg;

	pthread_mutex_lock(&recs_lock);
	p->fp = (struct pk_fprobe *)recs_free;
	recs_free = p;
	pthread_mutex_unlock(&recs_lock);
}

/*
 * pk_tramp_free() parked the trampoline: no site reaches the handler any
 * more.  X5 as for an unregister: the place emptied, then a grace period
 * (no thread is inside either callback: the user may free the fprobe).
 */
static void tramp_rec_free(void *arg)
{
	struct pki_fprobe *p = arg;
	struct pk_fprobe *fp = p->fp;
	int err;

	slot_free(p); /* a store: slot_claim() runs under the registry, reads it or not */
	/*
	 * pk_tramp_free() promises its caller that neither callback runs any
	 * more: wait until that is so (it checked it is not in a callback; a
	 * grace period fails otherwise only for want of memory).
	 */
	while ((err = pki_gp_synchronize()) != 0)
		usleep(1000);
	fp->private = NULL;
	rec_put(p);
}

struct pk_tramp *pk_fprobe_tramp_new(struct pk_fprobe *fp)
{
	struct pk_fprobe f;
	struct pki_fprobe *p;
	struct pk_tramp *t;
	int err = fprobe_in(fp, &f, true);

	if (!err && (f.filter.nips || f.filter.nglobs)) {
		pki_warn("hooks: pk_fprobe_tramp_new: a trampoline's sites are those of "
			 "pk_direct_add(), not a filter: %s\n",
			 pki_errstr(EINVAL));
		err = -EINVAL;
	}
	if (!err && f.exit)
		err = exits_ready();
	if (err)
		return pki_err_ptr(err);
	p = rec_get();
	if (!p)
		return pki_err_ptr(-ENOMEM);
	*p = (struct pki_fprobe){.fp = fp, .tramp = true};
	err = pki_hook_enter();
	if (!err) {
		err = slot_claim(p);
		pki_hook_unlock();
	}
	if (err) {
		if (err == -ENOSPC)
			pki_warn("hooks: pk_fprobe_tramp_new: %d fprobes are registered already: "
				 "%s\n",
				 PKI_FPROBE_MAX, pki_errstr(ENOSPC));
		rec_put(p); /* never published */
		return pki_err_ptr(err);
	}
	t = pki_hook_tramp_new_arg(pki_fprobe_tramp_entry, p, tramp_rec_free,
				   f.flags & PK_FPROBE_F_NOVEC ? PK_TRAMP_F_NOVEC : 0,
				   f.exit != NULL);
	if (!t) {
		err = -errno;
		slot_free(p); /* published, but no thread could reach it: no site has it */
		pki_gp_defer(rec_put, p);
		return pki_err_ptr(err);
	}
	fp->private = p;
	if (f.exit)
		pki_hook_forced_unwind();
	return t;
}

void pki_fprobe_fork(enum pki_hook_fork stage)
{
	pki_hook_mutex_fork(&recs_lock, stage);
}
