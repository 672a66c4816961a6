// SPDX-License-Identifier: MIT
/*
 * An allocator preloaded in front of libc's, as jemalloc or tcmalloc are:
 * unversioned malloc and free, to which PROG's versioned references
 * (malloc@GLIBC_2.2.5) bind.  It serves them from libc's.
 */
#include <stddef.h>

extern void *__libc_malloc(size_t n);
extern void __libc_free(void *p);

void *malloc(size_t n)
{
	return __libc_malloc(n);
}

void free(void *p)
{
	__libc_free(p);
}
