/* SPDX-License-Identifier: MIT */
/*
 * "A descriptor we own": the long-lived descriptors the library and the
 * agent keep inside someone else's process (the trace file, /proc/self/mem
 * and /proc/self/maps, the agent's report pipe) are numbers in the
 * program's descriptor table.  A program that closes every descriptor
 * (close_range(3, ~0U, 0), a close loop, as daemons do) and then opens its
 * own files gets those numbers back: a write through the old number would
 * go into the program's file.  So every such descriptor is kept in a
 * struct pki_fd, which remembers which file it is (st_dev, st_ino and the
 * file type), and is checked with pki_fd_check() before each write or each
 * batch of writes: a descriptor that was closed or now names another file
 * is forgotten, never written, never closed (that number is the program's
 * now).
 *
 * Owned descriptors are also moved to a high number (F_DUPFD_CLOEXEC), out
 * of the range a program's own open() calls hand out, so a program that
 * closed ours does not get its number back at its next open().
 *
 * A noted descriptor (pki_fd_note) is one we use but do not own (stderr):
 * it is checked the same way and never closed.
 *
 * The check is a fstat(2): async-signal-safe, about 0.3 us.  It cannot see
 * a descriptor closed and replaced by the SAME file between the check and
 * the write; that is no harm (we write where we meant to).
 */
#ifndef PK_BASE_FD_H
#define PK_BASE_FD_H

#include <stdbool.h>
#include <stdint.h>

struct pki_fd {
	int fd; /* -1: none */
	bool owned;
	uint32_t mode; /* st_mode & S_IFMT */
	uint64_t dev, ino;
};

#define PKI_FD_INIT                                                                                \
	{                                                                                          \
		.fd = -1                                                                           \
	}

/*
 * Take @fd (just opened by the caller) as ours: moved to a high number,
 * close-on-exec, its identity remembered.  0, or -errno (@fd is closed
 * then).  If no high number is free, @fd stays where it is (still checked).
 */
int pki_fd_own(struct pki_fd *o, int fd);

/*
 * Move @fd (ours, just opened) to a high number, close-on-exec; the new
 * number, or @fd itself if none is free up there.  For descriptors that
 * all look alike to fstat() (perf events: one anonymous inode).
 */
int pki_fd_high(int fd);

/* Remember @fd's identity without owning it (never moved, never closed). */
int pki_fd_note(struct pki_fd *o, int fd);

/*
 * Is o->fd still the file it was?  If not (closed, or the number now names
 * another file), o->fd becomes -1 and false is returned; the number is left
 * alone.  Async-signal-safe; errno preserved.
 */
bool pki_fd_check(struct pki_fd *o);

/* Is (@dev, @ino) the file @o remembers? */
bool pki_fd_same(const struct pki_fd *o, uint64_t dev, uint64_t ino);

/*
 * Close o->fd if it is owned and still the file it was; forget it in any
 * case.  Async-signal-safe.
 */
void pki_fd_close(struct pki_fd *o);

#endif /* PK_BASE_FD_H */
