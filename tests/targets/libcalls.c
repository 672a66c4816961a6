// SPDX-License-Identifier: MIT
/*
 * For `probekit trace`'s library calls: calls into libc with counts the
 * program knows, printed at the end as "name count" lines.  Some go through
 * a tail call from a traced function (its return slot is hijacked), some
 * from a callback libc calls (qsort's comparator), and libc calls the same
 * functions itself (fopen's malloc), which are not the program's calls.
 * open and open64 are one function of libc's, called by both names.
 * free's address is taken: a non-PIE build defines it at its PLT entry.
 * memcpy is one relocation refuses in glibc's CPU variants (memmove jumps
 * into it), sigaction one probekit's agent wraps: both are counted through
 * the program's PLT slots (doc/design/library-calls.md LC5); the non-PIE
 * build binds at load time (-z now), its slots read-only after that: it
 * prints "got PERMS", their mapping's protection, at the end when asked
 * (its own file reads add calls).
 * Built without patchable entries, as a distribution binary is.
 * usage: libcalls [N [got]]
 */
#undef _FILE_OFFSET_BITS /* (the build's): open and open64 by their own names */
#define _LARGEFILE64_SOURCE
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned long compares;
static volatile size_t copy_len = 8; /* (a call to memcpy, not a move the compiler inlines) */
void (*volatile free_fn)(void *) = free;

/* A tail call: jmp strlen, returning straight into main. */
__attribute__((noinline)) size_t tail_strlen(const char *s)
{
	return strlen(s);
}

/* "got PERMS": the protection of the mapping that holds the PLT's slots. */
static void got_perms(void)
{
	unsigned long lo, hi, got = 0;
	char perms[8], line[512];
	FILE *m = fopen("/proc/self/maps", "r");

	for (const ElfW(Dyn) *d = _DYNAMIC; d->d_tag != DT_NULL; d++)
		if (d->d_tag == DT_PLTGOT) /* (relocated in place by the dynamic loader) */
			got = d->d_un.d_ptr;

	while (m && fgets(line, sizeof(line), m))
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && got >= lo && got < hi)
			printf("got %s\n", perms);
	if (m)
		fclose(m);
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
	struct sigaction sa;
	char copy[16];
	FILE *f;

	for (int i = 0; i < n; i++) {
		char *p = malloc(32);

		snprintf(p, 32, "item %d", i);
		len += strlen(p) + tail_strlen(p);
		memcpy(copy, p, copy_len);
		len += copy[5] == '0' + i % 10;
		free(p);
	}
	sigaction(SIGUSR1, NULL, &sa);
	sigaction(SIGUSR2, NULL, &sa);
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
	printf("open 3\nclose 3\nmemcpy %d\nsigaction 2\n", n);
	if (argc > 2 && argv[2][0] == 'g') /* (not strcmp: its calls are counted) */
		got_perms();
	return 0;
}
