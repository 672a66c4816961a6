// SPDX-License-Identifier: MIT
/*
 * The library's shared surface: version and the print callback; and the
 * base helpers: the address map, growth, sized structs, and the locks whose
 * `__` functions check that they are held (base/held.h).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <probekit/probekit.h>

#include "base/grow.h"
#include "base/held.h"
#include "base/umap.h"
#include "base/log.h"
#include "base/opts.h"
#include "hook/gp.h"
#include "hook/registry.h"
#include "sym/elf_syms.h"
#include "watch/page.h"
#include "harness.h"

static char last[256];
static int calls;

static int capture(enum pk_print_level level, const char *fmt, va_list ap)
{
	(void)level;
	calls++;
	return vsnprintf(last, sizeof(last), fmt, ap);
}

START_TEST(version_matches_header)
{
	int major, minor;

	ck_assert_int_eq(sscanf(pk_version(), "%d.%d", &major, &minor), 2);
	ck_assert_int_eq(major, PK_VERSION_MAJOR);
	ck_assert_int_eq(minor, PK_VERSION_MINOR);
}
END_TEST

START_TEST(silent_by_default_then_prints)
{
	pki_warn("nobody hears this %d\n", 1);
	ck_assert_int_eq(calls, 0);
	ck_assert_ptr_null(pk_set_print(capture));
	pki_warn("object %s: %s\n", "x", pki_errstr(-2));
	ck_assert_int_eq(calls, 1);
	ck_assert_str_eq(last, "object x: No such file or directory\n");
	ck_assert_ptr_eq(pk_set_print(NULL), capture);
	pki_warn("silent again\n");
	ck_assert_int_eq(calls, 1);
}
END_TEST

/* What pk_print_stderr() wrote while @fn ran (stderr into a file). */
static void stderr_of(void (*fn)(void), char *out, size_t len)
{
	FILE *f = tmpfile();
	int saved = dup(2);
	size_t n;

	ck_assert_ptr_nonnull(f);
	fflush(stderr);
	dup2(fileno(f), 2);
	fn();
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(f);
	n = fread(out, 1, len - 1, f);
	out[n] = 0;
	fclose(f);
}

static void three_levels(void)
{
	pki_warn("w\n");
	pki_info("i\n");
	pki_debug("d\n");
}

/* pk_print_stderr: up to PK_INFO by default, then what pk_set_print_level() says. */
START_TEST(stderr_printer_levels)
{
	char out[256];

	pk_set_print(pk_print_stderr);
	stderr_of(three_levels, out, sizeof(out));
	ck_assert_str_eq(out, "probekit warning: w\nprobekit info: i\n");
	ck_assert_int_eq(pk_set_print_level(PK_DEBUG), PK_INFO);
	stderr_of(three_levels, out, sizeof(out));
	ck_assert_str_eq(out, "probekit warning: w\nprobekit info: i\nprobekit debug: d\n");
	ck_assert_int_eq(pk_set_print_level(PK_WARN), PK_DEBUG);
	stderr_of(three_levels, out, sizeof(out));
	ck_assert_str_eq(out, "probekit warning: w\n");
	pk_set_print(NULL);
}
END_TEST

/* PROBEKIT_LOG, read at the printer's first use. */
START_TEST(stderr_printer_env)
{
	char out[256];

	setenv("PROBEKIT_LOG", "debug", 1);
	pk_set_print(pk_print_stderr);
	stderr_of(three_levels, out, sizeof(out));
	ck_assert_ptr_nonnull(strstr(out, "probekit debug: d\n"));
	pk_set_print(NULL);
}
END_TEST

struct rec {
	int pad;
	unsigned long key;
};

