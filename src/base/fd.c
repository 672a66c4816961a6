// SPDX-License-Identifier: MIT
/*
 * The descriptors the library and the agent keep in the program's process:
 * moved out of the way, and checked before use (contract in fd.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fd.h"

/*
 * Where owned descriptors go: high enough that a program's own open()s,
 * which take the lowest free number, do not reach it, low enough not to
 * grow the kernel's descriptor table much (1000 entries: 8 KiB) under a
 * large RLIMIT_NOFILE.
 */
static int high_fd(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 1024)
		return 1000;
	return (int)(rl.rlim_cur - rl.rlim_cur / 4); /* 768 under the usual 1024 */
}

static int remember(struct pki_fd *o, int fd, bool owned)
{
	struct stat st;

	if (fstat(fd, &st))
		return -errno;
	*o = (struct pki_fd){.fd = fd,
			     .owned = owned,
			     .mode = st.st_mode & S_IFMT,
			     .dev = st.st_dev,
			     .ino = st.st_ino};
	return 0;
}

int pki_fd_high(int fd)
{
	int hi = high_fd(), moved;

	if (fd < 0 || fd >= hi)
		return fd;
	moved = fcntl(fd, F_DUPFD_CLOEXEC, hi);
	if (moved < 0) {
		fcntl(fd, F_SETFD, FD_CLOEXEC); /* table full up there: stay */
		return fd;
	}
	close(fd);
	return moved;
}

int pki_fd_own(struct pki_fd *o, int fd)
{
	int err;

	if (fd < 0)
		return -EBADF;
	fd = pki_fd_high(fd);
	err = remember(o, fd, true);
	if (err) {
		close(fd);
		o->fd = -1;
	}
	return err;
}

int pki_fd_note(struct pki_fd *o, int fd)
{
	int err = fd < 0 ? -EBADF : remember(o, fd, false);

	if (err)
		o->fd = -1;
	return err;
}

bool pki_fd_same(const struct pki_fd *o, uint64_t dev, uint64_t ino)
{
	return o->dev == dev && o->ino == ino;
}

bool pki_fd_check(struct pki_fd *o)
{
	int saved = errno;
	struct stat st;
	bool ok;

	if (o->fd < 0)
		return false;
	ok = !fstat(o->fd, &st) && (st.st_mode & S_IFMT) == o->mode &&
	     pki_fd_same(o, st.st_dev, st.st_ino);
	if (!ok)
		o->fd = -1; /* closed or replaced: the number is the program's now */
	errno = saved;
	return ok;
}

void pki_fd_close(struct pki_fd *o)
{
	int saved = errno;

	if (o->owned && pki_fd_check(o))
		close(o->fd);
	o->fd = -1;
	errno = saved;
}
