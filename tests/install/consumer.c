// SPDX-License-Identifier: MIT
/*
 * A program outside the tree, built against an installed probekit through
 * pkg-config: proves the installed headers, libraries and .pc file work, by
 * using the slot model and a real all-threads watchpoint.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <probekit/probekit.h>
#include <probekit/slots.h>
#include <probekit/watch.h>

static volatile long shared;

static void *writer(void *arg)
{
	(void)arg;
	for (int i = 0; i < 3; i++)
		shared = i;
	return NULL;
}

static int check_slots(void)
{
	PK_OPTS(pk_slots_config, cfg, .nr_cpus = 2, .nr_slots_data = 4, .shared = true);
	struct pk_slots *s = pk_slots_new(&cfg);
	int i, err = 0;

	if (!s)
		return -errno;
	for (i = 0; i < 4; i++)
		err |= pk_slots_reserve(s, 1, -1, PK_BP_W);
	if (err || pk_slots_reserve(s, 1, -1, PK_BP_X) != -ENOSPC)
		err = -EPROTO;
	pk_slots_free(s);
	return err;
}

int main(void)
{
	PK_OPTS(pk_watch_opts, o);
	struct pk_watch *w;
	pthread_t t;
	unsigned long hits;

	pk_set_print(pk_print_stderr);
	if (check_slots()) {
		fprintf(stderr, "consumer: slot model gave a wrong answer\n");
		return 1;
	}
	w = pk_watch_add((const void *)&shared, sizeof(shared), PK_WATCH_W, &o);
	if (!w) {
		fprintf(stderr, "consumer: pk_watch_add: %s\n", strerror(errno));
		return 1;
	}
	shared = 42;				/* this thread */
	pthread_create(&t, NULL, writer, NULL); /* a thread created later */
	pthread_join(t, NULL);
	hits = pk_watch_hits(w);
	pk_watch_remove(w);
	if (hits != 4) {
		fprintf(stderr, "consumer: %lu hits, expected 4\n", hits);
		return 1;
	}
	printf("consumer: probekit %s: slots ok, 4 of 4 writes caught\n", pk_version());
	return 0;
}
