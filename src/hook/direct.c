// SPDX-License-Identifier: MIT
/*
 * The direct API (seed 003): ONE internal direct ops owning the ip -> addr
 * hash of all direct entries, kept as each site's `direct` word; staged
 * here, decided and committed by site.c and txn.c.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/held.h"
#include "base/log.h"
#include "hook/fprobe_int.h"
#include "hook/gp.h"
#include "hook/registry.h"

enum direct_op { DIRECT_ADD, DIRECT_DEL, DIRECT_MOD };

static int cmp_ptr(const void *a, const void *b)
{
	const struct site *const *pa = a, *const *pb = b;
	uintptr_t x = (uintptr_t)*pa, y = (uintptr_t)*pb;

	return x < y ? -1 : x > y;
}

/* -EINVAL if a site appears twice in @ss (sorting a copy: batches may be big). */
static int sites_unique(const char *call, struct site *const *ss, size_t n)
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
		if (v[i] == v[i - 1]) {
			pki_warn("hooks: %s: site %#lx is in the batch twice: %s\n", call, v[i]->ip,
				 pki_errstr(EINVAL));
			err = -EINVAL;
		}
	free(v);
	return err;
}

static const char *const direct_call[] = {"pk_direct_add", "pk_direct_del", "pk_direct_mod"};

/*
 * Entry @i (ip @ip) of a batch refused with @err: say why (@why, or what
 * __pki_hook_site_get()'s @err means), and return @err.
 */
static int direct_refuse(enum direct_op op, size_t i, unsigned long ip, int err, const char *why)
{
	if (!why)
		why = err == -ENOENT  ? "is no site"
		      : err == -EBUSY ? "is someone else's code, not a site"
				      : "cannot be hooked";
	if (err != -ENOMEM)
		pki_warn("hooks: %s: entry %zu: %#lx %s: %s\n", direct_call[op], i, ip, why,
			 pki_errstr(-err));
	return err;
}

/*
 * A trampoline with an exit hook (pk_fprobe_tramp_new()) for entry @i at
 * @ip: refused if the function cannot have one (X6), @set resolved at the
 * first such entry of the batch.
 */
static int direct_exit_check(enum direct_op op, size_t i, unsigned long ip,
			     struct pki_no_exit_set *set)
{
	char why[128];
	const char *name;

	if (set->n == SIZE_MAX)
		pki_no_exit_resolve(set);
	name = pki_no_exit_in(set, ip);
	if (!name)
		return 0;
	snprintf(why, sizeof(why),
		 "is %s, which returns twice, on another stack, or reads its return address: "
		 "no exit hook can follow it",
		 name);
	return direct_refuse(op, i, ip, -EINVAL, why);
}

static int __direct_stage(enum direct_op op, const unsigned long *ips,
			  const struct pk_direct_entry *e, size_t n)
{
	PKI_HELD(&pki_reg.lock);
	struct site **ss = calloc(n ? n : 1, sizeof(*ss));
	struct pki_no_exit_set no_exit = {.n = SIZE_MAX}; /* resolved when needed */
	int err = 0;

	if (!ss)
		return -ENOMEM;
	for (size_t i = 0; i < n && !err; i++) {
		unsigned long ip = e ? e[i].ip : ips[i];

		if (e && !e[i].addr) {
			err =
			    direct_refuse(op, i, ip, -EINVAL, "has no trampoline address (addr 0)");
			break;
		}
		err = __pki_hook_site_get(ip, &ss[i]);
		if (err)
			direct_refuse(op, i, ip, err, NULL);
		else if (op == DIRECT_ADD && ss[i]->direct)
			err = direct_refuse(op, i, ip, -EEXIST,
					    "has a direct trampoline already (pk_direct_mod "
					    "changes it)");
		else if (op != DIRECT_ADD && !ss[i]->direct)
			err = direct_refuse(op, i, ip, -ENOENT, "has no direct trampoline");
		else if (op != DIRECT_DEL && pki_hook_tramp_hijacks(e[i].addr))
			err = direct_exit_check(op, i, ip, &no_exit);
	}
	if (!err)
		err = sites_unique(direct_call[op], ss, n);
	for (size_t i = 0; i < n && !err; i++)
		err = __pki_hook_site_prepare(ss[i], 0);
	if (!err)
		for (size_t i = 0; i < n; i++)
			ss[i]->direct = op == DIRECT_DEL ? 0 : e[i].addr;
	free(ss);
	return err;
}

/* An array argument of @n > 0 entries that is NULL: -EINVAL, said, nothing staged. */
static int direct_null(enum direct_op op, const void *v, size_t n)
{
	if (v || !n)
		return 0;
	pki_warn("hooks: %s: %zu entries at NULL: %s\n", direct_call[op], n, pki_errstr(EINVAL));
	return -EINVAL;
}

int pk_direct_add(const struct pk_direct_entry *e, size_t n)
{
	int err = direct_null(DIRECT_ADD, e, n);

	if (!err)
		err = pki_hook_enter();
	if (err)
		return err;
	return pki_hook_leave(__direct_stage(DIRECT_ADD, NULL, e, n));
}

int pk_direct_del(const unsigned long *ips, size_t n)
{
	int err = direct_null(DIRECT_DEL, ips, n);

	if (!err)
		err = pki_hook_enter();
	if (err)
		return err;
	return pki_hook_leave(__direct_stage(DIRECT_DEL, ips, NULL, n));
}

int pk_direct_mod(const struct pk_direct_entry *e, size_t n)
{
	int err = direct_null(DIRECT_MOD, e, n);

	if (!err)
		err = pki_hook_enter();
	if (err)
		return err;
	return pki_hook_leave(__direct_stage(DIRECT_MOD, NULL, e, n));
}

int pk_direct_sync(void)
{
	return pki_gp_synchronize();
}
