/* SPDX-License-Identifier: MIT */
/*
 * The futex calls probekit makes on its own 32-bit words (process-private,
 * relative CLOCK_MONOTONIC timeouts).  Both are async-signal-safe: signal
 * handlers and fork children use them.
 */
#ifndef PK_BASE_FUTEX_H
#define PK_BASE_FUTEX_H

#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/*
 * Sleep while *@word == @val, at most @rel (NULL: no limit).  0 when woken,
 * -1 with errno EAGAIN (the word had changed), ETIMEDOUT or EINTR.
 */
static inline long pki_futex_wait(const void *word, uint32_t val, const struct timespec *rel)
{
	return syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, val, rel, NULL, 0);
}

/* Wake up to @n sleepers on @word; how many woke. */
static inline long pki_futex_wake(const void *word, int n)
{
	return syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

#endif /* PK_BASE_FUTEX_H */
