// SPDX-License-Identifier: MIT
/* Growing arrays (grow.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"

/* @vp: the address of the array pointer, read and written with memcpy (any pointer type). */
int pki_grow_(void *vp, size_t *cap, size_t want, size_t size)
{
	void *v, *n;
	size_t c;

	if (want <= *cap)
		return 0;
	for (c = *cap ? 2 * *cap : 16; c < want; c *= 2)
		;
	memcpy(&v, vp, sizeof(v));
	n = realloc(v, c * size);
	if (!n)
		return -ENOMEM;
	memcpy(vp, &n, sizeof(n));
	*cap = c;
	return 0;
}
