// SPDX-License-Identifier: MIT
/*
 * Target for page watchpoints beside system calls: the kernel reads and
 * writes `inbox` (read, write, pread, readv, writev, recv, send) and the
 * program checks every result.  Prints each call's result and the bytes it
 * moved, and exits 0 only if every call did what it does unwatched.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* A page of its own: no other variable (a sanitizer's flags) shares its faults. */
char inbox[4096] __attribute__((aligned(4096)));
static int bad;
/* Lengths the compiler cannot see: fortified, the calls are libc's checking ones. */
static volatile size_t n8 = 8, n16 = 16;

/* A call returned @got, @want expected, and its @n bytes at @bytes must be @exp. */
static void check(const char *what, ssize_t got, ssize_t want, const char *bytes, const char *exp,
		  size_t n)
{
	int same = got == want && !memcmp(bytes, exp, n);

	printf("%s: %zd %.*s%s\n", what, got, (int)n, bytes, same ? "" : " WRONG");
	bad |= !same;
}

int main(void)
{
	static const char msg[] = "0123456789abcdefghijklmnopqrstuv";
	char back[64] = "", tmpl[] = "/tmp/syscall_buf.XXXXXX";
	int p[2], s[2], fd;
	struct iovec iov[2];

	if (pipe(p) || socketpair(AF_UNIX, SOCK_STREAM, 0, s) || (fd = mkstemp(tmpl)) < 0)
		return 2;
	unlink(tmpl);

	/* the kernel writes inbox */
	if (write(p[1], msg, 16) != 16)
		return 2;
	check("read", read(p[0], inbox, n16), 16, inbox, msg, 16);

	/* ... and reads it */
	check("write", write(p[1], inbox, 16), 16, inbox, msg, 16);
	check("read back", read(p[0], back, 16), 16, back, msg, 16);

	if (pwrite(fd, msg, 32, 0) != 32)
		return 2;
	check("pread", pread(fd, inbox + 16, n8, 4), 8, inbox + 16, msg + 4, 8);

	/* a vector: one piece in inbox, one on the stack */
	iov[0] = (struct iovec){inbox + 32, 4};
	iov[1] = (struct iovec){back, 4};
	if (write(p[1], "WXYZwxyz", 8) != 8)
		return 2;
	check("readv", readv(p[0], iov, 2), 8, inbox + 32, "WXYZ", 4);
	check("readv (the other piece)", 4, 4, back, "wxyz", 4);
	check("writev", writev(p[1], iov, 2), 8, inbox + 32, "WXYZ", 4);
	check("read back", read(p[0], back, 8), 8, back, "WXYZwxyz", 8);

	if (send(s[0], msg + 8, 8, 0) != 8)
		return 2;
	check("recv", recv(s[1], inbox + 40, n8, 0), 8, inbox + 40, msg + 8, 8);
	check("send", send(s[1], inbox + 40, 8, 0), 8, inbox + 40, msg + 8, 8);
	check("recv back", recv(s[0], back, 8, 0), 8, back, msg + 8, 8);
	return bad;
}
