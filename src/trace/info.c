// SPDX-License-Identifier: MIT
/* The facts of a trace's INFO records (info.h). */
#include <cpuid.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <probekit/probekit.h>

#include "trace/info.h"

static void add(struct pki_trace_info *in, const char *key, const char *value, size_t len,
		uint32_t flags)
{
	if (!len || in->n == PKI_INFO_ITEMS)
		return;
	in->item[in->n++] = (struct pki_trace_info_item){key, value, (uint32_t)len, flags};
}

static void add_str(struct pki_trace_info *in, const char *key, const char *value)
{
	size_t len = strlen(value);

	add(in, key, value, len > PKI_TRACE_MAX_STRING ? PKI_TRACE_MAX_STRING : len,
	    len > PKI_TRACE_MAX_STRING ? PKI_INFO_CUT : 0);
}

/*
 * /proc/self/cmdline: the arguments, each ended by its NUL.  A command line
 * longer than the record's limit keeps its whole first arguments (and is
 * flagged cut), so that no argument is shown half.
 */
static void gather_argv(struct pki_trace_info *in)
{
	int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	size_t len = 0, keep;
	ssize_t n = 1;
	char more;

	if (fd < 0)
		return;
	while (len < sizeof(in->argv) && n > 0) {
		n = read(fd, in->argv + len, sizeof(in->argv) - len);
		len += n > 0 ? (size_t)n : 0;
	}
	n = len == sizeof(in->argv) ? read(fd, &more, 1) : 0;
	close(fd);
	if (n <= 0) {
		add(in, PKI_INFO_ARGV, in->argv, len, 0);
		return;
	}
	keep = len;
	while (keep && in->argv[keep - 1])
		keep--;
	add(in, PKI_INFO_ARGV, in->argv, keep, PKI_INFO_CUT);
}

/* The CPU's brand string (what /proc/cpuinfo calls its model name), from CPUID. */
static void gather_cpu(struct pki_trace_info *in)
{
	unsigned int r[12], max = __get_cpuid_max(0x80000000u, NULL);
	const char *s = in->cpu;
	size_t len;

	if (max < 0x80000004u)
		return;
	for (unsigned int i = 0; i < 3; i++)
		__cpuid(0x80000002u + i, r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
	memcpy(in->cpu, r, sizeof(r));
	in->cpu[sizeof(r)] = '\0';
	while (*s == ' ')
		s++;
	len = strlen(s);
	while (len && s[len - 1] == ' ')
		len--;
	add(in, PKI_INFO_CPU, s, len, 0);
}

void pki_trace_info_gather(struct pki_trace_info *in, const char *command)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	in->n = 0;
	gather_argv(in);
	if (!uname(&in->uts)) {
		add_str(in, PKI_INFO_HOST, in->uts.nodename);
		snprintf(in->kernel, sizeof(in->kernel), "%s %s", in->uts.sysname, in->uts.release);
		add_str(in, PKI_INFO_KERNEL, in->kernel);
		add_str(in, PKI_INFO_KVERSION, in->uts.version);
		add_str(in, PKI_INFO_MACHINE, in->uts.machine);
	}
	gather_cpu(in);
	if (cpus > 0) {
		snprintf(in->cpus, sizeof(in->cpus), "%ld", cpus);
		add_str(in, PKI_INFO_CPUS, in->cpus);
	}
	add_str(in, PKI_INFO_VERSION, pk_version());
	if (command)
		add_str(in, PKI_INFO_COMMAND, command);
}
