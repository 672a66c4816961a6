/* SPDX-License-Identifier: MIT */
/*
 * A snapshot of this process's memory map (/proc/self/maps): address ranges
 * and their protection.  The patcher uses it to refuse addresses outside
 * executable mappings and to restore each range's own protection afterwards;
 * page watchpoints, to check what a watched range lies in.
 */
#ifndef PK_BASE_MAPS_H
#define PK_BASE_MAPS_H

#include <stdbool.h>
#include <stddef.h>

struct pki_map {
	unsigned long start, end; /* [start, end) */
	int prot;		  /* PROT_* */
	bool shared;		  /* MAP_SHARED ('s' in /proc/self/maps) */
	/* What is mapped: device and inode (0 for anonymous memory). */
	unsigned int dev_major, dev_minor;
	unsigned long ino;
	unsigned long offset; /* in the file, of start */
};

struct pki_maps {
	struct pki_map *map; /* sorted by address, disjoint */
	size_t n;
};

/* Read /proc/self/maps into @maps.  Returns 0 or -errno (-ENOMEM, open/read). */
int pki_maps_read(struct pki_maps *maps);
void pki_maps_free(struct pki_maps *maps);

/*
 * The mapping containing @addr, asked of the kernel directly (PROCMAP_QUERY
 * ioctl on @fd, an open /proc/self/maps; Linux 6.11+): one VMA lookup instead
 * of reading the whole map.  Returns 0, -ENOENT (nothing mapped there), or
 * -ENOTTY on kernels without the ioctl.
 */
int pki_maps_query(int fd, unsigned long addr, struct pki_map *out);

/*
 * The name /proc/self/maps shows for the mapping at @addr (a path, "[vdso]",
 * or "" when anonymous) into @buf of @len bytes.  Returns 0, -ENOENT, or
 * -ENOTTY (kernel without PROCMAP_QUERY).
 */
int pki_maps_query_name(int fd, unsigned long addr, char *buf, size_t len);

/*
 * What /proc/self/smaps says of the mapping that begins at @start, beyond
 * the maps: whether it grows down (VmFlags "gd": MAP_GROWSDOWN, a stack)
 * and its protection key (0 where the machine has none).  0, -ENOENT (no
 * mapping begins there), or -errno (-ENOMEM, open/read).
 */
struct pki_map_flags {
	bool growsdown;
	int pkey;
};
int pki_maps_flags(unsigned long start, struct pki_map_flags *out);

/* The mapping containing @addr, or NULL. */
const struct pki_map *pki_maps_find(const struct pki_maps *maps, unsigned long addr);

#endif /* PK_BASE_MAPS_H */
