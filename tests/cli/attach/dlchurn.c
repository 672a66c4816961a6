// SPDX-License-Identifier: MIT
/*
 * A program that loads and unloads a library without pause
 * (tests/cli/attach/test-trace-pid-dl.sh): dlopen(argv[1]), dlclose, again,
 * every 2 ms, from its only thread, until the file "stop" exists; prints
 * "ready PID" first and "rounds N" at the end (exit status 1 if a dlopen
 * failed).  An attach meets the dynamic loader's locks taken at any moment.
 * With a second argument, each round holds the library loaded for 1 ms and
 * calls that function of it (int (int), tests/cli/attach/plug.c's plug_fn:
 * x * 3 + 1) just after the load and just before the unload; "bad N"
 * counts the wrong results.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	long rounds = 0, bad = 0;

	if (argc < 2)
		return 2;
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	while (access("stop", F_OK)) {
		void *h = dlopen(argv[1], RTLD_NOW);

		if (!h) {
			fprintf(stderr, "dlchurn: %s\n", dlerror());
			return 1;
		}
		if (argc > 2) {
			int (*fn)(int) = (int (*)(int))dlsym(h, argv[2]);

			if (!fn) {
				fprintf(stderr, "dlchurn: %s\n", dlerror());
				return 1;
			}
			bad += fn((int)rounds) != (int)rounds * 3 + 1;
			usleep(1000);
			bad += fn((int)rounds) != (int)rounds * 3 + 1;
		}
		dlclose(h);
		rounds++;
		usleep(argc > 2 ? 1000 : 2000);
	}
	printf("rounds %ld\n", rounds);
	if (argc > 2)
		printf("bad %ld\n", bad);
	return 0;
}
