// SPDX-License-Identifier: MIT
/*
 * The ring reader: one sampling perf event on every thread of the process,
 * its samples read from per-CPU mmap ring buffers by an ordinary thread, as
 * `perf record` reads them.  Opening (WR1, WR2), waking (WR4), reading in
 * time order (WR3) and accounting for every sample (WR5) are described in
 * doc/design/watch-ring.md; the labels below refer to it.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/fd.h"
#include "base/log.h"
#include "base/threads.h"
#include "watch/gate.h"
#include "watch/ring.h"

/* One CPU's ring: the event that owns the mapping, and the mapping. */
struct cpu_ring {
	int cpu;
	int fd; /* the first root on this CPU; the others SET_OUTPUT to it */
	struct perf_event_mmap_page *meta;
	uint8_t *data;
	bool hup; /* poll said POLLHUP (its thread exited): no longer polled */
};

/* A copied record, for sorting by time. */
struct ring_rec {
	uint64_t time;
	uint64_t seq; /* ties: the order read */
	const uint8_t *p;
};

struct pki_ring {
	struct perf_event_attr attr;
	unsigned int ncpus, pages;
	size_t data_size; /* bytes of data per ring */
	struct cpu_ring *rings;
	int *fds; /* every root: (thread, CPU) */
	size_t nfds, cap_fds;
	pid_t *tids; /* the threads that have their roots */
	size_t ntids, cap_tids;
	int kick; /* eventfd: pki_ring_kick() */
	struct pollfd *pfds;
	uint8_t *scratch; /* room for every ring's data at once */
	struct ring_rec *recs;
	size_t max_recs;
	uint64_t nread, lost, throttled;
};

/* The online CPUs (/sys/devices/system/cpu/online, "0-3,6") into @cpus; how many, or -errno. */
static int online_cpus(int **cpus)
{
	char buf[4096], *p, *end;
	int fd = open("/sys/devices/system/cpu/online", O_RDONLY | O_CLOEXEC), n = 0, cap = 0;
	ssize_t len;

	*cpus = NULL;
	if (fd < 0)
		return -errno;
	len = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (len <= 0)
		return len < 0 ? -errno : -EIO;
	buf[len] = 0;
	for (p = buf; *p && *p != '\n';) {
		long lo = strtol(p, &end, 10), hi = lo;

		if (end == p)
			break;
		if (*end == '-')
			hi = strtol(end + 1, &end, 10);
		for (long c = lo; c <= hi; c++) {
			if (n == cap) {
				int *grown = realloc(*cpus, (size_t)(cap = cap ? 2 * cap : 16) *
								sizeof(int));

				if (!grown)
					return free(*cpus), *cpus = NULL, -ENOMEM;
				*cpus = grown;
			}
			(*cpus)[n++] = (int)c;
		}
		p = *end == ',' ? end + 1 : end;
	}
	return n ? n : -EIO;
}

static bool has_fd_room(struct pki_ring *r)
{
	int *grown;

	if (r->nfds < r->cap_fds)
		return true;
	grown = realloc(r->fds, (r->cap_fds = r->cap_fds ? 2 * r->cap_fds : 16) * sizeof(int));
	if (!grown)
		return false;
	r->fds = grown;
	return true;
}

/* Map @pages data pages of @c's ring (fewer if the locked-memory limit refuses). */
static int ring_map(struct pki_ring *r, struct cpu_ring *c)
{
	long page = sysconf(_SC_PAGESIZE);
	void *m;

	for (;;) {
		m = mmap(NULL, (size_t)(r->pages + 1) * (size_t)page, PROT_READ | PROT_WRITE,
			 MAP_SHARED, c->fd, 0);
		if (m != MAP_FAILED)
			break;
		/* The first ring settles the size: the others are mapped alike. */
		if (errno != EPERM || r->pages == 1 || c != r->rings)
			return -errno;
		r->pages /= 2;
	}
	c->meta = m;
	c->data = (uint8_t *)m + page;
	r->data_size = (size_t)r->pages * (size_t)page;
	return 0;
}

