// SPDX-License-Identifier: MIT
/*
 * The system calls that move a buffer (read, write and their kin): while a
 * page watchpoint exists, a call whose buffer touches a watched page runs
 * on a bounce buffer of ours, and the bytes move between it and PROG's
 * buffer through the watch's alias, reported as the call's access
 * (PK_WATCH_HIT_SYSCALL).  Without this the kernel, which meets the
 * watched page's protection in its own copy, fails the call with EFAULT:
 * a result PROG would not have seen unwatched.  The protocol:
 * doc/design/page-watch.md, PW6.
 *
 * Covered: PROG's and its libraries' calls of the functions below (the
 * agent is preloaded: they bind to these).  Not covered, said in PW6: the
 * other calls that take a buffer (recvmsg, fstat, getdents...), calls libc
 * makes inside itself (fread's read into a large user buffer), a raw
 * syscall(2), the attached agent (nothing binds to it), and a call already
 * blocked in the kernel when the page became watched.
 *
 * And mprotect: on watched pages the program's protection is recorded and
 * the watch's kept within it (PW8), so that the program's own faults stay
 * its own and its later accesses are still seen.
 *
 * With nothing watched a wrapper costs one load (pki_page_overlaps), and
 * mprotect two atomic additions more (a conversion waits for a call that
 * searched before its region was published: PW2 1a).  Each
 * is async-signal-safe where the original is: the bounce buffer is mapped
 * (mmap), the transfer takes only the step lock, signals blocked.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "agent_int.h"
#include "watch/page.h"
#include "watch/watch_int.h"

#define PK_EXPORT __attribute__((visibility("default")))

static struct {
	void *read, *write, *pread, *pread64, *pwrite, *pwrite64, *readv, *writev, *recv, *recvfrom,
	    *send, *sendto, *__read_chk, *__pread_chk, *__pread64_chk, *__recv_chk, *__recvfrom_chk,
	    *mprotect;
} real;

void agent_bounce_init(void)
{
	/* Resolved before main(): the first call may come from a signal handler. */
	agent_next(&real.read, "read");
	agent_next(&real.write, "write");
	agent_next(&real.pread, "pread");
	agent_next(&real.pread64, "pread64");
	agent_next(&real.pwrite, "pwrite");
	agent_next(&real.pwrite64, "pwrite64");
	agent_next(&real.readv, "readv");
	agent_next(&real.writev, "writev");
	agent_next(&real.recv, "recv");
	agent_next(&real.recvfrom, "recvfrom");
	agent_next(&real.send, "send");
	agent_next(&real.sendto, "sendto");
	agent_next(&real.__read_chk, "__read_chk");
	agent_next(&real.__pread_chk, "__pread_chk");
	agent_next(&real.__pread64_chk, "__pread64_chk");
	agent_next(&real.__recv_chk, "__recv_chk");
	agent_next(&real.__recvfrom_chk, "__recvfrom_chk");
	agent_next(&real.mprotect, "mprotect");
}

/*
 * One call of the family: @run makes it on @buf of @n bytes with the rest
 * of its arguments in @a.  The shapes differ only in those arguments.
 */
struct args {
	void *fn;
	int fd, flags;
	off_t off;
	size_t buflen; /* the _chk variants' */
	bool chk;
	struct sockaddr *from;
	socklen_t *fromlen;
	const struct sockaddr *to;
	socklen_t tolen;
};

typedef ssize_t (*run_fn)(const struct args *a, void *buf, size_t n);

/*
 * The most one call moves (the kernel's MAX_RW_COUNT): a length past it
 * gets no bigger bounce buffer, the call would stop there anyway.
 */
#define RW_MAX ((size_t)0x7ffff000)

/* Reserved as it is touched (MAP_NORESERVE): a read's length may be far more than comes. */
static void *bounce_get(size_t n)
{
	void *b = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	return b == MAP_FAILED ? NULL : b;
}

/*
 * A call that fills PROG's @buf: made on a bounce buffer, whose bytes then
 * move into @buf.  @ret: the wrapper's return address (the call site, and
 * whether the agent itself called: its accesses are not PROG's).
 */
