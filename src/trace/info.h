/* SPDX-License-Identifier: MIT */
/*
 * What a trace's INFO records (format.h, since 1.8) say about the process
 * and the machine: gathered by the writer when a session opens, one item a
 * record.  Normal context (it reads /proc/self/cmdline).
 */
#ifndef PK_TRACE_INFO_H
#define PK_TRACE_INFO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/utsname.h>

#include "trace/format.h"

#define PKI_INFO_ITEMS 10u

struct pki_trace_info_item {
	const char *key, *value;
	uint32_t len, flags; /* flags: PKI_INFO_CUT */
};

struct pki_trace_info {
	struct utsname uts;
	char argv[PKI_TRACE_MAX_STRING];
	char kernel[2 * sizeof(((struct utsname *)0)->release) + 2];
	char cpus[24];
	struct pki_trace_info_item item[PKI_INFO_ITEMS];
	size_t n;
};

/*
 * Fill @in with what this process and machine are, and @command (the
 * probekit command line, or NULL: no such item) as given.  What cannot be
 * read is left out.
 */
void pki_trace_info_gather(struct pki_trace_info *in, const char *command);

#endif /* PK_TRACE_INFO_H */
