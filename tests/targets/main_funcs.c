// SPDX-License-Identifier: MIT
/*
 * Functions linked into a test's main program, built with
 * -fpatchable-function-entry=5: sites of the main executable.
 */
#include "targets.h"

__attribute__((noinline)) int pkt_main_add(int a, int b)
{
	return a + b;
}

__attribute__((noinline)) static int pkt_main_hidden(int a)
{
	return a * 3;
}

pkt_fn pkt_main_hidden_addr(void)
{
	return pkt_main_hidden;
}
