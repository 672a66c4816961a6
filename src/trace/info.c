// SPDX-License-Identifier: MIT
/* The facts of a trace's INFO records (info.h). */
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

/*
 * The CPU's model name, as /proc/cpuinfo says it (a hypervisor's kernel may
 * name it otherwise than CPUID's brand string): read once, the first time,
 * and kept for the sessions after it, fork children's included (the file
 * can take milliseconds to read on some kernels).
 */
static void gather_cpu(struct pki_trace_info *in)
{
	static char model[128];
	static const char key[] = "model name";
	char buf[2048], *p, *end;
	ssize_t n = 0;
	int fd;

	if (!model[0] && (fd = open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC)) >= 0) {
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
	}
	buf[n > 0 ? n : 0] = '\0';
	for (p = strstr(buf, key); p && !model[0]; p = strstr(p + 1, key)) {
		if (p != buf && p[-1] != '\n')
			continue;
		p += strspn(p + sizeof(key) - 1, " \t") + sizeof(key) - 1;
		if (*p++ != ':')
			continue;
		p += strspn(p, " \t");
		end = p + strcspn(p, "\n");
		if (*end) /* (a line cut by the read is left out) */
			snprintf(model, sizeof(model), "%.*s", (int)(end - p), p);
	}
	add_str(in, PKI_INFO_CPU, model);
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
