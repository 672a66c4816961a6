// SPDX-License-Identifier: MIT
/*
 * Fuzz target: pk_sites_file_foreach() on any byte string, given as a file
 * (a memfd).  It must never crash, leak or hang, and what it reports must
 * keep the header's promises: sites in strictly increasing address order,
 * func == ip or ip - 4 (after an endbr64), a known kind, a name, the object
 * named as the path given, a count that matches the stats, and a walk that
 * stops where the callback asks.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <probekit/sites.h>

#include "fuzz_util.h"

struct walk {
	const char *path;
	unsigned long last_ip;
	int n, stop_at;
};

static int check_site(const struct pk_site *s, void *ctx)
{
	struct walk *w = ctx;

	if (w->n && s->ip <= w->last_ip)
		abort(); /* not in strictly increasing address order */
	if (s->func != s->ip && s->func != s->ip - 4)
		abort();
	if (s->kind < PK_SITE_NOP5 || s->kind > PK_SITE_MCOUNT)
		abort();
	if (!s->name || strlen(s->name) > (1u << 30))
		abort();
	if (s->object != w->path)
		abort();
	w->last_ip = s->ip;
	w->n++;
	return w->n == w->stop_at ? 1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	PK_OPTS(pk_sites_stats, st);
	struct walk w = {0};
	char path[64];
	int fd = fuzz_memfd(data, size), ret;

	w.path = fuzz_fd_path(fd, path, sizeof(path));
	ret = pk_sites_file_foreach(w.path, check_site, &w, &st);
	if (ret >= 0) {
		if (ret != w.n || (size_t)ret != st.sites)
			abort();
		if (st.sites > st.records)
			abort();
		/* Again, stopping at the last site: the count includes it. */
		if (ret > 0) {
			struct walk w2 = {.path = w.path, .stop_at = ret};

			if (pk_sites_file_foreach(w.path, check_site, &w2, NULL) != ret)
				abort();
		}
	} else if (ret != -ENOEXEC && ret != -EOPNOTSUPP && ret != -ENOMEM) {
		abort();
	}
	close(fd);
	return 0;
}
