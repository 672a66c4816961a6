// SPDX-License-Identifier: MIT
/*
 * pk_ops_register() and pk_ops_unregister(): an ops' filter resolved to
 * sites (once, sorted and unique), staged on each, committed by txn.c.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/held.h"
#include "base/log.h"
#include "base/opts.h"
#include "hook/registry.h"

/*
 * Forget @p: out of pki_reg.all_ops, and ops->private back to the committed record
 * it replaced in this transaction, if any (see ops_priv.prev).
 */
void __pki_hook_ops_priv_free(struct ops_priv *p)
{
	PKI_HELD(&pki_reg.lock);
	for (size_t i = 0; i < pki_reg.all_ops.n; i++)
		if (pki_reg.all_ops.v[i] == p) {
			pki_reg.all_ops.v[i] = pki_reg.all_ops.v[--pki_reg.all_ops.n];
			break;
		}
	if (p->ops->private == p)
		p->ops->private = p->prev;
	for (size_t i = 0; i < pki_reg.all_ops.n; i++)
		if (pki_reg.all_ops.v[i]->prev == p)
			pki_reg.all_ops.v[i]->prev = NULL;
	free(p->ips);
	free(p);
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
		return pki_reg.src->each(NULL, 0, ~0ul, pki_hook_collect_ip, c);
	for (size_t i = 0; i < f->nips && !err; i++)
		err = pki_hook_collect_ip(f->ips[i], c);
	for (size_t i = 0; i < f->nglobs && !err; i++) {
		size_t before = c->n;

		err = pki_reg.src->each(f->globs[i], 0, ~0ul, pki_hook_collect_ip, c);
		if (!err && c->n == before) {
			pki_warn("hooks: pk_ops_register: glob '%s' matches no site: %s\n",
				 f->globs[i], pki_errstr(ENOENT));
			err = -ENOENT;
		}
	}
	return err;
}

int pki_hook_filter_in(const struct pk_ops_filter *f, struct pk_ops_filter *out, const char *what)
{
	if (!f->sz && !f->ips && !f->nips && !f->globs && !f->nglobs) {
		*out = (struct pk_ops_filter){.sz = sizeof(*out)}; /* left all zero: empty */
		return 0;
	}
	return pki_opts_in(out, sizeof(*out), f, PKI_OPTS_END(struct pk_ops_filter, nglobs), what);
}

int pki_hook_filtered_in(void *out, size_t ours, const void *in, size_t min, size_t at,
			 const char *what)
{
	const struct pk_ops_filter *f = (const void *)((const char *)in + at);
	char name[128];
	size_t sz;
	int err;

	err = pki_opts_in(out, ours, in, min, what);
	if (err)
		return err;
	sz = *(const size_t *)in; /* >= min > at */
	if (f->sz > sz - at) {
		pki_warn("%s: filter.sz %zu runs past sz %zu: %s\n", what, f->sz, sz,
			 pki_errstr(EINVAL));
		return -EINVAL;
	}
	snprintf(name, sizeof(name), "%s->filter", what);
	return pki_hook_filter_in(f, (struct pk_ops_filter *)((char *)out + at), name);
}

/* @ops as this library knows it into @o (pki_hook_filtered_in). */
static int ops_in(const struct pk_ops *ops, struct pk_ops *o)
{
	if (!ops) {
		pki_warn("hooks: pk_ops_register: no ops: %s\n", pki_errstr(EINVAL));
		return -EINVAL;
	}
	return pki_hook_filtered_in(o, sizeof(*o), ops, PKI_OPTS_END(struct pk_ops, filter),
				    offsetof(struct pk_ops, filter), "hooks: pk_ops_register: ops");
}

