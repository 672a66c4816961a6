// SPDX-License-Identifier: MIT
/*
 * A program that loads and unloads a library without pause
 * (tests/attach/test-trace-pid-dl.sh): dlopen(argv[1]), dlclose, again,
 * every 2 ms, from its only thread, until the file "stop" exists; prints
 * "ready PID" first and "rounds N" at the end (exit status 1 if a dlopen
 * failed).  An attach meets the dynamic loader's locks taken at any moment.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	long rounds = 0;

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
		dlclose(h);
		rounds++;
		usleep(2000);
	}
	printf("rounds %ld\n", rounds);
	return 0;
}
