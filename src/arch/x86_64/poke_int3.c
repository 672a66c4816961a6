// SPDX-License-Identifier: MIT
/*
 * The INT3 protocol (TP4 of doc/design/text-patching.md): the kernel's
 * text_poke_bp_batch() carried to user space, for the sites neither the
 * sled relay nor the single store takes.  This file only orders the
 * stores, through ops->put, undoes them when a step fails, and guards
 * against threads that block SIGTRAP.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "arch/x86_64/poke_int.h"
#include "base/log.h"
#include "base/threads.h"

/* What run_protocol() had begun writing when it stopped. */
enum step { STEP_NONE, STEP_INT3, STEP_TAILS, STEP_FIRST };

static int put_int3(const struct pki_batch *b, const struct pki_text_ops *ops)
{
	static const uint8_t int3 = PKI_INSN_INT3;
	size_t i;
	int err;

	for (i = 0; i < b->n; i++) {
		err = ops->put(b->site[i].addr, &int3, 1);
		if (err)
			return err;
	}
	return 0;
}

/*
 * Undo a batch that failed after @done was written (text still writable,
 * batch still published).  Threads trapping meanwhile get the old
 * instruction.  Failures here are ignored: the syncs only hasten what the
 * handler already guarantees.
 */
static void rollback(struct pki_batch *b, enum step done, const struct pki_text_ops *ops)
{
	size_t i;

	atomic_store_explicit(&b->rollback, true, memory_order_release);
	if (done >= STEP_TAILS) {
		for (i = 0; i < b->n; i++)
			ops->put(b->site[i].addr + 1, b->site[i].old + 1, PKI_SITE_LEN - 1);
		ops->sync();
	}
	for (i = 0; i < b->n; i++)
		ops->put(b->site[i].addr, b->site[i].old, 1);
	ops->sync();
}

/*
 * The INT3 protocol (TP4), for the whole batch at once (text writable, batch
 * published, every site verified to hold its old bytes):
 *
 *  1. Write INT3 on the first byte of every site; sync all cores.  A thread
 *     reaching a site now traps and is emulated as if it ran the new
 *     instruction.  If any old instruction is a sled, kick every thread out
 *     of the sleds (see pki_kick_run()).
 *  2. Write the tails (bytes 1..4) of every site; sync.  Nobody executes
 *     them: they sit behind an INT3 and no thread is inside a site.
 *  3. Write the first byte of every site; sync.  Each site now holds its
 *     new instruction whole; after the sync no core can still see an INT3
 *     or an old tail.
 *
 * "Sync" is membarrier(PRIVATE_EXPEDITED_SYNC_CORE): every core running one
 * of our threads executes a core-serialising instruction before it returns.
 * Three syncs per batch whatever its size.  If a step after 3's writes
 * fails, the batch is undone by running the same protocol backwards.
 */
static int run_protocol(struct pki_batch *b, bool need_kick, struct pki_kick *k, enum step *done,
			const struct pki_text_ops *ops)
{
	size_t i;
	int err;

	*done = STEP_INT3;
	err = put_int3(b, ops);
	if (!err)
		err = ops->sync();
	if (!err)
		err = pki_poke_stage(PKI_POKE_AFTER_INT3);
	if (!err && need_kick)
		err = pki_kick_run(b, k);
	if (err)
		return err;

	*done = STEP_TAILS;
	for (i = 0; i < b->n && !err; i++)
		err = ops->put(b->site[i].addr + 1, b->site[i].new + 1, PKI_SITE_LEN - 1);
	if (!err)
		err = ops->sync();
	if (!err)
		err = pki_poke_stage(PKI_POKE_AFTER_TAILS);
	if (err)
		return err;

	*done = STEP_FIRST;
	for (i = 0; i < b->n && !err; i++)
		err = ops->put(b->site[i].addr, b->site[i].new, 1);
	if (!err)
		err = ops->sync();
	if (!err)
		err = pki_poke_stage(PKI_POKE_AFTER_FIRST);
	return err;
}

/*
 * One run of the protocol over @b, published for its duration.  A failure
 * before step 3 wrote everything is rolled back here; *@done tells the
 * caller whether it must run the reverse batch instead.
 */
