// SPDX-License-Identifier: MIT
/*
 * The library the attach tests inject: its constructor appends one line
 * to the file named by the process's PK_ATTACH_MARKER ("marker PID TID"),
 * with write(2) only, from whatever thread dlopen runs it on.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((constructor)) static void marker(void)
{
	const char *path = getenv("PK_ATTACH_MARKER");
	char line[64];
	int fd, len;

	if (!path)
		return;
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
	if (fd < 0)
		return;
	len = snprintf(line, sizeof(line), "marker %d %ld\n", (int)getpid(), syscall(SYS_gettid));
	if (write(fd, line, (size_t)len) != len)
		_exit(99);
	close(fd);
}
