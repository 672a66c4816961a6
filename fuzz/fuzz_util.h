/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the fuzz targets: the input as a file, without touching
 * the disk (a memfd, reachable by path through /proc/self/fd).
 */
#ifndef PK_FUZZ_UTIL_H
#define PK_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* A memfd holding @size bytes of @data; aborts on failure (not a finding). */
static inline int fuzz_memfd(const uint8_t *data, size_t size)
{
	int fd = memfd_create("fuzz-input", MFD_CLOEXEC);
	size_t off = 0;

	if (fd < 0) {
		perror("memfd_create");
		abort();
	}
	while (off < size) {
		ssize_t n = write(fd, data + off, size - off);

		if (n <= 0) {
			perror("write memfd");
			abort();
		}
		off += (size_t)n;
	}
	return fd;
}

/* The memfd's path: "/proc/self/fd/N" in @buf. */
static inline const char *fuzz_fd_path(int fd, char *buf, size_t len)
{
	snprintf(buf, len, "/proc/self/fd/%d", fd);
	return buf;
}

#endif /* PK_FUZZ_UTIL_H */
