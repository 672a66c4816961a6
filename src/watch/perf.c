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
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "arch/x86_64/hwbp.h"
#include "core/fd.h"
#include "watch/perf.h"

static void bp_attr(struct perf_event_attr *attr, const struct pki_bp *bp)
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

	bp_attr(&attr, bp);
	fd = syscall(SYS_perf_event_open, &attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
	/* Out of the numbers the program's own open()s take (core/fd.h). */
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

int pki_perf_bp_modify(int fd, const struct pki_bp *bp)
{
	struct perf_event_attr attr;

	bp_attr(&attr, bp);
	return ioctl(fd, PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &attr) ? -errno : 0;
}

int pki_perf_bp_enable(int fd, bool on)
{
	return ioctl(fd, on ? PERF_EVENT_IOC_ENABLE : PERF_EVENT_IOC_DISABLE, 0) ? -errno : 0;
}
