// SPDX-License-Identifier: MIT
/* The tiny function whose per-call cost the call benchmark measures. */
#include "targets.h"

__attribute__((noinline)) int pkb_add(int a, int b)
{
	__asm__ volatile("");
	return a + b;
}
