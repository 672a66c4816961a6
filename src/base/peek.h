/* SPDX-License-Identifier: MIT */
/*
 * Reading our own memory where it may not be mapped (a jump table a decoder
 * points at, text about to be aliased): process_vm_readv() on ourselves
 * returns an error instead of faulting.
 */
#ifndef PK_BASE_PEEK_H
#define PK_BASE_PEEK_H

#include <errno.h>
#include <stddef.h>
#include <sys/uio.h>
#include <unistd.h>

/* Copy @len bytes at @addr into @buf: 0, or -errno (-EFAULT for a short read). */
static inline int pki_peek(const void *addr, void *buf, size_t len)
{
	struct iovec local = {buf, len}, remote = {(void *)addr, len};

	errno = 0;
	if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)len)
		return 0;
	return errno ? -errno : -EFAULT;
}

#endif /* PK_BASE_PEEK_H */
