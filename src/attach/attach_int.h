/* SPDX-License-Identifier: MIT */
/* What preflight.c and inject.c share (attach.h). */
#ifndef PK_ATTACH_ATTACH_INT_H
#define PK_ATTACH_ATTACH_INT_H

#include <stddef.h>

#include "attach/attach.h"

/* snprintf into @why (if not NULL); returns 0 so `return why(...), -E` reads well. */
__attribute__((format(printf, 3, 4))) int pki_attach_why(char *why, size_t n, const char *fmt, ...);

/* Read at most @n - 1 bytes of @path, NUL-terminated; the length or -errno. */
int pki_attach_read_file(const char *path, char *buf, size_t n);

#endif /* PK_ATTACH_ATTACH_INT_H */