int __pki_hook_ops_register(struct pk_ops *ops)
{
	PKI_HELD(&pki_reg.lock);
	struct collect c = {0};
	struct ops_priv *p, *prev;
	struct pk_ops o;
	struct site **ss;
	int err;

	err = ops_in(ops, &o);
	if (err)
		return err;
	if (!o.func || (o.flags & ~PK_OPS_F_NOVEC)) {
		pki_warn("hooks: pk_ops_register: %s: %s\n",
			 !o.func ? "the ops has no func" : "unknown flags", pki_errstr(EINVAL));
		return -EINVAL;
	}
	/* Registered, unless its unregister is staged in this transaction. */
	prev = ops->private;
	if (prev && (prev->staged || !prev->registered)) {
		pki_warn("hooks: pk_ops_register: this ops is registered already: %s\n",
			 pki_errstr(EBUSY));
		return -EBUSY;
	}
	err = resolve_filter(&o.filter, &c);
	if (err)
		goto free_ips;
	p = calloc(1, sizeof(*p));
	ss = calloc(c.n ? c.n : 1, sizeof(*ss));
	if (!p || !ss || GROW(pki_reg.changes, pki_reg.changes.n + 1) ||
	    GROW(pki_reg.all_ops, pki_reg.all_ops.n + 1)) {
		err = -ENOMEM;
		goto free_p;
	}
	for (size_t i = 0; i < c.n && !err; i++) {
		err = __pki_hook_site_get(c.ips[i], &ss[i]);
		if (!err)
			c.ips[i] = ss[i]->ip; /* a function's address -> its site */
		else if (err == -ENOENT || err == -EBUSY)
			pki_warn("hooks: pk_ops_register: %#lx is %s: %s\n", c.ips[i],
				 err == -ENOENT ? "no site" : "someone else's code, not a site",
				 pki_errstr(-err));
	}
	if (err)
		goto free_p;
	collect_unique(&c);
	for (size_t i = 0; i < c.n; i++)
		ss[i] = __pki_hook_site_find(c.ips[i]);
	for (size_t i = 0; i < c.n && !err; i++)
		err = __pki_hook_site_prepare(ss[i], 1);
	if (err)
		goto free_p;
	/* Nothing fails from here. */
	*p = (struct ops_priv){.ops = ops,
			       .ips = c.ips,
			       .nips = c.n,
			       .cap_ips = c.n,
			       .staged = true,
			       .follows = !o.filter.nips || o.filter.nglobs,
			       .filter = o.filter,
			       .prev = prev};
	p->filter.ips = NULL; /* the caller's, which need not outlive this call */
	ops->private = p;
	pki_reg.all_ops.v[pki_reg.all_ops.n++] = p;
	for (size_t i = 0; i < c.n; i++)
		ss[i]->ops.v[ss[i]->ops.n++] = ops;
	pki_reg.changes.v[pki_reg.changes.n++] = (struct ops_change){p, true};
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
	int err = pki_hook_enter();

	if (err)
		return err;
	return pki_hook_leave(__pki_hook_ops_register(ops));
}

int __pki_hook_ops_unregister(struct pk_ops *ops)
{
	PKI_HELD(&pki_reg.lock);
	struct ops_priv *p = ops ? ops->private : NULL;
	int err;

	if (!p || !p->staged) {
		pki_warn("hooks: pk_ops_unregister: this ops is not registered: %s\n",
			 pki_errstr(ENOENT));
		return -ENOENT;
	}
	err = p->registered ? GROW(pki_reg.changes, pki_reg.changes.n + 1) : 0;
	for (size_t i = 0; i < p->nips && !err; i++)
		err = __pki_hook_site_prepare(__pki_hook_site_find(p->ips[i]), 0);
	if (err)
		return err;
	for (size_t i = 0; i < p->nips; i++) {
		struct ops_vec *v = &__pki_hook_site_find(p->ips[i])->ops;

		for (unsigned int j = 0; j < v->n; j++)
			if (v->v[j] == ops) {
				memmove(&v->v[j], &v->v[j + 1], (v->n - j - 1) * sizeof(v->v[0]));
				v->n--;
				break;
			}
	}
	p->staged = false;
	if (p->registered) {
		pki_reg.changes.v[pki_reg.changes.n++] = (struct ops_change){p, false};
		return 0;
	}
	/*
	 * Registered in this same transaction: drop its change and the record
	 * now (it has no trampoline yet: those are made at commit), so the net
	 * effect is nothing, and ops->private is what it was at begin.
	 */
	for (size_t i = 0; i < pki_reg.changes.n; i++)
		if (pki_reg.changes.v[i].p == p) {
			memmove(&pki_reg.changes.v[i], &pki_reg.changes.v[i + 1],
				(pki_reg.changes.n - i - 1) * sizeof(pki_reg.changes.v[0]));
			pki_reg.changes.n--;
			break;
		}
	__pki_hook_ops_priv_free(p);
	return 0;
}

int pk_ops_unregister(struct pk_ops *ops)
{
	int err = pki_hook_enter();

	if (err)
		return err;
	return pki_hook_leave(__pki_hook_ops_unregister(ops));
}

bool pki_hook_shstk;

static void shstk_read(void)
{
	pki_hook_shstk = pki_arch_shstk();
}

void pki_hook_shstk_init(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, shstk_read);
}

/*
 * The outermost level's exit (tramp.S, X slow exits) returns to the caller
 * when skip is 1: tramp.h.  The recursion guard runs callbacks at level 0
 * only, so level 0 is "inside a callback", unless it is an exit callback's
 * counted section (gp.h, pki_gp_read_begin()), which marks skip 2 for its
 * length: no function to skip there.  Vector-free (a NOVEC callback may
 * call it): no libc.  Under a CET shadow stack the skip exit of a site
 * entered by a call would leave the site's return on it: refused.
 */
__attribute__((target("general-regs-only"))) int pk_regs_skip(struct pk_regs *regs,
							      unsigned long ret)
{
	struct pki_tramp_tls *me = &pki_tramp_tls;

	if (!regs || me->nest != 0 || me->skip == PKI_TRAMP_SKIP_NONE)
		return -EINVAL;
	if (pki_hook_shstk)
		return -EOPNOTSUPP;
	regs->ax = ret;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	me->skip = PKI_TRAMP_SKIP;
	return 0;
}