static ssize_t fill(run_fn run, const struct args *a, void *buf, size_t n, void *ret)
{
	void *b;
	ssize_t k;
	int err;

	if (a->chk && n > a->buflen) /* the fortified check's abort, before anything */
		return run(a, buf, n);
	/*
	 * Only as many bytes as the program's protection lets the kernel
	 * write (PW8): what the call takes it cannot give back.  None: the
	 * kernel's EFAULT, nothing taken.
	 */
	n = pki_page_reach(buf, n < RW_MAX ? n : RW_MAX, true);
	if (!n)
		return errno = EFAULT, -1;
	b = bounce_get(n);
	if (!b) /* no memory for it: the call as it is */
		return run(a, buf, n);
	k = run(a, b, n);
	err = errno;
	if (k > 0) {
		size_t m = pki_page_transfer(buf, b, (size_t)k, true, (uintptr_t)ret,
					     !agent_from_self(ret));

		if (m < (size_t)k) { /* PROG's buffer ends before its length: as the kernel */
			k = m ? (ssize_t)m : -1;
			err = EFAULT;
		}
	}
	munmap(b, n ? n : 1);
	errno = err;
	return k;
}

/* A call that reads PROG's @buf: its bytes moved into a bounce buffer first. */
static ssize_t drain(run_fn run, const struct args *a, const void *buf, size_t n, void *ret)
{
	void *b;
	size_t m;
	ssize_t k;
	int err;

	if (n > RW_MAX)
		n = RW_MAX;
	b = bounce_get(n);
	if (!b)
		return run(a, (void *)buf, n);
	m = pki_page_transfer((void *)buf, b, n, false, (uintptr_t)ret, !agent_from_self(ret));
	if (m == 0 && n) {
		k = -1;
		err = EFAULT;
	} else {
		k = run(a, b, m);
		err = errno;
	}
	munmap(b, n ? n : 1);
	errno = err;
	return k;
}

/* ---- the calls ---- */

static ssize_t run_read(const struct args *a, void *buf, size_t n)
{
	return ((ssize_t(*)(int, void *, size_t))a->fn)(a->fd, buf, n);
}

static ssize_t run_write(const struct args *a, void *buf, size_t n)
{
	return ((ssize_t(*)(int, const void *, size_t))a->fn)(a->fd, buf, n);
}

static ssize_t run_pread(const struct args *a, void *buf, size_t n)
{
	return ((ssize_t(*)(int, void *, size_t, off_t))a->fn)(a->fd, buf, n, a->off);
}

static ssize_t run_pwrite(const struct args *a, void *buf, size_t n)
{
	return ((ssize_t(*)(int, const void *, size_t, off_t))a->fn)(a->fd, buf, n, a->off);
}

static ssize_t run_recv(const struct args *a, void *buf, size_t n)
{
	return ((ssize_t(*)(int, void *, size_t, int))a->fn)(a->fd, buf, n, a->flags);
}

static ssize_t run_send(const struct args *a, void *buf, size_t n)
{
	return ((ssize_t(*)(int, const void *, size_t, int))a->fn)(a->fd, buf, n, a->flags);
}

static ssize_t run_recvfrom(const struct args *a, void *buf, size_t n)
{
	return ((ssize_t(*)(int, void *, size_t, int, struct sockaddr *, socklen_t *))a->fn)(
	    a->fd, buf, n, a->flags, a->from, a->fromlen);
}

static ssize_t run_sendto(const struct args *a, void *buf, size_t n)
{
	return ((ssize_t(*)(int, const void *, size_t, int, const struct sockaddr *,
			    socklen_t))a->fn)(a->fd, buf, n, a->flags, a->to, a->tolen);
}

/* The fortified variants check @n against the buffer's size, which the bounce keeps. */
static ssize_t run_read_chk(const struct args *a, void *buf, size_t n)
{
	return ((ssize_t(*)(int, void *, size_t, size_t))a->fn)(a->fd, buf, n, a->buflen);
}

