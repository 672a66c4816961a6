// SPDX-License-Identifier: MIT
/*
 * Finding an object's separate debug file (debugfile.h).
 */
#include <elfutils/libdwelf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sym/debugfile.h"

#define DEBUG_DIR "/usr/lib/debug"

unsigned pki_crc32_ieee(unsigned crc, const void *p, size_t len)
{
	const unsigned char *b = p;

	crc = ~crc;
	while (len--) {
		crc ^= *b++;
		for (int k = 0; k < 8; k++)
			crc = crc >> 1 ^ (0xEDB88320u & -(crc & 1));
	}
	return ~crc;
}

/* Does the file on @fd have build ID @id (@len bytes)? */
static bool same_build_id(int fd, const void *id, ssize_t len)
{
	Elf *elf = elf_begin(fd, ELF_C_READ, NULL);
	const void *other;
	bool same = false;

	if (elf) {
		ssize_t n = dwelf_elf_gnu_build_id(elf, &other);

		same = n == len && !memcmp(id, other, (size_t)len);
		elf_end(elf);
	}
	return same;
}

/* Is the CRC-32 of the whole file on @fd (of @size bytes) @want? */
static bool same_crc(int fd, off_t size, unsigned want)
{
	enum { CHUNK = 1 << 16 };
	unsigned char *buf = malloc(CHUNK); /* (not on the stack: any thread may be here) */
	unsigned crc = 0;
	off_t off = 0;
	ssize_t n = -1;

	while (buf && off < size && (n = pread(fd, buf, CHUNK, off)) > 0) {
		crc = pki_crc32_ieee(crc, buf, (size_t)n);
		off += n;
	}
	free(buf);
	return off == size && crc == want;
}

/* Open @path if it is the debug file (@id, or the debuglink's @crc): fd, or -1. */
static int try(const char *path, const void *id, ssize_t idlen, const unsigned *crc)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* (a FIFO never blocks us) */
	struct stat st;

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) { /* (no device, FIFO, directory) */
		close(fd);
		return -1;
	}
	if (id ? same_build_id(fd, id, idlen) : same_crc(fd, st.st_size, *crc))
		return fd;
	close(fd);
	return -1;
}

/* The i-th debug directory into @out: false past the last. */
static bool debug_dir(int i, char *out, size_t len)
{
	const char *env = getenv("PROBEKIT_DEBUG_DIR"), *p;

	if (!env || !*env)
		return !i && snprintf(out, len, "%s", DEBUG_DIR) > 0;
	for (p = env; i--; p++) {
		p = strchr(p, ':');
		if (!p)
			return false;
	}
	snprintf(out, len, "%.*s", (int)strcspn(p, ":"), p);
	return true;
}

static int by_build_id(const unsigned char *id, ssize_t n, char *found, size_t len)
{
	char hex[2 * 64 + 1], dir[4096];
	const char *cache = getenv("DEBUGINFOD_CACHE_PATH"), *home = getenv("HOME");
	int fd = -1;

	if (n < 2 || n > 64)
		return -ENOENT;
	for (ssize_t k = 0; k < n; k++)
		snprintf(hex + 2 * k, 3, "%02x", id[k]);
	for (int i = 0; fd < 0 && debug_dir(i, dir, sizeof(dir)); i++) {
		snprintf(found, len, "%s/.build-id/%.2s/%s.debug", dir, hex, hex + 2);
		fd = try(found, id, n, NULL);
	}
	if (fd < 0 && (cache || home)) {
		if (cache)
			snprintf(found, len, "%s/%s/debuginfo", cache, hex);
		else
			snprintf(found, len, "%s/.cache/debuginfod_client/%s/debuginfo", home, hex);
		fd = try(found, id, n, NULL);
	}
	return fd;
}

static int by_debuglink(Elf *elf, const char *path, char *found, size_t len)
{
	GElf_Word crc;
	const char *name = dwelf_elf_gnu_debuglink(elf, &crc);
	char objdir[4096], dir[4096];
	const char *slash = path ? strrchr(path, '/') : NULL;
	int fd = -1;

	if (!name || !*name || strchr(name, '/') || !slash)
		return -1;
	snprintf(objdir, sizeof(objdir), "%.*s", (int)(slash - path), path);
	snprintf(found, len, "%s/%s", objdir, name);
	if (strcmp(found, path)) /* (a link to itself is no debug file) */
		fd = try(found, NULL, 0, &crc);
	if (fd < 0) {
		snprintf(found, len, "%s/.debug/%s", objdir, name);
		fd = try(found, NULL, 0, &crc);
	}
	for (int i = 0; fd < 0 && objdir[0] == '/' && debug_dir(i, dir, sizeof(dir)); i++) {
		snprintf(found, len, "%s%s/%s", dir, objdir, name); /* (an absolute objdir only) */
		fd = try(found, NULL, 0, &crc);
	}
	return fd;
}

int pki_debugfile_open(Elf *elf, const char *path, char *found, size_t len)
{
	const void *id;
	ssize_t n = dwelf_elf_gnu_build_id(elf, &id);
	int fd = n > 0 ? by_build_id(id, n, found, len) : -1;

	if (fd < 0)
		fd = by_debuglink(elf, path, found, len);
	if (fd < 0 && len)
		found[0] = '\0';
	return fd < 0 ? -ENOENT : fd;
}
