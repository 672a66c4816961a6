// SPDX-License-Identifier: MIT
/*
 * The direct API (seed 003): ONE internal direct ops owning the ip -> addr
 * hash of all direct entries, kept as each site's `direct` word; staged
 * here, decided and committed by site.c and txn.c.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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
		err = __pki_hook_site_get(ip, &ss[i]);
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
		err = __pki_hook_site_prepare(ss[i], 0);
	if (!err)
		for (size_t i = 0; i < n; i++)
			ss[i]->direct = op == DIRECT_DEL ? 0 : e[i].addr;
	free(ss);
	return err;
}

int pk_direct_add(const struct pk_direct_entry *e, size_t n)
{
	int err = pki_hook_enter();

	if (err)
		return err;
	return pki_hook_leave(__direct_stage(DIRECT_ADD, NULL, e, n));
}

int pk_direct_del(const unsigned long *ips, size_t n)
{
	int err = pki_hook_enter();

	if (err)
		return err;
	return pki_hook_leave(__direct_stage(DIRECT_DEL, ips, NULL, n));
}

int pk_direct_mod(const struct pk_direct_entry *e, size_t n)
{
	int err = pki_hook_enter();

	if (err)
		return err;
	return pki_hook_leave(__direct_stage(DIRECT_MOD, NULL, e, n));
}

int pk_direct_sync(void)
{
	return pki_gp_synchronize();
}
