/* SPDX-License-Identifier: MIT */
/*
 * Shared test plumbing: every test binary is a Check suite run in fork mode
 * (one process per test, with a timeout).  A binary whose tests need a
 * capability the machine lacks exits 77 after printing why, which Meson
 * reports as SKIP: never a silent pass.
 */
#ifndef PK_TESTS_HARNESS_H
#define PK_TESTS_HARNESS_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>

/* Run @s in fork mode; returns the process exit status (0 = all passed). */
int pk_test_run(Suite *s);

/* Exit 77 with a printed reason unless the capability is there. */
void pk_test_require_root(void);
void pk_test_require_hw_breakpoint(void);
void pk_test_require_membarrier_sync_core(void);

/* Probes, for tests that want to decide per case. */
bool pk_test_have_hw_breakpoint(void);
/*
 * Are hardware breakpoints delivered, not only accepted (tests/lib/hwbp_delivered.h:
 * one armed on a private word, the word written)?  false with the reason in
 * @why where they are not, or where PROBEKIT_HWBP_UNDELIVERED pretends so.
 */
bool pk_test_hw_delivered(char *why, size_t n);

#endif /* PK_TESTS_HARNESS_H */
