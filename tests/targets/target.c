// SPDX-License-Identifier: MIT
/*
 * A self-checking target program, built twice by the build: as a PIE with
 * -fpatchable-function-entry=5 (kind nop1x5) and as a fixed-address program
 * with -pg -mfentry -mnop-mcount -mrecord-mcount (kind mcount).  Run with no
 * argument it checks its own sites in memory against &function and against
 * the file reader, prints what is wrong, and exits 0 only if nothing is.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <probekit/sites.h>

#ifndef TARGET_KIND
#error "TARGET_KIND must name the expected pk_site_kind"
#endif

static int failures;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                \
			printf(__VA_ARGS__);                                                       \
			putchar('\n');                                                             \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

__attribute__((noinline)) int tgt_alpha(int a)
{
	return a + 1;
}

__attribute__((noinline)) int tgt_beta(int a)
{
	return a * 2;
}

__attribute__((noinline)) static int tgt_gamma(int a)
{
	return a - 3;
}

int (*volatile tgt_keep)(int) = tgt_gamma;

static char exe[PATH_MAX];

static void check_fn(const char *name, void *fn)
{
	PK_OPTS(pk_site, s);
	int err = pk_site_lookup(name, &s);

	CHECK(!err, "lookup %s: %d", name, err);
	if (err)
		return;
	CHECK(s.func == (unsigned long)fn, "%s: func %#lx, &fn %p", name, s.func, fn);
	CHECK(s.kind == TARGET_KIND, "%s: kind %s", name, pk_site_kind_name(s.kind));
	CHECK(!strcmp(s.object, exe), "%s: object %s, exe %s", name, s.object, exe);
	err = pk_site_find((unsigned long)fn, &s);
	CHECK(!err && !strcmp(s.name, name), "find %p: %d", fn, err);
}

struct cmp_ctx {
	long base; /* memory ip - file ip */
	int compared;
};

static int cmp_file_site(const struct pk_site *f, void *data)
{
	struct cmp_ctx *c = data;
	PK_OPTS(pk_site, m);
	int err = pk_site_find(f->ip + c->base, &m);

	CHECK(!err, "file site %s at %#lx not in memory", f->name, f->ip);
	if (err)
		return 0;
	CHECK(!strcmp(m.name, f->name), "name %s vs %s", m.name, f->name);
	CHECK(m.kind == f->kind, "%s: kind %d vs %d", f->name, m.kind, f->kind);
	CHECK(m.func - f->func == (unsigned long)c->base, "%s: func", f->name);
	c->compared++;
	return 0;
}

static int count_main(const struct pk_site *s, void *data)
{
	if (!strcmp(s->object, exe))
		(*(int *)data)++;
	return 0;
}

static int file_ip_of_alpha(const struct pk_site *s, void *data)
{
	if (strcmp(s->name, "tgt_alpha"))
		return 0;
	*(unsigned long *)data = s->ip;
	return 1;
}

int main(void)
{
	PK_OPTS(pk_sites_stats, st);
	struct cmp_ctx c = {0};
	unsigned long file_ip = 0;
	int in_memory = 0, n;
	ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	CHECK(len > 0, "readlink");
	if (len > 0)
		exe[len] = '\0';
	check_fn("tgt_alpha", (void *)tgt_alpha);
	check_fn("tgt_beta", (void *)tgt_beta);
	check_fn("tgt_gamma", (void *)tgt_keep);
	check_fn("main", (void *)main);

	/* The file reader must agree with the table, site for site. */
	n = pk_sites_file_foreach(exe, file_ip_of_alpha, &file_ip, NULL);
	CHECK(n > 0 && file_ip, "file reader did not find tgt_alpha: %d", n);
	c.base = (long)((unsigned long)tgt_alpha - file_ip);
	if (TARGET_KIND == PK_SITE_MCOUNT)
		CHECK(c.base == 0, "fixed-address program with base %#lx", c.base);
	n = pk_sites_file_foreach(exe, cmp_file_site, &c, &st);
	CHECK(n == c.compared && n >= 4, "compared %d of %d", c.compared, n);
	CHECK(st.sites == (size_t)n && st.not_entry == 0 && st.bad_insn == 0,
	      "stats: %zu sites, %zu not entry, %zu bad", st.sites, st.not_entry, st.bad_insn);
	pk_sites_foreach(count_main, &in_memory);
	CHECK(in_memory == n, "%d sites in memory, %d in the file", in_memory, n);
	if (!failures)
		printf("ok: %d sites of kind %s\n", n, pk_site_kind_name(TARGET_KIND));
	return failures ? 1 : 0;
}
