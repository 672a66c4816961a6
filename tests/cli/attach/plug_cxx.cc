// SPDX-License-Identifier: MIT
/*
 * The C++ library tests/cli/attach/dlhost.c loads while `probekit trace -p` is
 * attached (tests/cli/attach/test-trace-pid-dl.sh): plug_fn() gives what
 * plug.c's does, by a throw across plug_throw's frame, so the C++ runtime
 * and the unwinder come with it into a process that had neither.
 */
#define FN extern "C" __attribute__((noinline, noclone))

FN void plug_throw(int x)
{
	throw x * 3 + 1;
}

FN int plug_fn(int x)
{
	try {
		plug_throw(x);
	} catch (int v) {
		return v;
	}
	return -1;
}
