// SPDX-License-Identifier: MIT
/*
 * For the shell tests: exit 0 if hardware breakpoints are delivered here,
 * else print "SKIP: why" and exit 77 (tests/lib/hwbp_delivered.h).
 */
#include "hwbp_delivered.h"

int main(void)
{
	char why[256];

	if (pkt_hwbp_delivered(why, sizeof(why)))
		return 0;
	printf("SKIP: %s\n", why);
	return 77;
}