/* WR1, WR2: the events of thread @tid, one per CPU, each writing into its CPU's ring. */
static int roots_of(pid_t tid, void *arg)
{
	struct pki_ring *r = arg;

	for (size_t k = 0; k < r->ntids; k++)
		if (r->tids[k] == tid)
			return 0; /* an earlier pass's */
	if (r->ntids == r->cap_tids) {
		pid_t *grown = realloc(r->tids, (r->cap_tids = r->cap_tids ? 2 * r->cap_tids : 16) *
						    sizeof(pid_t));

		if (!grown)
			return -ENOMEM;
		r->tids = grown;
	}
	r->tids[r->ntids++] = tid;
	for (unsigned int i = 0; i < r->ncpus; i++) {
		struct cpu_ring *c = &r->rings[i];
		long fd;
		int err;

		if (!has_fd_room(r))
			return -ENOMEM;
		fd = syscall(SYS_perf_event_open, &r->attr, tid, c->cpu, -1, PERF_FLAG_FD_CLOEXEC);
		if (fd < 0) {
			if (errno == ESRCH)
				return 0; /* exited since the listing */
			return -errno;
		}
		fd = pki_fd_high((int)fd);
		r->fds[r->nfds++] = (int)fd;
		if (c->fd < 0) {
			c->fd = (int)fd;
			err = ring_map(r, c);
		} else {
			err = ioctl((int)fd, PERF_EVENT_IOC_SET_OUTPUT, c->fd) ? -errno : 0;
		}
		if (err)
			return err;
	}
	return 0;
}

/* Every thread's: see __open_all_roots() in watch.c for why the listing repeats. */
static int open_all(struct pki_ring *r)
{
	size_t before;
	int err;

	pki_gate_close();
	do {
		before = r->nfds;
		err = pki_threads_each(0, roots_of, r);
	} while (!err && r->nfds != before);
	pki_gate_open();
	return err;
}

struct pki_ring *pki_ring_open(const struct perf_event_attr *attr, unsigned int pages)
{
	struct pki_ring *r;
	int *cpus = NULL, n, err;