static ssize_t run_pread_chk(const struct args *a, void *buf, size_t n)
{
	return ((ssize_t(*)(int, void *, size_t, off_t, size_t))a->fn)(a->fd, buf, n, a->off,
								       a->buflen);
}

static ssize_t run_recv_chk(const struct args *a, void *buf, size_t n)
{
	return ((ssize_t(*)(int, void *, size_t, size_t, int))a->fn)(a->fd, buf, n, a->buflen,
								     a->flags);
}

static ssize_t run_recvfrom_chk(const struct args *a, void *buf, size_t n)
{
	return (
	    (ssize_t(*)(int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *))a->fn)(
	    a->fd, buf, n, a->buflen, a->flags, a->from, a->fromlen);
}

/*
 * The wrappers: the call as it is unless its buffer touches a watched
 * page.  A function libc lacks (an old libc's) is ENOSYS, as a stub's.
 */
#define NEXT(name) agent_next(&real.name, #name)
#define CALL_IN(run, a, buf, n)                                                                    \
	(!(a).fn		     ? (errno = ENOSYS, -1)                                        \
	 : pki_page_overlaps(buf, n) ? fill(run, &(a), buf, n, __builtin_return_address(0))        \
				     : run(&(a), buf, n))
#define CALL_OUT(run, a, buf, n)                                                                   \
	(!(a).fn		     ? (errno = ENOSYS, -1)                                        \
	 : pki_page_overlaps(buf, n) ? drain(run, &(a), buf, n, __builtin_return_address(0))       \
				     : run(&(a), (void *)(buf), n))

/*
 * The offset calls by their exported names: with a 64-bit off_t the
 * headers rename pread to pread64.
 */
ssize_t wrap_pread(int fd, void *buf, size_t n, off_t off) __asm__("pread");
ssize_t wrap_pread64(int fd, void *buf, size_t n, off_t off) __asm__("pread64");
ssize_t wrap_pwrite(int fd, const void *buf, size_t n, off_t off) __asm__("pwrite");
ssize_t wrap_pwrite64(int fd, const void *buf, size_t n, off_t off) __asm__("pwrite64");

PK_EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	struct args a = {.fn = NEXT(read), .fd = fd};

	return CALL_IN(run_read, a, buf, n);
}

PK_EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	struct args a = {.fn = NEXT(write), .fd = fd};

	return CALL_OUT(run_write, a, buf, n);
}

PK_EXPORT ssize_t wrap_pread(int fd, void *buf, size_t n, off_t off)
{
	struct args a = {.fn = NEXT(pread), .fd = fd, .off = off};

	return CALL_IN(run_pread, a, buf, n);
}

PK_EXPORT ssize_t wrap_pread64(int fd, void *buf, size_t n, off_t off)
{
	struct args a = {.fn = NEXT(pread64), .fd = fd, .off = off};

	return CALL_IN(run_pread, a, buf, n);
}

PK_EXPORT ssize_t wrap_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	struct args a = {.fn = NEXT(pwrite), .fd = fd, .off = off};

	return CALL_OUT(run_pwrite, a, buf, n);
}

PK_EXPORT ssize_t wrap_pwrite64(int fd, const void *buf, size_t n, off_t off)
{
	struct args a = {.fn = NEXT(pwrite64), .fd = fd, .off = off};

	return CALL_OUT(run_pwrite, a, buf, n);
}

PK_EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	struct args a = {.fn = NEXT(recv), .fd = fd, .flags = flags};

	return CALL_IN(run_recv, a, buf, n);
}

PK_EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	struct args a = {.fn = NEXT(send), .fd = fd, .flags = flags};

	return CALL_OUT(run_send, a, buf, n);
}

/*
 * recvfrom's address and its length, when they touch a watched page: the
 * kernel writes them after taking the message, and would fail with EFAULT
 * having consumed it.  The call gets ours, and they move into PROG's as
 * the call's accesses (the length read first, as the kernel reads it).
 */
