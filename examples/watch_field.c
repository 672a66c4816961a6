// SPDX-License-Identifier: MIT
/*
 * A watch of one field of a struct (probekit/watch.h): every write to
 * config.limit, by any thread, is queued by the watch's handler with the
 * writing instruction and, in page mode, the old and new values; the
 * program reads the queue when it likes.  PK_WATCH_MODE_AUTO takes a debug
 * register where the machine delivers their hits, page protection where not.
 *
 *   cc watch_field.c $(pkg-config --cflags --libs probekit) -o watch_field
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <probekit/watch.h>

static volatile struct { /* volatile: each write below is a store */
	char name[16];
	long limit;
	long used;
} config = {"pool", 10, 0};

static void *worker(void *arg)
{
	(void)arg;
	config.used = 3; /* a neighbour: not reported */
	config.limit = 20;
	config.limit = 30;
	return NULL;
}

int main(void)
{
	struct pk_hitq *q = pk_hitq_new(64);
	PK_OPTS(pk_watch_opts, o, .queue = q);
	struct pk_watch *w =
	    pk_watch_add((const void *)&config.limit, sizeof(config.limit), PK_WATCH_W, &o);
	PK_OPTS(pk_watch_hit, h);
	pthread_t t;
	int n = 0;

	if (!w) {
		perror("pk_watch_add");
		return 1;
	}
	printf("watching config.limit in %s mode\n",
	       pk_watch_mode_of(w) == PK_WATCH_MODE_PAGE ? "page" : "hardware");
	pthread_create(&t, NULL, worker, NULL);
	pthread_join(t, NULL);
	pk_watch_remove(w);
	while (pk_hitq_pop(q, &h) == 0) {
		long before, after;

		memcpy(&before, h.before, sizeof(before));
		memcpy(&after, h.after, sizeof(after));
		if (h.flags & PK_WATCH_HIT_PAGE)
			printf("tid %d wrote config.limit: %ld -> %ld at %#lx\n", h.tid, before,
			       after, (unsigned long)h.ip);
		else
			printf("tid %d wrote config.limit at %#lx\n", h.tid, (unsigned long)h.ip);
		n++;
	}
	pk_hitq_free(q);
	printf("%d write(s) seen, limit %ld\n", n, config.limit);
	return n != 2;
}
