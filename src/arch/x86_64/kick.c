// SPDX-License-Identifier: MIT
/*
 * The sled kick, the patcher's side (the handler is in trap.c): during
 * step 1 of the INT3 protocol (poke_int3.c), every other thread is asked to
 * step out of the sleds of the batch, and the batch waits until each has
 * answered, or was seen asleep outside them, or is gone.  Why that makes
 * converting a sled safe is written below; the threads are listed and
 * sampled with base/threads.h.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "arch/x86_64/poke_int.h"
#include "base/futex.h"
#include "base/grow.h"
#include "base/log.h"
#include "base/signals.h"
#include "base/threads.h"

/* Time allowed for every thread to acknowledge a sled kick. */
#define KICK_TIMEOUT_NS 2000000000l

static int cmp_tid(const void *a, const void *b)
{
	pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;

	return x < y ? -1 : x > y;
}

/* @tid is asleep in the kernel with its pc outside every site of @b. */
static bool kick_seen_outside(const struct pki_batch *b, pid_t tid)
{
	struct pki_thread_state st;

	return !pki_thread_sample(tid, &st) && st.blocked && !pki_batch_find(b, st.pc);
}

/* Name the threads that never answered, and why they may not have. */
static void kick_report(const struct pki_kick *k)
{
	int shown = 0;
	size_t i;

	pki_warn("text poke: %d thread(s) neither answered the sled kick nor were seen asleep "
		 "outside the sleds in %ld ms; batch refused, nothing changed: %s\n",
		 atomic_load(&k->left), KICK_TIMEOUT_NS / 1000000, pki_errstr(ETIMEDOUT));
	for (i = 0; i < k->n && shown < 4; i++) {
		char name[32] = "?";
		uint64_t blk = 0;

		if (atomic_load(&k->acked[i]))
			continue;
		pki_thread_sigblk(k->tid[i], &blk, name, sizeof(name));
		pki_warn("text poke:   thread %d (%s)%s\n", k->tid[i], name,
			 blk & (1ull << (PKI_SIG_KICK - 1))
			     ? " blocks the kick signal and never sleeps"
			     : " is in a handler that blocks the kick");
		shown++;
	}
}

/* The other threads, into a growing array: a pki_threads_each() callback. */
struct kick_list {
	pid_t *tid;
	size_t n, cap;
};

static int kick_list_add(pid_t tid, void *arg)
{
	struct kick_list *l = arg;

	if (PKI_GROW(l->tid, l->cap, l->n + 1))
		return -ENOMEM;
	l->tid[l->n++] = tid;
	return 0;
}

/* Fill @k with every other thread alive now, sorted by tid, none acknowledged. */
static int kick_list(struct pki_kick *k)
{
	struct kick_list l = {0};
	int err;

	err = pki_threads_each((pid_t)syscall(SYS_gettid), kick_list_add, &l);
	if (!err && l.n)
		qsort(l.tid, l.n, sizeof(*l.tid), cmp_tid);
	if (!err) {
		k->acked = calloc(l.n ? l.n : 1, sizeof(*k->acked));
		if (!k->acked)
			err = -ENOMEM;
	}
	if (err) {
		free(l.tid);
		return err;
	}
	k->n = l.n;
	k->tid = l.tid;
	atomic_store(&k->left, (int)l.n);
	return 0;
}

/*
 * Look at the threads not yet acknowledged KICK_LOOKS times, KICK_LOOK_NS
 * apart (at most ~2 ms), before any is signalled: a thread blocked in the
 * kernel (after step 1) at a pc outside every sled of the batch can only
 * come back in through a first byte, now an INT3, so it needs no signal.
 * The signal is what must be spared: a handler that runs while its thread
 * waits in nanosleep, poll, epoll_wait, select... makes the call return
 * EINTR whatever SA_RESTART says, and a thread seen running may be about
 * to wait.  Looking again catches the threads that wait most of the time,
 * between their short runs; what is left is mostly threads that compute.
 * (None reaches the threads that block every signal, e.g. liburcu's
 * workers, either: they are found asleep.)  Limit: a thread never seen
 * asleep in those 2 ms that starts such a wait between the last look and
 * the signal's arrival still gets EINTR; only a protocol that moves no
 * thread's pc (the relays, poke_relay.c) is free of it.
 */
#define KICK_LOOKS   20
#define KICK_LOOK_NS 100000l

static void kick_look(const struct pki_batch *b, struct pki_kick *k)
{
	for (int r = 0; r < KICK_LOOKS && atomic_load(&k->left) > 0; r++) {
		struct timespec gap = {0, KICK_LOOK_NS};

		if (r)
			nanosleep(&gap, NULL);
		for (size_t i = 0; i < k->n; i++)
			if (!atomic_load(&k->acked[i]) && kick_seen_outside(b, k->tid[i]))
				pki_kick_ack(k, i);
	}
}

