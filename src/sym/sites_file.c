// SPDX-License-Identifier: MIT
/*
 * pk_sites_file_foreach: the sites of an ELF file on disk, as the compiler
 * recorded them, at link-time addresses.  Nothing is loaded or mapped
 * executable; used by `probekit sites FILE` and by tests that compare a
 * file with the same object loaded in memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "base/opts.h"
#include "sym/elf_sites.h"

PK_API int pk_sites_file_foreach(const char *path, pk_site_fn fn, void *ctx,
				 struct pk_sites_stats *stats)
{
	struct pki_elf_sites es;
	size_t i;
	int fd, ret;

	if (!path || !fn)
		return -EINVAL;
	if (stats && pki_opts_out_check(stats, PKI_OPTS_END(struct pk_sites_stats, pic),
					"pk_sites_file_foreach: stats"))
		return -EINVAL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ret = pki_elf_sites_read(fd, &es);
	close(fd);
	if (ret)
		return ret;
	if (stats) {
		es.stats.sz = sizeof(es.stats);
		pki_opts_out(stats, &es.stats, sizeof(es.stats));
	}
	for (i = 0; i < es.n; i++) {
		const struct pki_elf_site *e = &es.sites[i];
		struct pk_site s = {
		    .sz = sizeof(s),
		    .ip = e->vaddr,
		    .func = e->func,
		    .name = e->name,
		    .object = path,
		    .kind = e->kind,
		};
		int r = fn(&s, ctx);

		if (r < 0) {
			ret = r;
			break;
		}
		ret++;
		if (r > 0)
			break;
	}
	pki_elf_sites_free(&es);
	return ret;
}