static ssize_t recvfrom_addr(run_fn run, struct args *a, void *buf, size_t n, void *ret)
{
	struct sockaddr_storage ss;
	struct sockaddr *from = a->from;
	socklen_t *fromlen = a->fromlen, len, got;
	bool report = !agent_from_self(ret);
	ssize_t k;
	int err;

	if (pki_page_transfer(fromlen, &len, sizeof(len), false, (uintptr_t)ret, report) <
		sizeof(len) ||
	    (int)len < 0) /* the kernel's own EFAULT or EINVAL */
		return run(a, buf, n);
	got = len < sizeof(ss) ? len : sizeof(ss);
	a->from = (struct sockaddr *)&ss;
	a->fromlen = &got;
	k = pki_page_overlaps(buf, n) ? fill(run, a, buf, n, ret) : run(a, buf, n);
	err = errno;
	if (k >= 0) {
		size_t m = len < got ? len : got;

		if (pki_page_transfer(from, &ss, m, true, (uintptr_t)ret, report) < m ||
		    pki_page_transfer(fromlen, &got, sizeof(got), true, (uintptr_t)ret, report) <
			sizeof(got)) {
			k = -1;
			err = EFAULT;
		}
	}
	errno = err;
	return k;
}

static bool addr_watched(const struct args *a)
{
	return a->fn && a->from && a->fromlen &&
	       (pki_page_overlaps(a->fromlen, sizeof(*a->fromlen)) ||
		pki_page_overlaps(a->from, sizeof(struct sockaddr_storage)));
}

PK_EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *from,
			   socklen_t *fromlen)
{
	struct args a = {
	    .fn = NEXT(recvfrom), .fd = fd, .flags = flags, .from = from, .fromlen = fromlen};

	if (addr_watched(&a))
		return recvfrom_addr(run_recvfrom, &a, buf, n, __builtin_return_address(0));
	return CALL_IN(run_recvfrom, a, buf, n);
}

PK_EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *to,
			 socklen_t tolen)
{
	struct args a = {.fn = NEXT(sendto), .fd = fd, .flags = flags, .to = to, .tolen = tolen};

	return CALL_OUT(run_sendto, a, buf, n);
}

PK_EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	struct args a = {.fn = NEXT(__read_chk), .fd = fd, .buflen = buflen, .chk = true};

	return CALL_IN(run_read_chk, a, buf, n);
}

PK_EXPORT ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen)
{
	struct args a = {
	    .fn = NEXT(__pread_chk), .fd = fd, .off = off, .buflen = buflen, .chk = true};

	return CALL_IN(run_pread_chk, a, buf, n);
}

PK_EXPORT ssize_t __pread64_chk(int fd, void *buf, size_t n, off_t off, size_t buflen)
{
	struct args a = {
	    .fn = NEXT(__pread64_chk), .fd = fd, .off = off, .buflen = buflen, .chk = true};

	return CALL_IN(run_pread_chk, a, buf, n);
}

PK_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	struct args a = {
	    .fn = NEXT(__recv_chk), .fd = fd, .flags = flags, .buflen = buflen, .chk = true};

	return CALL_IN(run_recv_chk, a, buf, n);
}

PK_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags,
				 struct sockaddr *from, socklen_t *fromlen)
{
	struct args a = {.fn = NEXT(__recvfrom_chk),
			 .fd = fd,
			 .flags = flags,
			 .buflen = buflen,
			 .chk = true,
			 .from = from,
			 .fromlen = fromlen};

	if (addr_watched(&a))
		return recvfrom_addr(run_recvfrom_chk, &a, buf, n, __builtin_return_address(0));
	return CALL_IN(run_recvfrom_chk, a, buf, n);
}

/*
 * The vector calls: one bounce buffer for the whole vector, one iovec to the
 * call.  A vector the kernel refuses (more than IOV_MAX entries, a total
 * past SSIZE_MAX: EINVAL) goes to it as it is.
 */
typedef ssize_t (*vec_fn)(int, const struct iovec *, int);