/* The address map: every key found after growth, none that was not put, clear empties. */
START_TEST(umap_finds_what_was_put)
{
	enum { N = 5000 };
	static struct rec r[N];
	struct pki_umap m = PKI_UMAP_INIT(struct rec, key);

	for (int i = 0; i < N; i++) {
		r[i].key = 0x400000ul + 16ul * (unsigned long)i; /* aligned, like sites */
		ck_assert_int_eq(pki_umap_insert(&m, &r[i]), 0);
	}
	ck_assert_uint_eq(m.n, N);
	ck_assert_uint_ge(m.cap, 2 * N);
	for (int i = 0; i < N; i++)
		ck_assert_ptr_eq(pki_umap_find(&m, r[i].key), &r[i]);
	ck_assert_ptr_null(pki_umap_find(&m, 0x400008ul));
	ck_assert_ptr_null(pki_umap_find(&m, 0x400000ul + 16ul * N));
	pki_umap_clear(&m);
	ck_assert_uint_eq(m.n, 0);
	ck_assert_ptr_null(pki_umap_find(&m, r[7].key));
	ck_assert_int_eq(pki_umap_insert(&m, &r[7]), 0);
	ck_assert_ptr_eq(pki_umap_find(&m, r[7].key), &r[7]);
	free(m.slot);
}
END_TEST

/* Growing arrays: room made by doubling from 16, contents kept. */
START_TEST(grow_keeps_contents)
{
	long *v = NULL;
	size_t cap = 0;

	ck_assert_int_eq(PKI_GROW(v, cap, 0), 0);
	ck_assert_uint_eq(cap, 0);
	ck_assert_int_eq(PKI_GROW(v, cap, 1), 0);
	ck_assert_uint_eq(cap, 16);
	for (long i = 0; i < 16; i++)
		v[i] = i * 3;
	ck_assert_int_eq(PKI_GROW(v, cap, 100), 0);
	ck_assert_uint_eq(cap, 128);
	for (long i = 0; i < 16; i++)
		ck_assert_int_eq(v[i], i * 3);
	ck_assert_int_eq(PKI_GROW(v, cap, 17), 0); /* enough already */
	ck_assert_uint_eq(cap, 128);
	free(v);
}
END_TEST

/*
 * Sized structs in and out (base/opts.h): older and newer callers.  (No
 * tail padding: an older struct's padding would be read as a newer field.)
 */
struct v1 {
	size_t sz;
	long a;
};
struct v2 {
	size_t sz;
	long a, b, c;
};

START_TEST(opts_in_and_out)
{
	struct v1 old = {.sz = sizeof(old), .a = 7};
	struct v2 in, newer = {.sz = sizeof(newer), .a = 1, .b = 2}, out = {.sz = sizeof(out)};
	struct {
		struct v2 v;
		long unknown;
	} newest = {{.sz = sizeof(newest), .a = 3}, 0};
	pk_print_fn was = pk_set_print(NULL);

	/* an older caller: its fields, zero past them */
	memset(&in, 0xff, sizeof(in));
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &old, sizeof(size_t), "t"), 0);
	ck_assert_int_eq(in.a, 7);
	ck_assert_int_eq(in.b, 0);
	ck_assert_int_eq(in.c, 0);
	ck_assert_uint_eq(in.sz, sizeof(in));
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &newer, sizeof(size_t), "t"), 0);
	ck_assert_int_eq(in.b, 2);
	/* a newer caller: its unknown fields must be zero */
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &newest, sizeof(size_t), "t"), 0);
	newest.unknown = 1;
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &newest, sizeof(size_t), "t"), -EINVAL);
	/* not a size: a caller without one, whose first field is a pointer */
	newest.v.sz = (size_t)(uintptr_t)&newest;
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &newest, sizeof(size_t), "t"), -EINVAL);
	newest.v.sz = sizeof(newest);
	/* below the fields every version had */
	old.sz = sizeof(size_t);
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &old, sizeof(struct v1), "t"), -EINVAL);
	/* out: as much as the caller has room for, and its size says how much */
	old.sz = sizeof(old);
	old.a = 0;
	out.a = 5;
	out.b = 6;
	pki_opts_out(&old, &out, sizeof(out));
	ck_assert_int_eq(old.a, 5);
	ck_assert_uint_eq(old.sz, sizeof(old));
	newest.unknown = 9;
	pki_opts_out(&newest, &out, sizeof(out));
	ck_assert_uint_eq(newest.v.sz, sizeof(out));
	ck_assert_int_eq(newest.v.b, 6);
	ck_assert_int_eq(newest.unknown, 9); /* past ours: untouched */
	/* out, checked first: below the first version (0 too) is refused */
	old.sz = sizeof(old);
	ck_assert_int_eq(pki_opts_out_check(&old, sizeof(old), "t"), 0);
	old.sz = 0;
	ck_assert_int_eq(pki_opts_out_check(&old, sizeof(old), "t"), -EINVAL);
	pk_set_print(was);
}
END_TEST

