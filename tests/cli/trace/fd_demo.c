// SPDX-License-Identifier: MIT
/*
 * A program that does to its descriptors what daemons and servers do, for
 * tests/cli/trace/test-trace-fds.sh: the agent's descriptors (the trace file,
 * /proc/self/mem, the report pipe) must never receive a byte meant for the
 * trace once the program has closed them and opened files of its own.
 *
 *   fd_demo close DIR [PLUGIN]   calls; close_range(3, ~0U, 0); opens 24 files
 *                                of its own in DIR and writes one line to
 *                                each; more calls (the drainer writes
 *                                meanwhile); dlopen(PLUGIN) and calls it (a
 *                                text patch after the close); checks that
 *                                every file holds its line and nothing else
 *   fd_demo replace DIR          calls; dup2() its own file over every
 *                                other descriptor >= 3 (the agent's too);
 *                                more calls; checks its file
 *   fd_demo daemon DIR           double fork, setsid, chdir("/"), closes
 *                                every descriptor and opens /dev/null on
 *                                0-2, as daemon(3) would; the daemon makes
 *                                its calls and writes its counts ("calls
 *                                NAME N") to DIR/daemon.out, then its pid
 *                                to DIR/daemon.pid (rename: complete)
 *   fd_demo many N               N rounds of calls
 *
 * Prints "calls NAME N" for its demo_ functions (the daemon: into its file)
 * and exits 0, or 1 with a message if a file of its own was written by
 * someone else.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NFILES 24

static unsigned long n_leaf, n_mid;
static volatile unsigned long sink;

__attribute__((noinline)) unsigned long demo_leaf(unsigned long x)
{
	n_leaf++;
	return x * 2654435761u + 1;
}

__attribute__((noinline)) void demo_mid(unsigned long k)
{
	n_mid++;
	for (unsigned long i = 0; i < k; i++)
		sink += demo_leaf(i);
}

/* @rounds of calls, with pauses so the drainer runs in between. */
static void work(unsigned rounds)
{
	for (unsigned r = 0; r < rounds; r++) {
		demo_mid(1000);
		usleep(2000);
	}
}

static void print_counts(FILE *f)
{
	fprintf(f, "calls demo_leaf %lu\ncalls demo_mid %lu\n", n_leaf, n_mid);
}

static int die(const char *what)
{
	fprintf(stderr, "fd_demo: %s\n", what);
	return 1;
}

/* Does @path hold exactly @want? */
static int holds(const char *path, const char *want)
{
	char buf[256];
	struct stat st;
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	if (stat(path, &st) || (size_t)st.st_size != strlen(want) || strcmp(buf, want)) {
		fprintf(stderr, "fd_demo: %s: %lld bytes, not the %zu it wrote\n", path,
			(long long)st.st_size, strlen(want));
		return 0;
	}
	return 1;
}

static int do_close(const char *dir, const char *plugin)
{
	char path[NFILES][512], line[64];
	int fd[NFILES], i, bad = 0;

	work(5);
	if (syscall(SYS_close_range, 3, ~0U, 0))
		return die("close_range failed");
	for (i = 0; i < NFILES; i++) {
		snprintf(path[i], sizeof(path[i]), "%s/mine.%d", dir, i);
		fd[i] = open(path[i], O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd[i] < 0)
			return die("cannot open a file of its own");
		snprintf(line, sizeof(line), "file %d\n", i);
		if (write(fd[i], line, strlen(line)) != (ssize_t)strlen(line))
			return die("write");
	}
	work(20);
	if (plugin) {
		void *h = dlopen(plugin, RTLD_NOW);
		unsigned long (*pw)(unsigned long) = h ? (void *)dlsym(h, "plug_work") : NULL;

		if (!pw)
			return die(dlerror());
		sink += pw(10);
		work(5);
	}
	for (i = 0; i < NFILES; i++) {
		snprintf(line, sizeof(line), "file %d\n", i);
		bad += !holds(path[i], line);
		close(fd[i]);
	}
	print_counts(stdout);
	return bad ? die("a file of its own was written by someone else") : 0;
}

static int do_replace(const char *dir)
{
	char path[512];
	struct dirent *de;
	DIR *d;
	int mine, n = 0;

	work(5);
	snprintf(path, sizeof(path), "%s/mine", dir);
	mine = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (mine < 0 || write(mine, "mine\n", 5) != 5)
		return die("cannot write a file of its own");
	d = opendir("/proc/self/fd");
	while (d && (de = readdir(d))) {
		int fd = atoi(de->d_name);

		if (fd > 2 && fd != mine && fd != dirfd(d) && dup2(mine, fd) == fd)
			n++;
	}
	if (d)
		closedir(d);
	(void)n; /* none in a plain run */
	work(20);
	print_counts(stdout);
	return holds(path, "mine\n") ? 0 : die("its file was written by someone else");
}

static int do_daemon(const char *dir)
{
	char out[512], pidf[512], tmp[600];
	FILE *f;
	int fd;

	if (fork())
		return 0; /* the program the command waits for */
	setsid();
	if (fork())
		_exit(0);
	if (chdir("/"))
		_exit(2);
	syscall(SYS_close_range, 0, ~0U, 0);
	fd = open("/dev/null", O_RDWR);
	if (fd != 0 || dup(0) != 1 || dup(0) != 2)
		_exit(2);
	work(20);
	snprintf(out, sizeof(out), "%s/daemon.out", dir);
	f = fopen(out, "w");
	if (!f)
		_exit(2);
	print_counts(f);
	fclose(f);
	snprintf(pidf, sizeof(pidf), "%s/daemon.pid", dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp", pidf);
	f = fopen(tmp, "w");
	if (!f)
		_exit(2);
	fprintf(f, "%d\n", (int)getpid());
	fclose(f);
	rename(tmp, pidf);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "close"))
		return do_close(argv[2], argc > 3 ? argv[3] : NULL);
	if (argc == 3 && !strcmp(argv[1], "replace"))
		return do_replace(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "daemon"))
		return do_daemon(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "many")) {
		for (long i = atol(argv[2]); i > 0; i--)
			demo_mid(1000);
		print_counts(stdout);
		return 0;
	}
	fprintf(stderr, "usage: fd_demo close|replace|daemon DIR [PLUGIN] | many N\n");
	return 2;
}
