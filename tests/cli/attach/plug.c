// SPDX-License-Identifier: MIT
/* The library tests/cli/attach/dlhost.c loads, built twice under two names. */
__attribute__((noinline)) int plug_fn(int x)
{
	return x * 3 + 1;
}
