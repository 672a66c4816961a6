// SPDX-License-Identifier: MIT
/*
 * Looking at the other threads of the process without signalling them (see
 * threads.h): /proc/self/task for the list, .../syscall for a blocked
 * thread's user pc and sp, .../status for its signal mask.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/signals.h"
#include "base/threads.h"

int pki_threads_each(pid_t skip, int (*cb)(pid_t tid, void *arg), void *arg)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *de;
	int ret = 0;

	if (!d)
		return -errno;
	while (!ret && (de = readdir(d))) {
		pid_t tid = (pid_t)atoi(de->d_name);

		if (tid > 0 && tid != skip)
			ret = cb(tid, arg);
	}
	closedir(d);
	return ret;
}

bool pki_thread_alive(pid_t tid)
{
	int saved = errno;
	bool gone = syscall(SYS_tgkill, getpid(), tid, 0) && errno == ESRCH;

	errno = saved;
	return !gone;
}

/* Read /proc/self/task/@tid/@file into @buf (NUL-terminated). */
static int task_read(pid_t tid, const char *file, char *buf, size_t len)
{
	char path[64];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/self/task/%d/%s", (int)tid, file);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? -ESRCH : -errno;
	n = read(fd, buf, len - 1);
	if (n < 0) {
		int err = errno;

		close(fd);
		return err == ENOENT ? -ESRCH : -err;
	}
	close(fd);
	buf[n] = '\0';
	return 0;
}

int pki_thread_sample(pid_t tid, struct pki_thread_state *st)
{
	char buf[256];
	unsigned long a[6];
	int err = task_read(tid, "syscall", buf, sizeof(buf));

	if (err)
		return err;
	memset(st, 0, sizeof(*st));
	/* "running", or "nr sp pc" (blocked outside a syscall), or "nr a0..a5 sp pc". */
	if (!strncmp(buf, "running", 7))
		return 0;
	if (sscanf(buf, "%ld %lx %lx %lx %lx %lx %lx %lx %lx", &st->nr, &a[0], &a[1], &a[2], &a[3],
		   &a[4], &a[5], &st->sp, &st->pc) == 9) {
		st->blocked = true;
		return 0;
	}
	if (sscanf(buf, "%ld %lx %lx", &st->nr, &st->sp, &st->pc) == 3 && st->nr == -1) {
		st->blocked = true;
		return 0;
	}
	return -EPROTO;
}

int pki_thread_sigblk(pid_t tid, uint64_t *mask, char *name, size_t len)
{
	char buf[2048], *l;
	int err = task_read(tid, "status", buf, sizeof(buf));

	if (err)
		return err;
	if (name && len) {
		name[0] = '\0';
		if (!strncmp(buf, "Name:\t", 6)) {
			size_t n = strcspn(buf + 6, "\n");

			n = n < len - 1 ? n : len - 1;
			memcpy(name, buf + 6, n);
			name[n] = '\0';
		}
	}
	l = strstr(buf, "\nSigBlk:\t");
	if (!l || sscanf(l + 9, "%" SCNx64, mask) != 1)
		return -EPROTO;
	return 0;
}

int pki_thread_sigpnd(pid_t tid, uint64_t *mask)
{
	char buf[2048], *l;
	int err = task_read(tid, "status", buf, sizeof(buf));

	if (err)
		return err;
	l = strstr(buf, "\nSigPnd:\t");
	if (!l || sscanf(l + 9, "%" SCNx64, mask) != 1)
		return -EPROTO;
	return 0;
}

static int pending_one(pid_t tid, void *arg)
{
	uint64_t pnd;

	if (pki_thread_sigpnd(tid, &pnd))
		return 0; /* gone */
	return pnd & *(const uint64_t *)arg ? 1 : 0;
}

bool pki_threads_pending(uint64_t mask, int wait_ms)
{
	for (int i = 0;; i++) {
		if (pki_threads_each(0, pending_one, &mask) != 1)
			return false;
		if (i >= wait_ms)
			return true;
		usleep(1000);
	}
}

/*
 * Thread @tid's scheduling state (the letter of /proc's stat) and the CPU
 * time it has run, in ns: schedstat's first field, else utime + stime.
 */
