/* SPDX-License-Identifier: MIT */
/*
 * Are hardware breakpoints delivered here, not only accepted?  Some
 * hypervisors accept perf_event_open(PERF_TYPE_BREAKPOINT) but never raise
 * the debug exception: a test that needs hits must check for real.  This
 * arms a counting write breakpoint on a private word of the calling thread,
 * writes the word and reads the count.  PROBEKIT_HWBP_UNDELIVERED=1 (the
 * library's test switch, doc/api.md) arms it over another word than the one
 * written: the same check, concluding "not delivered", as the library does.
 *
 * Standalone (no probekit header): the C harness and tests/lib/hwbp_delivered.c
 * (for the shell tests and the install test) both use it.
 */
#ifndef PK_TESTS_HWBP_DELIVERED_H
#define PK_TESTS_HWBP_DELIVERED_H

#include <errno.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* PROBEKIT_HWBP_UNDELIVERED is set (and not "0"). */
static inline bool pkt_hwbp_pretend_undelivered(void)
{
	const char *e = getenv("PROBEKIT_HWBP_UNDELIVERED");

	return e && *e && strcmp(e, "0");
}

/* true if delivered; else false with the reason in @why. */
static inline bool pkt_hwbp_delivered(char *why, size_t n)
{
	static volatile uint64_t words[2];
	bool pretend = pkt_hwbp_pretend_undelivered();
	struct perf_event_attr attr = {
	    .type = PERF_TYPE_BREAKPOINT,
	    .size = sizeof(attr),
	    .bp_type = HW_BREAKPOINT_W,
	    .bp_addr = (unsigned long)&words[pretend],
	    .bp_len = HW_BREAKPOINT_LEN_8,
	    .sample_period = 1,
	    .exclude_kernel = 1,
	    .exclude_hv = 1,
	};
	uint64_t count = 0;
	ssize_t got;
	long fd = syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);

	if (fd < 0) {
		snprintf(why, n, "no hardware breakpoints (perf_event_open: %s)", strerror(errno));
		return false;
	}
	words[0]++;
	got = read((int)fd, &count, sizeof(count));
	close((int)fd);
	if (got != (ssize_t)sizeof(count)) {
		snprintf(why, n, "cannot read a breakpoint's count: %s",
			 got < 0 ? strerror(errno) : "short read");
		return false;
	}
	if (count)
		return true;
	snprintf(why, n,
		 "hardware breakpoints are accepted but not delivered here (a write to a watched "
		 "word counted no hit)%s",
		 pretend ? "; PROBEKIT_HWBP_UNDELIVERED is set: pretending so" : "");
	return false;
}

#endif /* PK_TESTS_HWBP_DELIVERED_H */