static int bp_pass(struct pki_batch *b, bool need_kick, enum step *done,
		   const struct pki_text_ops *ops)
{
	struct pki_kick k = {0};
	int err;

	pki_trap_publish(b);
	err = run_protocol(b, need_kick, &k, done, ops);
	if (err && *done < STEP_FIRST)
		rollback(b, *done, ops);
	pki_trap_retire();
	pki_kick_free(&k);
	return err;
}

/* Every site of @b fully written but not synced: run the batch backwards. */
static void bp_reverse(const struct pki_batch *b, const struct pki_text_ops *ops)
{
	struct pki_poke *rev = malloc(b->n * sizeof(*rev));
	struct pki_batch rb = {.site = rev, .n = b->n};
	bool need_kick = false;
	enum step done;
	size_t i;
	int err2;

	if (!rev) {
		pki_warn("text poke: cannot undo a failed batch, sites keep new bytes: %s\n",
			 pki_errstr(ENOMEM));
		return;
	}
	for (i = 0; i < b->n; i++) {
		rev[i].addr = b->site[i].addr;
		memcpy(rev[i].old, b->site[i].new, PKI_SITE_LEN);
		memcpy(rev[i].new, b->site[i].old, PKI_SITE_LEN);
		rev[i].reloc = b->site[i].reloc;
		need_kick |= pki_poke_has_interior(&rev[i]);
	}
	err2 = bp_pass(&rb, need_kick, &done, ops);
	if (err2)
		ops->bug(err2, NULL);
	free(rev);
}

int pki_arch_bp_apply(const struct pki_poke *site, size_t n, const struct pki_text_ops *ops)
{
	struct pki_batch b = {.site = site, .n = n};
	bool need_kick = false;
	enum step done;
	size_t i;
	int err;

	for (i = 0; i < n; i++)
		need_kick |= pki_poke_has_interior(&site[i]) &&
			     memcmp(site[i].old, site[i].new, PKI_SITE_LEN);
	err = bp_pass(&b, need_kick, &done, ops);
	if (err && done == STEP_FIRST)
		bp_reverse(&b, ops);
	return err;
}

/* --- the SIGTRAP guard ----------------------------------------------------- */

struct int3_guard {
	size_t n;    /* sites that need an INT3 */
	bool report; /* last look: say who */
};

static int int3_guard_one(pid_t tid, void *arg)
{
	struct int3_guard *g = arg;
	char name[32] = "?";
	uint64_t blk;

	if (pki_thread_sigblk(tid, &blk, name, sizeof(name)) || !(blk & (1ull << (SIGTRAP - 1))))
		return 0;
	if (!g->report)
		return -EDEADLK;
	pki_warn("text poke: thread %d (%s) blocks SIGTRAP, and %zu site(s) of this batch "
		 "need an INT3 (INT3 sites, sites crossing a cache line, sleds without relay "
		 "memory): a trap would kill the process; batch refused, nothing changed: %s\n",
		 tid, name, g->n, pki_errstr(EDEADLK));
	return -EDEADLK;
}

static long mono_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000l + t.tv_nsec;
}

/*
 * The kernel kills a process whose thread meets an INT3 with SIGTRAP
 * blocked, so no INT3 is written while any thread blocks it.  Threads block
 * every signal for a moment in places (glibc's thread start, a signal
 * handler's entry): look again, a millisecond apart, until TRAP_GUARD_NS
 * after the first look, and then refuse (a look at a thousand threads may
 * itself take long on a loaded machine: the time counts, not the looks).
 * A thread that blocks it during the batch (a few milliseconds) is not
 * seen: the remaining exposure, only for the sites this protocol still
 * serves (arch/poke.h).
 */
#define TRAP_GUARD_NS 20000000l

int pki_arch_trap_guard(size_t n)
{
	struct int3_guard g = {.n = n};
	long end = mono_ns() + TRAP_GUARD_NS;
	int err;

	for (;;) {
		err = pki_threads_each((pid_t)syscall(SYS_gettid), int3_guard_one, &g);
		if (err != -EDEADLK || g.report)
			return err == -EDEADLK ? err : 0;
		if (mono_ns() >= end)
			g.report = true; /* the last look, which names the thread */
		else
			usleep(1000);
	}
}

int pki_arch_bp_prepare(const struct pki_poke *site, size_t n)
{
	int err = pki_arch_trap_guard(n);

	return err ? err : pki_trap_sites_add(site, n);
}
