// SPDX-License-Identifier: MIT
/*
 * A shared library built with -fpatchable-function-entry=5: the test links
 * it and expects a site at each function below (gcc: five one-byte nops).
 */
#include "targets.h"

__attribute__((noinline)) int pkt_lib_add(int a, int b)
{
	return a + b;
}

__attribute__((noinline)) int pkt_lib_mul(int a, int b)
{
	return a * b;
}

__attribute__((noinline)) static int pkt_lib_hidden(int a)
{
	return a - 7;
}

pkt_fn pkt_lib_hidden_addr(void)
{
	return pkt_lib_hidden;
}
