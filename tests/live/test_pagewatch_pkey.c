// SPDX-License-Identifier: MIT
/*
 * Page-mode watchpoints and protection keys (doc/design/page-watch.md,
 * PW1): pages the program gave a protection key (pkey_mprotect) are
 * refused at the add, saying so; the watch's own mapping would carry key
 * 0 and drop the program's key checks.  Skipped where the machine has no
 * protection keys (pkey_alloc fails: no pku, or the kernel's support off).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <probekit/watch.h>

#include "harness.h"

#define PAGE 4096

static char last_msg[1024];
static int capture(enum pk_print_level level, const char *fmt, va_list ap)
{
	(void)level;
	return vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
}

START_TEST(refuses_pkey_pages)
{
	struct pk_watch_opts o = {.sz = sizeof(o), .mode = PK_WATCH_MODE_PAGE};
	char *p = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int key = pkey_alloc(0, 0);
	struct pk_watch *w;

	ck_assert_ptr_ne(p, MAP_FAILED);
	ck_assert_int_ge(key, 0);
	ck_assert_int_eq(pkey_mprotect(p, PAGE, PROT_READ | PROT_WRITE, key), 0);
	pk_set_print(capture);
	ck_assert_ptr_null(pk_watch_add(p + 8, 8, PK_WATCH_W, &o));
	ck_assert_int_eq(errno, EINVAL);
	ck_assert_msg(strstr(last_msg, "protection key"), "%s", last_msg);
	/* the page beside it, key 0, is watched */
	w = pk_watch_add(p + PAGE + 8, 8, PK_WATCH_W, &o);
	ck_assert_ptr_nonnull(w);
	pk_watch_remove(w);
}
END_TEST

int main(void)
{
	int key = pkey_alloc(0, 0);
	Suite *s;
	TCase *tc;

	if (key < 0) {
		printf("SKIP: no protection keys here (pkey_alloc: %s)\n", strerror(errno));
		return 77;
	}
	pkey_free(key);
	s = suite_create("pagewatch_pkey");
	tc = tcase_create("pkey");
	tcase_add_test(tc, refuses_pkey_pages);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
