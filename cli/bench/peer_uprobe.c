// SPDX-License-Identifier: MIT
/*
 * Kernel uprobes as a benchmark peer: perf_event_open with the "uprobe" PMU
 * (config1 = path of the object file, config2 = file offset of the probed
 * instruction), on this process, every CPU.
 */
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "peer.h"

struct find_ctx {
	unsigned long addr;
	char path[PATH_MAX];
	unsigned long offset;
	int found;
};

/* Translate a virtual address into (object path, file offset) via PT_LOAD. */
static int find_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	struct find_ctx *c = data;

	(void)size;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		unsigned long start = info->dlpi_addr + ph->p_vaddr;

		if (ph->p_type != PT_LOAD || c->addr < start || c->addr >= start + ph->p_memsz)
			continue;
		c->offset = c->addr - start + ph->p_offset;
		if (info->dlpi_name && info->dlpi_name[0]) {
			snprintf(c->path, sizeof(c->path), "%s", info->dlpi_name);
		} else {
			ssize_t n = readlink("/proc/self/exe", c->path, sizeof(c->path) - 1);

			if (n < 0)
				return 0;
			c->path[n] = '\0';
		}
		c->found = 1;
		return 1;
	}
	return 0;
}

static int uprobe_pmu_type(void)
{
	FILE *f = fopen("/sys/bus/event_source/devices/uprobe/type", "r");
	int type = -1;

	if (!f)
		return -ENODEV;
	if (fscanf(f, "%d", &type) != 1)
		type = -ENODEV;
	fclose(f);
	return type;
}

int peer_uprobe_attach(const void *func)
{
	struct find_ctx c = {.addr = (unsigned long)func};
	struct perf_event_attr attr;
	int type = uprobe_pmu_type();
	long fd;

	if (type < 0)
		return type;
	dl_iterate_phdr(find_cb, &c);
	if (!c.found)
		return -ENOENT;
	memset(&attr, 0, sizeof(attr));
	attr.size = sizeof(attr);
	attr.type = (uint32_t)type;
	attr.config1 = (uint64_t)(uintptr_t)c.path; /* read during the syscall only */
	attr.config2 = c.offset;
	attr.exclude_kernel = 1;
	fd = syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
	return fd < 0 ? -errno : (int)fd;
}

long long peer_uprobe_count(int fd)
{
	uint64_t v;

	if (read(fd, &v, sizeof(v)) != (ssize_t)sizeof(v))
		return -errno;
	return (long long)v;
}
