// SPDX-License-Identifier: MIT
/*
 * A program that unloads a library and loads another while `probekit
 * trace -p` is attached (tests/cli/attach/test-trace-pid-dl.sh): it dlopens
 * argv[1], prints "ready PID", and calls its plug_fn() every 100 us,
 * checking each result; once the file "swap" exists it dlcloses it and
 * dlopens argv[2] (which the loader is free to put at the same address),
 * prints "swapped", and calls that one's plug_fn() the same way until the
 * file "stop" exists; then it prints "bad N", N the wrong results, and
 * exits with 1 if N > 0.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

static long bad;

/*
 * Load @path, print @say, call its plug_fn until the file @until exists;
 * the handle is returned for dlclose.
 */
static void *run(const char *path, const char *say, const char *until)
{
	void *h = dlopen(path, RTLD_NOW);
	int (*f)(int) = h ? (int (*)(int))dlsym(h, "plug_fn") : NULL;

	if (!f) {
		fprintf(stderr, "dlhost: %s\n", dlerror());
		bad++;
		return h;
	}
	printf("%s\n", say);
	fflush(stdout);
	for (int i = 0; access(until, F_OK); i++) {
		if (f(i) != i * 3 + 1)
			bad++;
		usleep(100);
	}
	return h;
}

int main(int argc, char **argv)
{
	char ready[32];
	void *h;

	if (argc != 3) {
		fprintf(stderr, "usage: dlhost LIB1 LIB2\n");
		return 2;
	}
	snprintf(ready, sizeof(ready), "ready %d", (int)getpid());
	h = run(argv[1], ready, "swap");
	if (h)
		dlclose(h);
	h = run(argv[2], "swapped", "stop");
	if (h)
		dlclose(h);
	printf("bad %ld\n", bad);
	return bad ? 1 : 0;
}