static size_t vec_len(const struct iovec *iov, int cnt, bool *watched)
{
	size_t total = 0;

	*watched = false;
	for (int i = 0; i < cnt; i++) {
		if (iov[i].iov_len > SSIZE_MAX - total)
			return SIZE_MAX; /* the call says EINVAL */
		total += iov[i].iov_len;
		*watched |= pki_page_overlaps(iov[i].iov_base, iov[i].iov_len);
	}
	return total < RW_MAX ? total : RW_MAX;
}

/* Moves up to @n bytes between @iov and @b: the bytes moved. */
static size_t vec_move(const struct iovec *iov, int cnt, uint8_t *b, size_t n, bool into_prog,
		       void *ret)
{
	size_t done = 0;

	for (int i = 0; i < cnt && done < n; i++) {
		size_t len = iov[i].iov_len < n - done ? iov[i].iov_len : n - done;
		size_t m = pki_page_transfer(iov[i].iov_base, b + done, len, into_prog,
					     (uintptr_t)ret, !agent_from_self(ret));

		done += m;
		if (m < len)
			break;
	}
	return done;
}

PK_EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	vec_fn fn = (vec_fn)NEXT(readv);
	void *ret = __builtin_return_address(0);
	bool watched;
	size_t total;
	struct iovec one;
	ssize_t k;
	int err;

	if (!fn)
		return errno = ENOSYS, -1;
	if (cnt <= 0 || cnt > IOV_MAX || !iov ||
	    (total = vec_len(iov, cnt, &watched)) == SIZE_MAX || !watched ||
	    !(one.iov_base = bounce_get(total)))
		return fn(fd, iov, cnt);
	/* As fill(): the bytes the program's protection lets the kernel write */
	one.iov_len = 0;
	for (int i = 0; i < cnt && one.iov_len < total; i++) {
		size_t want =
		    iov[i].iov_len < total - one.iov_len ? iov[i].iov_len : total - one.iov_len;
		size_t r = pki_page_reach(iov[i].iov_base, want, true);

		one.iov_len += r;
		if (r < want)
			break;
	}
	if (!one.iov_len && total) {
		munmap(one.iov_base, total);
		return errno = EFAULT, -1;
	}
	k = fn(fd, &one, 1);
	err = errno;
	if (k > 0) {
		size_t m = vec_move(iov, cnt, one.iov_base, (size_t)k, true, ret);

		if (m < (size_t)k) {
			k = m ? (ssize_t)m : -1;
			err = EFAULT;
		}
	}
	munmap(one.iov_base, total ? total : 1);
	errno = err;
	return k;
}

PK_EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	vec_fn fn = (vec_fn)NEXT(writev);
	void *ret = __builtin_return_address(0);
	bool watched;
	size_t total, m;
	struct iovec one;
	ssize_t k;
	int err;

	if (!fn)
		return errno = ENOSYS, -1;
	if (cnt <= 0 || cnt > IOV_MAX || !iov ||
	    (total = vec_len(iov, cnt, &watched)) == SIZE_MAX || !watched ||
	    !(one.iov_base = bounce_get(total)))
		return fn(fd, iov, cnt);
	m = vec_move(iov, cnt, one.iov_base, total, false, ret);
	if (m == 0 && total) {
		k = -1;
		err = EFAULT;
	} else {
		one.iov_len = m;
		k = fn(fd, &one, 1);
		err = errno;
	}
	munmap(one.iov_base, total ? total : 1);
	errno = err;
	return k;
}

/* ---- the program's mprotect (PW8) ---- */

PK_EXPORT int mprotect(void *addr, size_t len, int prot)
{
	int (*fn)(void *, size_t, int) = (int (*)(void *, size_t, int))NEXT(mprotect);
	int err, saved = errno;

	if (!fn)
		return errno = ENOSYS, -1;
	if (agent_from_self(__builtin_return_address(0)))
		return fn(addr, len, prot);
	err = pki_page_prog_mprotect(addr, len, prot, fn);
	if (err)
		return errno = -err, -1;
	errno = saved; /* as the kernel's success: untouched */
	return 0;
}
