// SPDX-License-Identifier: MIT
/* Test plumbing shared by every suite: see harness.h. */
#include <errno.h>
#include <linux/hw_breakpoint.h>
#include <linux/membarrier.h>
#include <linux/perf_event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "harness.h"
#include "hwbp_delivered.h"

#define SKIP_EXIT 77

int pk_test_run(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_set_fork_status(sr, CK_FORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

static void skip(const char *why)
{
	printf("SKIP: %s\n", why);
	fflush(stdout);
	exit(SKIP_EXIT);
}

void pk_test_require_root(void)
{
	if (geteuid() != 0)
		skip("needs root");
}

bool pk_test_have_hw_breakpoint(void)
{
	static char watched;
	struct perf_event_attr attr = {
	    .type = PERF_TYPE_BREAKPOINT,
	    .size = sizeof(attr),
	    .bp_type = HW_BREAKPOINT_W,
	    .bp_addr = (unsigned long)&watched,
	    .bp_len = HW_BREAKPOINT_LEN_1,
	    .exclude_kernel = 1,
	    .exclude_hv = 1,
	    .sigtrap = 1,
	    .remove_on_exec = 1,
	};
	long fd = syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);

	if (fd < 0)
		return false;
	close((int)fd);
	return true;
}

void pk_test_require_hw_breakpoint(void)
{
	if (!pk_test_have_hw_breakpoint()) {
		char why[128];

		snprintf(why, sizeof(why),
			 "no hardware breakpoints with sigtrap (perf_event_open: %s)",
			 strerror(errno));
		skip(why);
	}
}

bool pk_test_hw_delivered(char *why, size_t n)
{
	return pkt_hwbp_delivered(why, n);
}

void pk_test_require_membarrier_sync_core(void)
{
	long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);

	if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE))
		skip("membarrier PRIVATE_EXPEDITED_SYNC_CORE is not available");
}
