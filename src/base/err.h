/* SPDX-License-Identifier: MIT */
/*
 * The API's error convention (include/probekit/probekit.h) in one place:
 * actions return a negative errno and leave errno alone; a constructor, and
 * the one getter that returns a value rather than a status
 * (pk_tramp_addr), return NULL (0) with errno set.  Every such return goes
 * through pki_err_ptr(), as libbpf's through libbpf_err_ptr(): errno is
 * then set last, after whatever message or cleanup came before (either may
 * change it), and from the negative errno the library's internals pass
 * around.
 */
#ifndef PK_BASE_ERR_H
#define PK_BASE_ERR_H

#include <errno.h>
#include <stddef.h>

/* A constructor's failure: errno = -@err (@err < 0), and NULL. */
static inline void *pki_err_ptr(int err)
{
	errno = -err;
	return NULL;
}

#endif /* PK_BASE_ERR_H */
