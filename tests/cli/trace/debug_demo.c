// SPDX-License-Identifier: MIT
/*
 * A program whose functions are named only by its symbol table: the test
 * (test-trace-debugfile.sh) strips it and puts its symbols in a separate
 * debug file.  Built plainly (no patchable entry: traced by relocation).
 * Prints "calls NAME N" for each of its functions.
 */
#include <stdio.h>

static volatile unsigned long sink;

__attribute__((noinline)) static unsigned long dbg_square(unsigned long x)
{
	sink += x;
	return x * x;
}

__attribute__((noinline)) static unsigned long dbg_sum(unsigned long n)
{
	unsigned long s = 0;

	for (unsigned long i = 0; i < n; i++)
		s += dbg_square(i);
	sink += s;
	return s;
}

int main(void)
{
	unsigned long total = 0;

	for (int i = 0; i < 40; i++)
		total += dbg_sum(25);
	printf("calls dbg_sum 40\ncalls dbg_square 1000\ntotal %lu\n", total);
	return 0;
}
