// SPDX-License-Identifier: MIT
/*
 * perf_event_open backend for watchpoints.  Attributes, and why:
 *   sigtrap=1          a hit sends SIGTRAP (si_code TRAP_PERF) to the thread
 *                      that made the access, synchronously, on its way back
 *                      to user space;
 *   remove_on_exec=1   required by the kernel with sigtrap; execve drops them;
 *   sample_period=1    every access overflows, hence every access signals;
 *   inherit=1, inherit_thread=1 (all-threads)  threads created later, by
 *                      CLONE_THREAD only, get a copy; fork children do not;
 *   exclude_kernel/hv  user-space accesses only (also needed unprivileged).
 * PERF_EVENT_IOC_MODIFY_ATTRIBUTES / ENABLE / DISABLE on a root event reach
 * every event inherited from it, even after the root's own thread exited
 * (verified on 6.18: the root stays in EXIT state with its child list).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "arch/arch.h"
#include "base/fd.h"
#include "watch/perf.h"

void pki_perf_bp_attr(struct perf_event_attr *attr, const struct pki_bp *bp)
{
	static const unsigned int bp_type[] = {
	    [PK_WATCH_W] = HW_BREAKPOINT_W,
	    [PK_WATCH_RW] = HW_BREAKPOINT_RW,
	    [PK_WATCH_X] = HW_BREAKPOINT_X,
	};

	memset(attr, 0, sizeof(*attr));
	attr->type = PERF_TYPE_BREAKPOINT;
	attr->size = sizeof(*attr);
	attr->bp_type = bp_type[bp->type];
	attr->bp_addr = bp->addr;
	attr->bp_len = pki_hwbp_kernel_len(bp->type == PK_WATCH_X, bp->len);
	attr->sample_period = 1;
	attr->disabled = bp->disabled;
	attr->inherit = bp->inherit;
	attr->inherit_thread = bp->inherit;
	attr->sigtrap = 1;
	attr->remove_on_exec = 1;
	attr->exclude_kernel = 1;
	attr->exclude_hv = 1;
	attr->sig_data = bp->sig_data;
}

int pki_perf_bp_open(const struct pki_bp *bp, pid_t tid)
{
	struct perf_event_attr attr;
	long fd;

	pki_perf_bp_attr(&attr, bp);
	fd = syscall(SYS_perf_event_open, &attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
	/* Out of the numbers the program's own open()s take (base/fd.h). */
	return fd < 0 ? -errno : pki_fd_high((int)fd);
}

void pki_perf_bp_close(int fd)
{
	uint64_t id;

	/*
	 * The program may have closed ours and put a file of its own at this
	 * number: only a perf event answers PERF_EVENT_IOC_ID.
	 */
	if (!ioctl(fd, PERF_EVENT_IOC_ID, &id))
		close(fd);
}

void pki_perf_bp_retire(int fd, uint64_t *count)
{
	uint64_t id;

	if (ioctl(fd, PERF_EVENT_IOC_ID, &id))
		return;
	ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
	pki_perf_bp_count(fd, count);
	close(fd);
}

int pki_perf_bp_modify(int fd, const struct pki_bp *bp)
{
	struct perf_event_attr attr;

	pki_perf_bp_attr(&attr, bp);
	return ioctl(fd, PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &attr) ? -errno : 0;
}

int pki_perf_bp_enable(int fd, bool on)
{
	return ioctl(fd, on ? PERF_EVENT_IOC_ENABLE : PERF_EVENT_IOC_DISABLE, 0) ? -errno : 0;
}

int pki_perf_bp_count(int fd, uint64_t *count)
{
	ssize_t n = read(fd, count, sizeof(*count));

	if (n == (ssize_t)sizeof(*count))
		return 0;
	return n < 0 ? -errno : -EIO;
}

/*
 * Arm a counting write breakpoint (no sigtrap: nothing is raised) on this
 * thread over one of two private words, write the first, read the count.
 * @pretend arms it over the second word, which nothing writes: the same
 * system calls and the same write, and the count is 0, as on a machine
 * that accepts breakpoints but never delivers them.  The debug exception
 * of a write comes before the next instruction, so the count is final when
 * the write returns.
 */
int pki_perf_bp_delivered(bool pretend)
{
	static volatile uint64_t words[2];
	struct perf_event_attr attr;
	struct pki_bp bp = {.len = sizeof(words[0]), .type = PK_WATCH_W};
	uint64_t n = 0;
	long fd;
	int err;

	bp.addr = (uintptr_t)&words[pretend ? 1 : 0];
	pki_perf_bp_attr(&attr, &bp);
	attr.sigtrap = 0;
	attr.remove_on_exec = 0;
	fd = syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
	if (fd < 0)
		return -errno;
	words[0]++;
	err = pki_perf_bp_count((int)fd, &n);
	close((int)fd);
	return err ? err : n > 0;
}

/* The integer after @key in the file at @path, or -1 (read with open/read). */
static int file_int(const char *path, const char *key)
{
	char buf[4096], *p;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	if (!key)
		return atoi(buf);
	p = strstr(buf, key);
	return p ? atoi(p + strlen(key)) : -1;
}

void pki_perf_denied_why(char *buf, size_t size)
{
	int paranoid = file_int("/proc/sys/kernel/perf_event_paranoid", NULL);
	int seccomp = file_int("/proc/self/status", "\nSeccomp:");

	if (seccomp > 0 && paranoid <= 2)
		snprintf(buf, size,
			 "this process runs under a seccomp filter (Seccomp: %d in "
			 "/proc/self/status) that denies perf_event_open; "
			 "perf_event_paranoid is %d, which allows watching one's own threads",
			 seccomp, paranoid);
	else if (seccomp > 0)
		snprintf(buf, size,
			 "this process runs under a seccomp filter (Seccomp: %d in "
			 "/proc/self/status), and /proc/sys/kernel/perf_event_paranoid is %d: "
			 "either may deny perf_event_open",
			 seccomp, paranoid);
	else if (paranoid > 2)
		snprintf(buf, size,
			 "/proc/sys/kernel/perf_event_paranoid is %d: above 2 denies "
			 "perf_event_open to unprivileged users (2 allows watching one's own "
			 "threads)",
			 paranoid);
	else
		snprintf(buf, size,
			 "no seccomp filter, and perf_event_paranoid is %d, which allows it: "
			 "a security module (SELinux, AppArmor) or the container's policy "
			 "denies perf_event_open",
			 paranoid);
}
