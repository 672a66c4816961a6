/* SPDX-License-Identifier: MIT */
/*
 * Growing arrays: room for @want elements in array @v of capacity @cap
 * (any integer lvalue), doubled from 16 as needed.  0, or -ENOMEM with the
 * array unchanged.
 */
#ifndef PK_BASE_GROW_H
#define PK_BASE_GROW_H

#include <stddef.h>

int pki_grow_(void *vp, size_t *cap, size_t want, size_t size);

#define PKI_GROW(v, cap, want)                                                                     \
	({                                                                                         \
		size_t __cap = (cap);                                                              \
		int __e = pki_grow_(&(v), &__cap, (want), sizeof(*(v)));                           \
		(cap) = __cap;                                                                     \
		__e;                                                                               \
	})

#endif /* PK_BASE_GROW_H */