static int task_progress(pid_t tid, char *state, uint64_t *run_ns)
{
	char buf[512], *paren;
	unsigned long ut, st;
	int err = task_read(tid, "stat", buf, sizeof(buf));

	*state = 'R'; /* unreadable: as if runnable */
	*run_ns = 0;
	if (err)
		return err;
	paren = strrchr(buf, ')');
	if (!paren || paren[1] != ' ' || !paren[2])
		return -EPROTO;
	*state = paren[2];
	if (*state != 'R')
		return 0;
	if (sscanf(paren + 3, " %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -EPROTO;
	*run_ns = (uint64_t)(ut + st) * (1000000000ull / (uint64_t)sysconf(_SC_CLK_TCK));
	if (!task_read(tid, "schedstat", buf, sizeof(buf)))
		sscanf(buf, "%" SCNu64, run_ns);
	return 0;
}

int pki_thread_progress(pid_t tid, char *state, uint64_t *run_ns)
{
	return task_progress(tid, state, run_ns);
}

#define RUN_UNKNOWN UINT64_MAX

struct runnable {
	pid_t *tid;
	uint64_t *run0;
	int n, cap;
};

/* First look: keep the runnable threads with the CPU time they had run. */
static int runnable_add(pid_t tid, void *arg)
{
	struct runnable *r = arg;
	uint64_t run;
	char state;

	int err = task_progress(tid, &state, &run);

	if (err == -ESRCH || state != 'R')
		return 0; /* gone, or not on its way anywhere */
	if (err)
		run = RUN_UNKNOWN; /* unreadable: its first good read is the baseline */
	if (r->n == r->cap) {
		int cap = r->cap ? 2 * r->cap : 64;
		pid_t *t = realloc(r->tid, (size_t)cap * sizeof(*t));
		uint64_t *u = t ? realloc(r->run0, (size_t)cap * sizeof(*u)) : NULL;

		if (t)
			r->tid = t;
		if (!u)
			return -ENOMEM;
		r->run0 = u;
		r->cap = cap;
	}
	r->tid[r->n] = tid;
	r->run0[r->n++] = run;
	return 0;
}

bool pki_threads_settled(uint64_t run_ns, int wait_ms)
{
	struct runnable r = {0};
	bool done = false;

	if (pki_threads_each((pid_t)syscall(SYS_gettid), runnable_add, &r))
		goto out;
	for (int i = 0;; i++) {
		int left = 0;

		for (int k = 0; k < r.n; k++) {
			uint64_t run;
			char state;
			int err = task_progress(r.tid[k], &state, &run);

			if (err == -ESRCH || state != 'R' ||
			    (!err && r.run0[k] != RUN_UNKNOWN && run > r.run0[k] &&
			     run - r.run0[k] >= run_ns))
				continue;
			if (!err && r.run0[k] == RUN_UNKNOWN)
				r.run0[k] = run;
			r.tid[left] = r.tid[k];
			r.run0[left++] = r.run0[k];
		}
		r.n = left;
		if (!left || i >= wait_ms)
			break;
		usleep(1000);
	}
	done = !r.n;
out:
	free(r.tid);
	free(r.run0);
	return done;
}

/*
 * A thread of the program's, still running: not @self, not ours (by tid,
 * or by name for another copy of the library in the process), and not an
 * exited thread the kernel still lists (the main thread stays a zombie
 * while others run).  A thread that cannot be read counts as the program's.
 */
static int program_thread(pid_t tid, void *arg)
{
	char buf[512], *open, *paren;
	int err;

	(void)arg;
	if (pki_worker_is(tid))
		return 0;
	err = task_read(tid, "stat", buf, sizeof(buf));
	if (err == -ESRCH)
		return 0;
	open = err ? NULL : strchr(buf, '(');
	paren = err ? NULL : strrchr(buf, ')');
	if (!open || !paren || paren < open || paren[1] != ' ')
		return 1;
	if (paren[2] == 'Z' || paren[2] == 'X')
		return 0;
	return strncmp(open + 1, PKI_WORKER_PREFIX, strlen(PKI_WORKER_PREFIX)) != 0;
}

bool pki_threads_only_ours(void)
{
	return pki_threads_each((pid_t)syscall(SYS_gettid), program_thread, NULL) == 0;
}
