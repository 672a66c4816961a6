// SPDX-License-Identifier: MIT
/*
 * For `probekit trace`'s library calls: calls into libc with counts the
 * program knows, printed at the end as "name count" lines.  Some go through
 * a tail call from a traced function (its return slot is hijacked), some
 * from a callback libc calls (qsort's comparator), and libc calls the same
 * functions itself (fopen's malloc), which are not the program's calls.
 * open and open64 are one function of libc's, called by both names.
 * free's address is taken: a non-PIE build defines it at its PLT entry.
 * Built without patchable entries, as a distribution binary is.
 * usage: libcalls [N]
 */
#undef _FILE_OFFSET_BITS /* (the build's): open and open64 by their own names */
#define _LARGEFILE64_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned long compares;
void (*volatile free_fn)(void *) = free;

/* A tail call: jmp strlen, returning straight into main. */
__attribute__((noinline)) size_t tail_strlen(const char *s)
{
	return strlen(s);
}

static int by_name(const void *a, const void *b)
{
	compares++;
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10;
	char *names[] = {"pear", "fig", "apple", "kiwi", "lime", "date", "plum"};
	size_t len = 0, nn = sizeof(names) / sizeof(names[0]);
	FILE *f;

	for (int i = 0; i < n; i++) {
		char *p = malloc(32);

		snprintf(p, 32, "item %d", i);
		len += strlen(p) + tail_strlen(p);
		free(p);
	}
	qsort(names, nn, sizeof(names[0]), by_name);
	f = fopen("/dev/null", "w"); /* libc's own malloc inside */
	if (f)
		fclose(f);
	close(open("/dev/null", O_RDONLY));
	close(open64("/dev/null", O_RDONLY));
	close(open64("/dev/null", O_RDONLY));
	printf("len %zu first %s\n", len, names[0]);
	printf("malloc %d\nfree %d\nsnprintf %d\nstrlen %d\nqsort 1\nstrcmp %lu\n", n, n, n, 2 * n,
	       compares);
	printf("open 3\nclose 3\n");
	return 0;
}