/* Ask every listed thread that may be inside a sled to step out of it. */
static int kick_signal(const struct pki_batch *b, struct pki_kick *k)
{
	pid_t pid = getpid();
	size_t i;
	int err;

	kick_look(b, k);
	for (i = 0; i < k->n; i++) {
		if (atomic_load(&k->acked[i]))
			continue;
		if (kick_seen_outside(b, k->tid[i])) { /* the last look, just before */
			pki_kick_ack(k, i);
			continue;
		}
		/*
		 * A thread that blocks the kick gets it when it unblocks it (a
		 * handler that returns); meanwhile kick_wait() looks at it again
		 * until it is seen asleep in the kernel outside the sleds.
		 */
		if (!syscall(SYS_tgkill, pid, k->tid[i], PKI_SIG_KICK))
			continue;
		if (errno != ESRCH) {
			err = -errno;
			pki_warn("text poke: cannot signal thread %d: %s\n", k->tid[i],
				 pki_errstr(err));
			return err;
		}
		pki_kick_ack(k, i);
	}
	return 0;
}

/*
 * Silent for a while: acknowledge for the threads that are gone or now seen
 * asleep outside the sleds (one that blocks the kick, or whose handler for
 * another signal blocks it).
 */
static void kick_recheck(const struct pki_batch *b, struct pki_kick *k)
{
	size_t i;

	for (i = 0; i < k->n; i++)
		if (!atomic_load(&k->acked[i]) &&
		    (!pki_thread_alive(k->tid[i]) || kick_seen_outside(b, k->tid[i])))
			pki_kick_ack(k, i);
}

/*
 * Wait for every acknowledgement, at most KICK_TIMEOUT_NS.  Sleeps rather
 * than spins: on a busy machine the threads to kick are often runnable but
 * not running, and need this CPU.
 */
static int kick_wait(const struct pki_batch *b, struct pki_kick *k)
{
	struct timespec start, now;
	int left;

	clock_gettime(CLOCK_MONOTONIC, &start);
	while ((left = atomic_load(&k->left)) > 0) {
		struct timespec tick = {.tv_nsec = 1000000};

		if (!pki_futex_wait(&k->left, left, &tick) || errno != ETIMEDOUT)
			continue;
		kick_recheck(b, k);
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - start.tv_sec) * 1000000000l + now.tv_nsec - start.tv_nsec >
		    KICK_TIMEOUT_NS) {
			kick_report(k);
			return -ETIMEDOUT;
		}
	}
	return 0;
}

/*
 * Why the kick makes sled conversion safe.
 *
 * A site holding five one-byte nops (90 x5) has instruction boundaries at
 * bytes 1..4, and a thread can be stopped at any of them (preempted, or
 * interrupted by a signal).  If the tail were rewritten under it, it would
 * resume in the middle of the new call's rel32.  The kick runs after step 1:
 *
 *  (a) byte 0 of every site is INT3 and every core has synced, so from now on
 *      a thread reaching the site's start traps and is emulated past the whole
 *      site: no thread can newly enter bytes 1..4 (nothing jumps there; the
 *      only way in is falling through from byte 0).
 *  (b) every other thread that existed when we listed /proc/self/task gets
 *      PKI_SIG_KICK; its handler sees the IP the thread will resume at, and if
 *      that is strictly inside a sled of this batch, moves it to the end of
 *      the site: what was left were nops, so this is equivalent.  Then it
 *      acknowledges.  A thread created after the listing starts outside any
 *      sled and, by (a), cannot get in.  A thread that exits is not waited for.
 *  (c) our SIGTRAP handler blocks the kick signal, so a kick never inspects
 *      the IP of a thread sitting in that handler (or in the application's
 *      SIGTRAP handler we chain to) instead of the IP it will resume at.
 *
 * After all acknowledgements no thread is at bytes 1..4 of a converted sled,
 * none can get there, and step 2 may write the tails.
 *
 * Limit: a thread stopped inside a sled that is then interrupted by ANOTHER
 * signal whose handler does not block PKI_SIG_KICK and is still running
 * during the kick would acknowledge from that handler; it resumes inside the
 * sled afterwards.  The window is a handler that lands exactly on a sled's
 * inner bytes and outlives a whole batch.
 *
 * Converting back (call or nop5 -> sled) needs no kick: the old instruction
 * is one instruction, so no thread is ever stopped inside it; a thread inside
 * the callee returns to site + 5, which is a boundary in both.  Once step 3
 * restores the sled, threads may be stopped inside it again, which is fine
 * for a sled; the next conversion kicks them out again.
 */
int pki_kick_run(struct pki_batch *b, struct pki_kick *k)
{
	int err;

	atomic_fetch_add(&pki_stat_kicks, 1);
	err = kick_list(k);
	if (err)
		return err;
	atomic_store_explicit(&b->kick, k, memory_order_release);
	err = kick_signal(b, k);
	if (!err)
		err = pki_poke_stage(PKI_POKE_AFTER_KICK_SENT);
	if (!err)
		err = kick_wait(b, k);
	return err;
}

void pki_kick_free(struct pki_kick *k)
{
	free((void *)k->tid);
	free((void *)k->acked);
	memset(k, 0, sizeof(*k));
}
