// SPDX-License-Identifier: MIT
/*
 * Is a CET user shadow stack on for this thread (abi.h, pki_arch_shstk)?
 * ARCH_SHSTK_STATUS (Linux 6.6+) reports the features enabled for the
 * thread; older kernels have no user shadow stack at all.
 * /proc/self/status ("x86_Thread_features: shstk") is the fallback the
 * kernel documents.  Normal context (a system call, maybe a file read).
 */
#include <fcntl.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "arch/x86_64/abi.h"

#define ARCH_SHSTK_STATUS_ 0x5005
#define ARCH_SHSTK_SHSTK_  (1ul << 0)

bool pki_arch_shstk(void)
{
	unsigned long features = 0;
	char buf[4096], *p;
	ssize_t n;
	int fd;

	if (!syscall(SYS_arch_prctl, ARCH_SHSTK_STATUS_, &features))
		return features & ARCH_SHSTK_SHSTK_;
	fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = 0;
	p = strstr(buf, "\nx86_Thread_features:");
	if (!p)
		return false;
	p += strlen("\nx86_Thread_features:");
	p[strcspn(p, "\n")] = 0;
	return strstr(p, "shstk") != NULL;
}