	if (!attr || (attr->sample_type & ~(uint64_t)PKI_RING_SAMPLE_TYPES) || !pages ||
	    (pages & (pages - 1)) || attr->freq) {
		errno = EINVAL;
		return NULL;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->kick = -1;
	r->attr = *attr;
	r->attr.size = sizeof(r->attr);
	r->attr.disabled = 1;
	r->pages = pages;
	n = online_cpus(&cpus);
	if (n < 0) {
		err = n;
		goto fail;
	}
	r->ncpus = (unsigned int)n;
	r->rings = calloc((size_t)n, sizeof(*r->rings));
	r->pfds = calloc((size_t)n + 1, sizeof(*r->pfds));
	if (!r->rings || !r->pfds) {
		err = -ENOMEM;
		goto fail;
	}
	for (int i = 0; i < n; i++)
		r->rings[i] = (struct cpu_ring){.cpu = cpus[i], .fd = -1};
	free(cpus);
	cpus = NULL;
	/* WR4: wake the reader when a ring is a quarter full, not at every sample. */
	r->attr.watermark = 1;
	r->attr.wakeup_watermark = (uint32_t)((size_t)pages * (size_t)sysconf(_SC_PAGESIZE) / 4);
	err = open_all(r);
	if (err)
		goto fail;
	r->kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (r->kick < 0) {
		err = -errno;
		goto fail;
	}
	r->scratch = malloc(r->data_size * r->ncpus);
	/* the most samples the rings can hold: each is its header and a u64 per field */
	r->max_recs = r->data_size * r->ncpus /
		      (sizeof(struct perf_event_header) +
		       8 * (size_t)__builtin_popcountll(r->attr.sample_type));
	r->recs = malloc(r->max_recs * sizeof(*r->recs));
	if (!r->scratch || !r->recs) {
		err = -ENOMEM;
		goto fail;
	}
	return r;
fail:
	free(cpus);
	pki_ring_close(r);
	errno = -err;
	return NULL;
}

int pki_ring_enable(struct pki_ring *r, bool on)
{
	int err = 0;

	for (size_t i = 0; i < r->nfds; i++)
		if (ioctl(r->fds[i], on ? PERF_EVENT_IOC_ENABLE : PERF_EVENT_IOC_DISABLE, 0) &&
		    !err)
			err = -errno;
	return err;
}

void pki_ring_kick(struct pki_ring *r)
{
	uint64_t one = 1;

	if (write(r->kick, &one, sizeof(one)) < 0) {
		/* the counter is saturated: a wakeup is pending anyway */
	}
}

int pki_ring_wait(struct pki_ring *r, int timeout_ms)
{
	nfds_t n = 0;
	int got;

	for (unsigned int i = 0; i < r->ncpus; i++) {
		if (r->rings[i].hup)
			continue;
		r->pfds[n++] = (struct pollfd){.fd = r->rings[i].fd, .events = POLLIN};
	}
	r->pfds[n++] = (struct pollfd){.fd = r->kick, .events = POLLIN};
	got = poll(r->pfds, n, timeout_ms);
	if (got < 0)
		return errno == EINTR ? 1 : -errno;
	if (r->pfds[n - 1].revents & POLLIN) {
		uint64_t v;

		if (read(r->kick, &v, sizeof(v)) < 0) {
			/* another wait took it */
		}
	}
	/*
	 * WR4: POLLHUP says the ring's owning thread exited; the ring stays
	 * (the other threads' events write into it) but poll would return at
	 * once from now on: it is read at every wakeup, no longer polled.
	 */
	for (nfds_t k = 0; k + 1 < n; k++)
		if ((r->pfds[k].revents & POLLHUP) && !(r->pfds[k].revents & POLLIN))
			for (unsigned int i = 0; i < r->ncpus; i++)
				if (r->rings[i].fd == r->pfds[k].fd)
					r->rings[i].hup = true;
	return got > 0;
}

/* The bytes of ring @c from @off (mod its size), @n of them, into @out. */
static void ring_copy(const struct pki_ring *r, const struct cpu_ring *c, uint64_t off,
		      uint8_t *out, size_t n)
{
	size_t at = (size_t)(off & (r->data_size - 1)), first = r->data_size - at;

	if (first > n)
		first = n;
	memcpy(out, c->data + at, first);
	memcpy(out + first, c->data, n - first);
}

/* Copy @c's records into the scratch from @*used; the records' count, or -EOVERFLOW. */
static int ring_take(struct pki_ring *r, struct cpu_ring *c, size_t *used, size_t *nrecs)
{
	uint64_t head = __atomic_load_n(&c->meta->data_head, __ATOMIC_ACQUIRE);
	uint64_t tail = c->meta->data_tail;

	while (tail < head) {
		struct perf_event_header h;
		uint8_t *p = r->scratch + *used;

		ring_copy(r, c, tail, (uint8_t *)&h, sizeof(h));
		if (h.size < sizeof(h) || h.size > head - tail)
			return -EIO; /* a torn ring: cannot happen */
		ring_copy(r, c, tail, p, h.size);
		tail += h.size;
		*used += h.size;
		if (h.type == PERF_RECORD_LOST) {
			uint64_t lost;

			memcpy(&lost, p + sizeof(h) + 8, sizeof(lost));
			r->lost += lost;
		} else if (h.type == PERF_RECORD_THROTTLE) {
			r->throttled++;
		} else if (h.type == PERF_RECORD_SAMPLE && *nrecs < r->max_recs) {
			uint64_t t = 0;

			if (r->attr.sample_type & PERF_SAMPLE_TIME)
				memcpy(&t,
				       p + sizeof(h) +
					   8 * !!(r->attr.sample_type & PERF_SAMPLE_IP) +
					   8 * !!(r->attr.sample_type & PERF_SAMPLE_TID),
				       sizeof(t));
			r->recs[*nrecs] = (struct ring_rec){.time = t, .seq = *nrecs, .p = p};
			++*nrecs;
		}
	}
	/* WR3: the space goes back to the kernel once copied. */
	__atomic_store_n(&c->meta->data_tail, tail, __ATOMIC_RELEASE);
	return 0;
}

static int rec_cmp(const void *a, const void *b)
{
	const struct ring_rec *x = a, *y = b;

	if (x->time != y->time)
		return x->time < y->time ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* A sample record at @p into @s (the fields in the ABI's order). */
static void sample_parse(const struct pki_ring *r, const uint8_t *p, struct pki_ring_sample *s)
{
	uint64_t st = r->attr.sample_type;
	const struct perf_event_header *h = (const void *)p;
	const uint8_t *end = p + h->size;

	*s = (struct pki_ring_sample){0};
	p += sizeof(*h);
#define TAKE(dst)                                                                                  \
	do {                                                                                       \
		memcpy(&(dst), p, sizeof(dst));                                                    \
		p += sizeof(dst);                                                                  \
	} while (0)
	if (st & PERF_SAMPLE_IP)
		TAKE(s->ip);
	if (st & PERF_SAMPLE_TID) {
		uint32_t pt[2];

		TAKE(pt);
		s->pid = (pid_t)pt[0];
		s->tid = (pid_t)pt[1];
	}
	if (st & PERF_SAMPLE_TIME)
		TAKE(s->time);
	if (st & PERF_SAMPLE_ADDR)
		TAKE(s->addr);
	if (st & PERF_SAMPLE_CALLCHAIN) {
		uint64_t nr;

		TAKE(nr);
		if (nr > (uint64_t)(end - p) / 8)
			nr = (uint64_t)(end - p) / 8;
		s->nr = (uint32_t)nr;
		s->ips = (const uint64_t *)p; /* 8-aligned: records are, in the scratch too */
	}
#undef TAKE
}

long pki_ring_read(struct pki_ring *r, void (*fn)(const struct pki_ring_sample *s, void *ctx),
		   void *ctx)
{
	size_t used = 0, nrecs = 0;
	struct pki_ring_sample s;
	int err;

	for (unsigned int i = 0; i < r->ncpus; i++)
		if ((err = ring_take(r, &r->rings[i], &used, &nrecs)))
			return err;
	qsort(r->recs, nrecs, sizeof(*r->recs), rec_cmp);
	for (size_t i = 0; i < nrecs; i++) {
		sample_parse(r, r->recs[i].p, &s);
		fn(&s, ctx);
	}
	r->nread += nrecs;
	return (long)nrecs;
}

void pki_ring_stats(struct pki_ring *r, struct pki_ring_stats *st)
{
	*st = (struct pki_ring_stats){.read = r->nread,
				      .lost = r->lost,
				      .throttled = r->throttled,
				      .cpus = r->ncpus,
				      .roots = (unsigned int)r->nfds,
				      .pages = r->pages};
	for (size_t i = 0; i < r->nfds; i++) {
		uint64_t v;

		if (read(r->fds[i], &v, sizeof(v)) == (ssize_t)sizeof(v))
			st->counted += v;
	}
}

void pki_ring_close(struct pki_ring *r)
{
	long page = sysconf(_SC_PAGESIZE);

	if (!r)
		return;
	for (unsigned int i = 0; r->rings && i < r->ncpus; i++)
		if (r->rings[i].meta)
			munmap(r->rings[i].meta, (size_t)(r->pages + 1) * (size_t)page);
	for (size_t i = 0; i < r->nfds; i++)
		close(r->fds[i]);
	if (r->kick >= 0)
		close(r->kick);
	free(r->fds);
	free(r->tids);
	free(r->rings);
	free(r->pfds);
	free(r->scratch);
	free(r->recs);
	free(r);
}
