// SPDX-License-Identifier: MIT
/*
 * /proc/self/maps reader: see maps.h.  The file is read in one go with
 * read(2) so the snapshot comes from as few kernel passes as possible; lines
 * are parsed by hand (only start, end and the permission letters matter).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <linux/types.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/maps.h"

/* From linux/fs.h (6.11), which older installed headers lack. */
struct pki_procmap_query {
	__u64 size;
	__u64 query_flags;
	__u64 query_addr;
	__u64 vma_start;
	__u64 vma_end;
	__u64 vma_flags;
	__u64 vma_page_size;
	__u64 vma_offset;
	__u64 inode;
	__u32 dev_major;
	__u32 dev_minor;
	__u32 vma_name_size;
	__u32 build_id_size;
	__u64 vma_name_addr;
	__u64 build_id_addr;
};

#define PKI_PROCMAP_QUERY _IOWR('f', 17, struct pki_procmap_query)
#define PKI_PROCMAP_R	  0x01
#define PKI_PROCMAP_W	  0x02
#define PKI_PROCMAP_X	  0x04
#define PKI_PROCMAP_S	  0x08

int pki_maps_query(int fd, unsigned long addr, struct pki_map *out)
{
	struct pki_procmap_query q = {.size = sizeof(q), .query_addr = addr};

	if (ioctl(fd, PKI_PROCMAP_QUERY, &q))
		return errno == ENOENT ? -ENOENT : -ENOTTY;
	out->start = q.vma_start;
	out->end = q.vma_end;
	out->prot = (q.vma_flags & PKI_PROCMAP_R ? PROT_READ : 0) |
		    (q.vma_flags & PKI_PROCMAP_W ? PROT_WRITE : 0) |
		    (q.vma_flags & PKI_PROCMAP_X ? PROT_EXEC : 0);
	out->shared = q.vma_flags & PKI_PROCMAP_S;
	out->dev_major = q.dev_major;
	out->dev_minor = q.dev_minor;
	out->ino = q.inode;
	out->offset = q.vma_offset;
	return 0;
}

int pki_maps_query_name(int fd, unsigned long addr, char *buf, size_t len)
{
	struct pki_procmap_query q = {.size = sizeof(q),
				      .query_addr = addr,
				      .vma_name_size = (__u32)len,
				      .vma_name_addr = (__u64)(unsigned long)buf};

	if (!len)
		return -EINVAL;
	buf[0] = '\0';
	if (ioctl(fd, PKI_PROCMAP_QUERY, &q))
		return errno == ENOENT ? -ENOENT : -ENOTTY;
	if (!q.vma_name_size)
		buf[0] = '\0';
	return 0;
}

static int read_all(const char *path, char **out, size_t *len)
{
	size_t cap = 16384, n = 0;
	char *buf = malloc(cap), *bigger;
	int fd, err;
	ssize_t r;

	if (!buf)
		return -ENOMEM;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		goto free_buf;
	}
	for (;;) {
		if (cap - n < 4096) {
			bigger = realloc(buf, cap * 2);
			if (!bigger) {
				err = -ENOMEM;
				goto close_fd;
			}
			buf = bigger;
			cap *= 2;
		}
		r = read(fd, buf + n, cap - n - 1);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			err = -errno;
			goto close_fd;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	buf[n] = '\0';
	*out = buf;
	*len = n;
	return 0;

close_fd:
	close(fd);
free_buf:
	free(buf);
	return err;
}

static unsigned long parse_hex(const char **p)
{
	unsigned long v = 0;
	const char *s = *p;

	for (;; s++) {
		char c = *s;

		if (c >= '0' && c <= '9')
			v = v * 16 + (unsigned long)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v = v * 16 + (unsigned long)(c - 'a' + 10);
		else
			break;
	}
	*p = s;
	return v;
}

static unsigned long parse_dec(const char **p)
{
	unsigned long v = 0;
	const char *s = *p;

	for (; *s >= '0' && *s <= '9'; s++)
		v = v * 10 + (unsigned long)(*s - '0');
	*p = s;
	return v;
}

