/* SPDX-License-Identifier: MIT */
/*
 * Separate debug files: the symbols of a stripped object, installed apart
 * (Debian's -dbg and -dbgsym packages, `objcopy --only-keep-debug`), found
 * the way gdb finds them:
 *
 *  1. by build ID: DIR/.build-id/xx/rest.debug, whose own build ID must be
 *     the object's;
 *  2. by .gnu_debuglink NAME: OBJDIR/NAME, OBJDIR/.debug/NAME and
 *     DIR/OBJDIR/NAME, whose CRC-32 must be the one the link records;
 *  3. debuginfod's client cache (no network): $DEBUGINFOD_CACHE_PATH or
 *     ~/.cache/debuginfod_client, BUILDID/debuginfo, checked as in 1
 *     (`debuginfod-find debuginfo PROG` fills it).
 *
 * DIR is /usr/lib/debug, or each directory of PROBEKIT_DEBUG_DIR
 * (colon-separated).  Pure file reading; normal context.
 */
#ifndef PK_SYM_DEBUGFILE_H
#define PK_SYM_DEBUGFILE_H

#include <gelf.h>
#include <stddef.h>

/*
 * The debug file of @elf (read from @path, or NULL: no debuglink search
 * relative to it), opened: a descriptor (O_CLOEXEC), its path in @found,
 * or -ENOENT when there is none, or another -errno.
 */
int pki_debugfile_open(Elf *elf, const char *path, char *found, size_t len);

/* The standard CRC-32 (.gnu_debuglink's, zlib's) of @len bytes at @p, from @crc. */
unsigned pki_crc32_ieee(unsigned crc, const void *p, size_t len);

#endif /* PK_SYM_DEBUGFILE_H */
