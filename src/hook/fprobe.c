// SPDX-License-Identifier: MIT
/*
 * pk_fprobe_register() and pk_fprobe_unregister() (include/probekit/
 * fprobe.h): a fprobe is an ops whose callback (fprobe_hot.c) runs the
 * entry and hijacks the return, and a place in the table its pending exits
 * find it by (doc/design/exit-hooks.md, X2, X6, X7).
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "hook/fprobe_int.h"
#include "hook/gp.h"
#include "hook/registry.h"

static pthread_mutex_t fp_lock = PTHREAD_MUTEX_INITIALIZER; /* the table's writers */
static uint64_t fp_gen;					    /* under fp_lock */
static uint32_t fp_hint;				    /* under fp_lock */

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

/*
 * X6: functions that return twice, or whose second return is another
 * stack's (a vfork child's on its parent's frame): the hijacked return is
 * taken by the first, and the second would go where the first went.
 */
static const char *const twice[] = {"setjmp",  "_setjmp",    "sigsetjmp",    "__sigsetjmp", "vfork",
				    "__vfork", "getcontext", "__getcontext", "savectx"};

/* The name of a function of @p's sites that returns twice, or NULL. */
static const char *returns_twice(const struct pki_fprobe *p)
{
	const struct ops_priv *o = p->ops.private;

	for (size_t k = 0; k < sizeof(twice) / sizeof(twice[0]); k++) {
		unsigned long a = (unsigned long)dlsym(RTLD_DEFAULT, twice[k]);

		for (size_t i = 0; a && i < o->nips; i++)
			if (o->ips[i] == a || o->ips[i] == a + 4) /* (behind an endbr64) */
				return twice[k];
	}
	return NULL;
}

static int check(const struct pk_fprobe *fp)
{
	const char *why = NULL;

	if (!fp)
		why = "no fprobe";
	else if (!fp->entry && !fp->exit)
		why = "neither an entry nor an exit callback";
	else if (fp->data_size > PK_FPROBE_DATA_MAX)
		why = "data_size is above PK_FPROBE_DATA_MAX";
	else if (fp->flags & ~PK_FPROBE_F_NOVEC)
		why = "unknown flags";
	if (why) {
		pki_warn("hooks: pk_fprobe_register: %s: %s\n", why, pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (fp->private) {
		pki_warn("hooks: pk_fprobe_register: this fprobe is registered already: %s\n",
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

/* Under the registry (pki_hook_enter): stage @p's ops, refused if it would return twice. */
static int stage(struct pki_fprobe *p)
{
	const char *name;
	int err;

	if (pki_reg.txn_open) {
		pki_warn("hooks: pk_fprobe_register/unregister: not inside a transaction: %s\n",
			 pki_errstr(EBUSY));
		return -EBUSY;
	}
	err = __pki_hook_ops_register(&p->ops);
	if (err || !p->fp->exit || !(name = returns_twice(p)))
		return err;
	__pki_hook_ops_unregister(&p->ops); /* staged only: nothing was written */
	pki_warn("hooks: pk_fprobe_register: %s returns twice; an exit callback cannot follow "
		 "it (register it with an entry callback only): %s\n",
		 name, pki_errstr(EINVAL));
	return -EINVAL;
}

int pk_fprobe_register(struct pk_fprobe *fp)
{
	struct pki_fprobe *p;
	int err = check(fp);

	if (err)
		return err;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	*p =
	    (struct pki_fprobe){.ops = {.func = pki_fprobe_entry,
					.data = p,
					.flags = fp->flags & PK_FPROBE_F_NOVEC ? PK_OPS_F_NOVEC : 0,
					.filter = fp->filter},
				.fp = fp};
	pthread_mutex_lock(&fp_lock);
	err = fp->exit ? exits_ready() : 0;
	if (!err)
		err = slot_claim(p);
	pthread_mutex_unlock(&fp_lock);
	if (err == -ENOSPC)
		pki_warn("hooks: pk_fprobe_register: %d fprobes are registered already: %s\n",
			 PKI_FPROBE_MAX, pki_errstr(ENOSPC));
	if (err)
		goto free_p;
	err = pki_hook_enter();
	if (!err)
		err = pki_hook_leave(stage(p));
	if (!err) {
		fp->private = p;
		return 0;
	}
	pthread_mutex_lock(&fp_lock);
	slot_free(p); /* no entry ran: the ops never was committed */
	pthread_mutex_unlock(&fp_lock);
free_p:
	free(p);
	return err;
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
	err = pki_hook_enter();
	if (err)
		return err;
	if (pki_reg.txn_open) {
		pki_hook_unlock();
		pki_warn("hooks: pk_fprobe_unregister: not inside a transaction: %s\n",
			 pki_errstr(EBUSY));
		return -EBUSY;
	}
	err = pki_hook_leave(__pki_hook_ops_unregister(&p->ops));
	if (err)
		return err;
	pthread_mutex_lock(&fp_lock);
	slot_free(p);
	pthread_mutex_unlock(&fp_lock);
	err = pki_gp_synchronize();
	if (err) /* (-EDEADLK: from a callback, refused by pki_hook_enter already) */
		return err;
	fp->private = NULL;
	free(p);
	return 0;
}

int pk_fprobe_stats(const struct pk_fprobe *fp, struct pk_fprobe_stats *st)
{
	const struct pki_fprobe *p = fp ? fp->private : NULL;

	if (!st)
		return -EINVAL;
	memset(st, 0, sizeof(*st));
	st->dropped = __atomic_load_n(&pki_fprobe_dropped, __ATOMIC_RELAXED);
	if (!p)
		return fp ? -ENOENT : 0;
	st->unwound = __atomic_load_n(&p->unwound, __ATOMIC_RELAXED);
	st->deep = __atomic_load_n(&p->deep, __ATOMIC_RELAXED);
	st->skipped = __atomic_load_n(&p->skipped, __ATOMIC_RELAXED);
	return 0;
}