/* In the smaps entry [@p, @end): its VmFlags and ProtectionKey into @out. */
static void entry_flags(const char *p, const char *end, struct pki_map_flags *out)
{
	while (p < end) {
		const char *eol = memchr(p, '\n', (size_t)(end - p));

		if (!eol)
			eol = end;
		if (!strncmp(p, "ProtectionKey:", 14)) {
			const char *q = p + 14;

			while (*q == ' ')
				q++;
			out->pkey = (int)parse_dec(&q);
		} else if (!strncmp(p, "VmFlags:", 8)) {
			for (const char *q = p + 8; q + 2 <= eol; q += 3)
				if (q[0] == ' ' && q + 3 <= eol && q[1] == 'g' && q[2] == 'd')
					out->growsdown = true;
		}
		p = eol + 1;
	}
}

int pki_maps_flags(unsigned long start, struct pki_map_flags *out)
{
	char *buf = NULL;
	size_t len = 0;
	const char *p, *end;
	int err = read_all("/proc/self/smaps", &buf, &len);

	*out = (struct pki_map_flags){0};
	if (err)
		return err;
	err = -ENOENT;
	for (p = buf, end = buf + len; p < end;) {
		const char *line = p, *next;
		unsigned long a = parse_hex(&p);

		/* an entry's header: "start-end perms ..."; its fields follow */
		if (*p != '-' || a != start) {
			next = memchr(line, '\n', (size_t)(end - line));
			p = next ? next + 1 : end;
			continue;
		}
		next = memchr(line, '\n', (size_t)(end - line));
		p = next ? next + 1 : end;
		for (next = p; next < end;) {
			const char *q = next;

			parse_hex(&q);
			if (*q == '-' && q > next)
				break; /* the next entry's header */
			q = memchr(next, '\n', (size_t)(end - next));
			next = q ? q + 1 : end;
		}
		entry_flags(p, next, out);
		err = 0;
		break;
	}
	free(buf);
	return err;
}

int pki_maps_read(struct pki_maps *maps)
{
	struct pki_map *map, *bigger;
	size_t len = 0, n = 0, cap = 64;
	const char *p, *end;
	char *buf = NULL;
	int err;

	err = read_all("/proc/self/maps", &buf, &len);
	if (err)
		return err;
	map = malloc(cap * sizeof(*map));
	if (!map) {
		err = -ENOMEM;
		goto free_buf;
	}
	for (p = buf, end = buf + len; p < end;) {
		struct pki_map m;

		m.start = parse_hex(&p);
		if (*p++ != '-')
			goto bad;
		m.end = parse_hex(&p);
		if (*p++ != ' ' || end - p < 4)
			goto bad;
		m.prot = (p[0] == 'r' ? PROT_READ : 0) | (p[1] == 'w' ? PROT_WRITE : 0) |
			 (p[2] == 'x' ? PROT_EXEC : 0);
		m.shared = p[3] == 's';
		/* " offset dev_major:dev_minor inode" */
		p += 4;
		if (*p++ != ' ')
			goto bad;
		m.offset = parse_hex(&p);
		if (*p++ != ' ')
			goto bad;
		m.dev_major = (unsigned int)parse_hex(&p);
		if (*p++ != ':')
			goto bad;
		m.dev_minor = (unsigned int)parse_hex(&p);
		if (*p++ != ' ')
			goto bad;
		m.ino = parse_dec(&p);
		while (p < end && *p != '\n')
			p++;
		p++;
		if (n == cap) {
			bigger = realloc(map, 2 * cap * sizeof(*map));
			if (!bigger) {
				err = -ENOMEM;
				goto free_map;
			}
			map = bigger;
			cap *= 2;
		}
		map[n++] = m;
	}
	free(buf);
	maps->map = map;
	maps->n = n;
	return 0;

bad:
	err = -EPROTO;
free_map:
	free(map);
free_buf:
	free(buf);
	return err;
}

void pki_maps_free(struct pki_maps *maps)
{
	free(maps->map);
	maps->map = NULL;
	maps->n = 0;
}

const struct pki_map *pki_maps_find(const struct pki_maps *maps, unsigned long addr)
{
	size_t lo = 0, hi = maps->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct pki_map *m = &maps->map[mid];

		if (addr < m->start)
			hi = mid;
		else if (addr >= m->end)
			lo = mid + 1;
		else
			return m;
	}
	return NULL;
}
