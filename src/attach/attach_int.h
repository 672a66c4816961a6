/* SPDX-License-Identifier: MIT */
/* What preflight.c and inject.c share (attach.h). */
#ifndef PK_ATTACH_ATTACH_INT_H
#define PK_ATTACH_ATTACH_INT_H

#include <stddef.h>
#include <sys/types.h>

#include "attach/attach.h"

/* snprintf into @why (if not NULL); returns 0 so `return why(...), -E` reads well. */
__attribute__((format(printf, 3, 4))) int pki_attach_why(char *why, size_t n, const char *fmt, ...);

/* Read at most @n - 1 bytes of @path, NUL-terminated; the length or -errno. */
int pki_attach_read_file(const char *path, char *buf, size_t n);

/*
 * Call @fn(@tid, @arg) for each thread of @pid (/proc/PID/task), until one
 * returns nonzero: that value, 0 after the last, or -errno if the list
 * cannot be read (the process is gone).
 */
int pki_attach_each_task(pid_t pid, int (*fn)(pid_t tid, void *arg), void *arg);

#endif /* PK_ATTACH_ATTACH_INT_H */