/* What the callers of sized structs see: PK_OPTS, PK_HAS, and refusals said or not. */
struct padded {
	size_t sz;
	long a;
	int last; /* then 4 bytes of padding */
};

START_TEST(opts_first_version_and_silence)
{
	PK_OPTS(padded, p, .a = 1, .last = 2);
	struct padded in;
	pk_print_fn was = pk_set_print(capture);

	ck_assert_uint_eq(p.sz, sizeof(p));
	ck_assert(PK_HAS(&p, last));
	/* a first version ends at its last field, not at its padding */
	p.sz = PKI_OPTS_END(struct padded, last);
	ck_assert(PK_HAS(&p, last));
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &p, PKI_OPTS_END(struct padded, last), "t"),
			 0);
	ck_assert_int_eq(in.last, 2);
	p.sz = offsetof(struct padded, last);
	ck_assert(!PK_HAS(&p, last));
	/* refused, and said, unless @what is NULL (signal context) */
	calls = 0;
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &p, PKI_OPTS_END(struct padded, last), "t"),
			 -EINVAL);
	ck_assert_int_eq(calls, 1);
	ck_assert_ptr_nonnull(strstr(last, "too small"));
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &p, PKI_OPTS_END(struct padded, last), NULL),
			 -EINVAL);
	ck_assert_int_eq(pki_opts_out_check(&p, PKI_OPTS_END(struct padded, last), NULL), -EINVAL);
	ck_assert_int_eq(calls, 1);
	p.sz = 0; /* not declared with PK_OPTS */
	ck_assert_int_eq(pki_opts_in(&in, sizeof(in), &p, sizeof(size_t), NULL), -EINVAL);
	pk_set_print(was);
}
END_TEST

/* ---- locks that know their holder (base/held.h) ---- */

static struct pki_held_mutex hm = PKI_HELD_MUTEX_INIT;
static pthread_cond_t hm_cv = PTHREAD_COND_INITIALIZER;
static bool hm_flag;

static void *hm_holder(void *arg)
{
	(void)arg;
	pki_held_lock(&hm);
	ck_assert(pki_held_mine(&hm));
	hm_flag = true;
	pthread_cond_broadcast(&hm_cv);
	pki_held_unlock(&hm);
	return NULL;
}

/*
 * pki_held_mine(): the holder's alone, through trylock and a condition
 * variable's wait (another thread took and let go of the lock meanwhile);
 * a fork child keeps the lock its forking thread held, and a lock made anew
 * is nobody's.
 */
START_TEST(held_mutex_knows_its_holder)
{
	pthread_t th;
	pid_t pid;
	int st;

	ck_assert(!pki_held_mine(&hm));
	ck_assert(pki_held_trylock(&hm));
	ck_assert(pki_held_mine(&hm));
	PKI_HELD(&hm);
	ck_assert_int_eq(pthread_create(&th, NULL, hm_holder, NULL), 0);
	while (!hm_flag)
		pki_held_cond_wait(&hm_cv, &hm);
	ck_assert(pki_held_mine(&hm));
	pki_held_unlock(&hm);
	ck_assert(!pki_held_mine(&hm));
	ck_assert_int_eq(pthread_join(th, NULL), 0);

	pki_held_lock(&hm);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		bool ok = pki_held_mine(&hm);

		pki_held_unlock(&hm);
		ok = ok && !pki_held_mine(&hm) && pki_held_trylock(&hm);
		pki_held_init(&hm);
		_exit(ok && !pki_held_mine(&hm) ? 0 : 1);
	}
	pki_held_unlock(&hm);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && !WEXITSTATUS(st), "child: status %#x", st);
}
END_TEST

