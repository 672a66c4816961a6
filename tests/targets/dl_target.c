// SPDX-License-Identifier: MIT
/*
 * A library the tests dlopen() and dlclose(): its sites must join the table
 * on refresh after dlopen, and leave it after dlclose.  Built with gcc's
 * -fpatchable-function-entry=5, and with clang when clang is installed.
 */
__attribute__((noinline)) int pkt_dl_one(int a)
{
	return a + 1;
}

__attribute__((noinline)) int pkt_dl_two(int a)
{
	return a + 2;
}
