// SPDX-License-Identifier: MIT
/*
 * Target for `probekit watch '*SYMBOL'`: `cur` points to a heap object,
 * replaced NOBJS times; bump() writes the field `b` of the current object
 * NBUMPS times.  `fixed` points to the static `target` from the start,
 * which poke() writes twice.  Prints what it did.
 */
#include <stdio.h>
#include <stdlib.h>

#define NOBJS  3
#define NBUMPS 3

struct obj {
	long a, b;
};

struct obj *volatile cur;
long target;
long *volatile fixed = &target;

__attribute__((noinline)) void bump(struct obj *o)
{
	o->b++;
}

__attribute__((noinline)) void poke(void)
{
	(*fixed)++;
}

int main(void)
{
	struct obj *old = NULL;

	for (int i = 0; i < NOBJS; i++) {
		struct obj *o = calloc(1, sizeof(*o));

		if (!o)
			return 1;
		cur = o;
		for (int k = 0; k < NBUMPS; k++)
			bump(cur);
		free(old);
		old = o;
	}
	poke();
	poke();
	printf("objects %d bumps %d target %ld\n", NOBJS, NOBJS * NBUMPS, target);
	free(old);
	return 0;
}