#ifdef PKI_LOCK_CHECKS
/*
 * One `__` function of each checked lock, called without it.  The static
 * ones are found in this program's symbol table (the debug builds, where
 * PKI_LOCK_CHECKS is, do not inline them) and called with zeros for
 * arguments: PKI_HELD comes first, so none is looked at.
 */
static const struct {
	const char *name;
	void (*fn)(void); /* NULL: a static function, by name */
} unheld[] = {
    {"__pki_hook_undo", __pki_hook_undo},		  /* pki_reg.lock */
    {"__pki_page_fork_prepare", __pki_page_fork_prepare}, /* the watch manager's */
    {"__delivered", NULL},				  /* the same, watch.c */
    {"__note_busy", NULL},				  /* gp.c: gp_lock */
    {"__recheck_busy", NULL},
    {"__run_queue", NULL},  /* gp.c: defer_lock */
    {"__chunk_find", NULL}, /* tmem.c: tmem_lock */
    {"__entries_take", NULL},
};

/* What @fn wrote to stderr (into @out) and how it ended, in a child. */
static int child_run(void (*fn)(unsigned long, unsigned long), char *out, size_t len)
{
	size_t n = 0;
	ssize_t r;
	int p[2], st;
	pid_t pid;

	ck_assert_int_eq(pipe(p), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		dup2(p[1], 2);
		pk_set_print(pk_print_stderr);
		fn(0, 0);
		_exit(0);
	}
	close(p[1]);
	while (n < len - 1 && (r = read(p[0], out + n, len - 1 - n)) > 0)
		n += (size_t)r;
	out[n] = 0;
	close(p[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return st;
}

/* Each one aborts, naming itself. */
START_TEST(unheld_call_aborts)
{
	struct pki_elf_syms syms;
	const struct pki_elf_sym *anchor;
	uintptr_t base;

	ck_assert_int_eq(pki_elf_syms_read_path("/proc/self/exe", &syms), 0);
	anchor = pki_elf_syms_lookup(&syms, "pki_gp_synchronize");
	ck_assert_ptr_nonnull(anchor);
	base = (uintptr_t)pki_gp_synchronize - anchor->value;
	for (size_t i = 0; i < sizeof(unheld) / sizeof(unheld[0]); i++) {
		const struct pki_elf_sym *sym = pki_elf_syms_lookup(&syms, unheld[i].name);
		void (*fn)(unsigned long, unsigned long);
		char out[512], want[128];
		int st;

		ck_assert_msg(sym && sym->kind == PKI_SYM_FUNC, "%s: not in the symbol table",
			      unheld[i].name);
		fn = (void (*)(unsigned long, unsigned long))(base + sym->value);
		if (unheld[i].fn)
			ck_assert_ptr_eq((void *)fn, (void *)unheld[i].fn);
		st = child_run(fn, out, sizeof(out));
		ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT,
			      "%s: status %#x, said: %s", unheld[i].name, st, out);
		snprintf(want, sizeof(want), "internal: %s() called without the lock",
			 unheld[i].name);
		ck_assert_msg(strstr(out, want), "%s: said: %s", unheld[i].name, out);
	}
	pki_elf_syms_free(&syms);
}
END_TEST
#endif

int main(void)
{
	Suite *s = suite_create("core");
	TCase *tc = tcase_create("log");

	tcase_add_test(tc, version_matches_header);
	tcase_add_test(tc, silent_by_default_then_prints);
	tcase_add_test(tc, stderr_printer_levels);
	tcase_add_test(tc, stderr_printer_env);
	tcase_add_test(tc, umap_finds_what_was_put);
	tcase_add_test(tc, grow_keeps_contents);
	tcase_add_test(tc, opts_in_and_out);
	tcase_add_test(tc, opts_first_version_and_silence);
	suite_add_tcase(s, tc);
	tc = tcase_create("held");
	tcase_add_test(tc, held_mutex_knows_its_holder);
#ifdef PKI_LOCK_CHECKS
	tcase_add_test(tc, unheld_call_aborts);
#endif
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
