// SPDX-License-Identifier: MIT
/*
 * Live text patching: pki_text_poke_batch() changes any number of sites as
 * one transaction while other threads may be executing them.  The protocol
 * is the kernel's text_poke_bp_batch() carried to user space: INT3 stand-ins
 * emulated by our SIGTRAP handler (trap.c), membarrier(SYNC_CORE) in place
 * of the kernel's sync IPIs, and mprotect() grouped by mapping because each
 * call costs a TLB shootdown when other threads run.  Where a writable alias
 * of the text exists (alias.c), text is written through it instead, and a
 * batch whose sites can each be replaced by one locked store skips the INT3
 * protocol altogether (the single-store protocol below), and gcc's sleds are
 * attached by changing their first byte only (the sled relay protocol
 * below): neither writes an INT3 or signals a thread, so neither depends on
 * how the program's threads mask or handle signals.
 */
#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "arch/arch.h"
#include "base/futex.h"
#include "base/grow.h"
#include "base/log.h"
#include "base/threads.h"
#include "patch/alias.h"
#include "patch/internal.h"
#include "patch/relay.h"
#include "patch/text.h"

int (*pki_text_poke_hook)(enum pki_poke_stage stage);
unsigned int pki_text_poke_disable;

/*
 * poke_lock serialises batches: one published batch at a time, one owner of
 * the text protection changes.  Everything static below is only touched with
 * it held, except `dead` (read locklessly as a fast refusal).
 */
static pthread_mutex_t poke_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool dead;
static atomic_bool ready; /* read without the lock by pki_text_sync() */
/* The CPU has the single-store protocol's store (cmpxchg16b). */
static bool have_cas16;
/* Time allowed for every thread to acknowledge a sled kick. */
#define KICK_TIMEOUT_NS 2000000000l

static atomic_ulong pki_stat_relayed;

bool pki_text_poke_dead(void)
{
	return atomic_load(&dead);
}

void pki_text_poke_stats(struct pki_poke_stats *st)
{
	st->batches = atomic_load(&pki_stat_batches);
	st->emulated = atomic_load(&pki_stat_emulated);
	st->restarted = atomic_load(&pki_stat_restarted);
	st->sled_moves = atomic_load(&pki_stat_sled_moves);
	st->fast = atomic_load(&pki_stat_fast);
	st->aliases = pki_alias_count();
	st->kicks = atomic_load(&pki_stat_kicks);
	st->relayed = atomic_load(&pki_stat_relayed);
}

static int hook(enum pki_poke_stage stage)
{
	return pki_text_poke_hook ? pki_text_poke_hook(stage) : 0;
}

static int sync_cores(void)
{
	if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0))
		return -errno;
	return 0;
}

/*
 * fork(): the patch lock is held across it, so no batch is half done in the
 * child and no alias changes under the parent's copy (alias.c explains why
 * the child then moves its aliased text onto fresh memfds).
 */
static int fork_prepared; /* poke_lock */

static void fork_prepare(void)
{
	pthread_mutex_lock(&poke_lock);
	fork_prepared = pki_alias_fork_prepare();
}

static void fork_parent(void)
{
	int err = pki_alias_fork_parent();

	if (fork_prepared || err) {
		/* Still sharing text with the child: a patch would reach it. */
		atomic_store(&dead, true);
		pki_warn("text poke: text still shared with a forked child; live patching is "
			 "now off for this process: %s\n",
			 pki_errstr(EBUSY));
	}
	pthread_mutex_unlock(&poke_lock);
}

/*
 * The child is a new process: the /proc/self files we keep open still name
 * the parent (a write through /proc/self/mem would patch the PARENT's text), and its
 * new mm has no membarrier registration.  The next batch redoes them.
 */
static void fork_child(void)
{
	if (fork_prepared || pki_alias_fork_child()) {
		atomic_store(&dead, true);
		pki_warn("text poke: this fork child could not get its own copy of the "
			 "patched text; live patching is off in it: %s\n",
			 pki_errstr(EBUSY));
	}
	atomic_store(&ready, false);
	pthread_mutex_unlock(&poke_lock);
}

static bool prepared_once; /* poke_lock */

static int __poke_prepare(void)
{
	static bool once;
	int err;

	if (atomic_load(&ready)) {
		pki_text_files_check();
		return 0;
	}
	if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0)) {
		err = -errno;
		pki_warn("text poke: membarrier sync-core registration failed: %s\n",
			 pki_errstr(err));
		return err;
	}
	if (!once) {
		err = pki_trap_install();
		if (err) {
			pki_warn("text poke: cannot install SIGTRAP handler: %s\n",
				 pki_errstr(err));
			return err;
		}
		err = pthread_atfork(fork_prepare, fork_parent, fork_child);
		if (err) {
			pki_warn("text poke: cannot register fork handlers: %s\n", pki_errstr(err));
			return -err;
		}
		/*
		 * PROBEKIT_TEXT_ALIAS=0: the user keeps patched text on its file
		 * mapping (profilers, uprobes and debuggers see the file), at the
		 * price of the slower write paths.
		 */
		const char *alias = getenv("PROBEKIT_TEXT_ALIAS");

		if (alias && !strcmp(alias, "0"))
			pki_text_poke_disable |= PKI_POKE_NO_ALIAS;
		once = true;
	}
	have_cas16 = pki_arch_have_cas16();
	pki_text_files_open();
	prepared_once = true;
	atomic_store(&ready, true);
	return 0;
}

static int cmp_poke(const void *a, const void *b)
{
	unsigned long x = ((const struct pki_poke *)a)->addr,
		      y = ((const struct pki_poke *)b)->addr;

	return x < y ? -1 : x > y;
}

static int cmp_tid(const void *a, const void *b)
{
	pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;

	return x < y ? -1 : x > y;
}

/* --- validation and verification ----------------------------------------- */

static int check_sites(const struct pki_poke *site, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		if (!pki_insn_emulatable(site[i].old) || !pki_insn_emulatable(site[i].new)) {
			pki_debug("text poke %#lx: instruction the patcher cannot emulate\n",
				  site[i].addr);
			return -EINVAL;
		}
		if (i && site[i - 1].addr + PKI_SITE_LEN > site[i].addr) {
			pki_debug("text poke %#lx: overlaps site %#lx\n", site[i].addr,
				  site[i - 1].addr);
			return -EINVAL;
		}
	}
	return 0;
}

static void hexbytes(char *out, const uint8_t *b)
{
	static const char hex[] = "0123456789abcdef";
	int i;

	for (i = 0; i < PKI_SITE_LEN; i++) {
		*out++ = hex[b[i] >> 4];
		*out++ = hex[b[i] & 15];
		*out++ = i < PKI_SITE_LEN - 1 ? ' ' : '\0';
	}
}

/* What a batch found other than it was told: see poke_bug(). */
struct poke_bug {
	unsigned long addr;	    /* the site */
	const char *what;	    /* the bytes, when not the site's own: "sled relay slot" */
	const char *when;	    /* when not before writing: "while storing" */
	const uint8_t *want, *have; /* PKI_SITE_LEN bytes each */
};

/*
 * The one report of a fault that leaves patching off for the process, in
 * the manner of the kernel's ftrace_bug(): with @bug (@err is -EILSEQ),
 * bytes in the text are not those the batch was told, so someone else
 * writes there and no later batch can be trusted; without, a failed batch
 * could not be undone (@err is why) and its sites may keep new bytes.
 * Every later batch fails with -ECANCELED.
 */
static void poke_bug(int err, const struct poke_bug *bug)
{
	char want[3 * PKI_SITE_LEN], have[3 * PKI_SITE_LEN];

	atomic_store(&dead, true);
	if (!bug) {
		pki_warn("text poke: cannot undo a failed batch, live patching is now off: %s\n",
			 pki_errstr(err));
		return;
	}
	hexbytes(want, bug->want);
	hexbytes(have, bug->have);
	pki_warn("text poke %#lx: %s%sexpected %s, found %s%s%s; live patching is now off for "
		 "this process: %s\n",
		 bug->addr, bug->what ? bug->what : "", bug->what ? ": " : "", want, have,
		 bug->when ? " " : "", bug->when ? bug->when : "", pki_errstr(err));
}

/* Every site must hold exactly its old bytes, or nothing is written. */
static int verify_sites(const struct pki_poke *site, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		struct poke_bug bug;
		uint8_t cur[PKI_SITE_LEN];

		memcpy(cur, (const void *)site[i].addr, PKI_SITE_LEN);
		if (!memcmp(cur, site[i].old, PKI_SITE_LEN))
			continue;
		bug = (struct poke_bug){.addr = site[i].addr, .want = site[i].old, .have = cur};
		poke_bug(-EILSEQ, &bug);
		return -EILSEQ;
	}
	return 0;
}

/* --- the sled kick --------------------------------------------------------- */

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

/* Ask every listed thread that may be inside a sled to step out of it. */
static int kick_signal(const struct pki_batch *b, struct pki_kick *k)
{
	pid_t pid = getpid();
	size_t i;
	int err;

	for (i = 0; i < k->n; i++) {
		/*
		 * A thread blocked in the kernel (after step 1) at a pc outside
		 * every sled of the batch can only come back in through a first
		 * byte, now an INT3: no signal needed (and none reaches the
		 * threads that block every signal, e.g. liburcu's workers).
		 */
		if (kick_seen_outside(b, k->tid[i])) {
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

/* The sled kick for @b, whose first bytes are INT3s on every core. */
static int kick_threads(struct pki_batch *b, struct pki_kick *k)
{
	int err;

	atomic_fetch_add(&pki_stat_kicks, 1);
	err = kick_list(k);
	if (err)
		return err;
	atomic_store_explicit(&b->kick, k, memory_order_release);
	err = kick_signal(b, k);
	if (!err)
		err = hook(PKI_POKE_AFTER_KICK_SENT);
	if (!err)
		err = kick_wait(b, k);
	return err;
}

/* --- the protocol ---------------------------------------------------------- */

enum step { STEP_NONE, STEP_INT3, STEP_TAILS, STEP_FIRST };

static int put_int3(const struct pki_batch *b)
{
	static const uint8_t int3 = PKI_INSN_INT3;
	size_t i;
	int err;

	for (i = 0; i < b->n; i++) {
		err = pki_text_put(b->site[i].addr, &int3, 1);
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
static void rollback(struct pki_batch *b, enum step done)
{
	size_t i;

	atomic_store_explicit(&b->rollback, true, memory_order_release);
	if (done >= STEP_TAILS) {
		for (i = 0; i < b->n; i++)
			pki_text_put(b->site[i].addr + 1, b->site[i].old + 1, PKI_SITE_LEN - 1);
		sync_cores();
	}
	for (i = 0; i < b->n; i++)
		pki_text_put(b->site[i].addr, b->site[i].old, 1);
	sync_cores();
}

/*
 * The INT3 protocol, for the whole batch at once (text writable, batch
 * published, every site verified to hold its old bytes):
 *
 *  1. Write INT3 on the first byte of every site; sync all cores.  A thread
 *     reaching a site now traps and is emulated as if it ran the new
 *     instruction.  If any old instruction is a sled, kick every thread out
 *     of the sleds (see kick_threads()).
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
static int run_protocol(struct pki_batch *b, bool need_kick, struct pki_kick *k, enum step *done)
{
	size_t i;
	int err;

	*done = STEP_INT3;
	err = put_int3(b);
	if (!err)
		err = sync_cores();
	if (!err)
		err = hook(PKI_POKE_AFTER_INT3);
	if (!err && need_kick)
		err = kick_threads(b, k);
	if (err)
		return err;

	*done = STEP_TAILS;
	for (i = 0; i < b->n && !err; i++)
		err = pki_text_put(b->site[i].addr + 1, b->site[i].new + 1, PKI_SITE_LEN - 1);
	if (!err)
		err = sync_cores();
	if (!err)
		err = hook(PKI_POKE_AFTER_TAILS);
	if (err)
		return err;

	*done = STEP_FIRST;
	for (i = 0; i < b->n && !err; i++)
		err = pki_text_put(b->site[i].addr, b->site[i].new, 1);
	if (!err)
		err = sync_cores();
	if (!err)
		err = hook(PKI_POKE_AFTER_FIRST);
	return err;
}

static void kick_free(struct pki_kick *k)
{
	free((void *)k->tid);
	free((void *)k->acked);
	memset(k, 0, sizeof(*k));
}

/* Patch, or on failure restore, @b's sites.  Text writable; poke_lock held. */
static int __poke_apply(struct pki_batch *b)
{
	struct pki_kick k = {0};
	bool need_kick = false;
	enum step done;
	size_t i;
	int err;

	for (i = 0; i < b->n; i++)
		need_kick |= pki_insn_has_interior(b->site[i].old) &&
			     memcmp(b->site[i].old, b->site[i].new, PKI_SITE_LEN);

	pki_trap_publish(b);
	err = run_protocol(b, need_kick, &k, &done);
	if (err && done < STEP_FIRST)
		rollback(b, done);
	pki_trap_retire();
	kick_free(&k);
	if (!err || done < STEP_FIRST)
		return err;

	/* Fully written but not synced: run the reverse batch. */
	struct pki_poke *rev = malloc(b->n * sizeof(*rev));
	struct pki_batch rb = {.site = rev, .n = b->n};
	int err2;

	if (!rev) {
		pki_warn("text poke: cannot undo a failed batch, sites keep new bytes: %s\n",
			 pki_errstr(ENOMEM));
		return err;
	}
	for (i = 0; i < b->n; i++) {
		rev[i].addr = b->site[i].addr;
		memcpy(rev[i].old, b->site[i].new, PKI_SITE_LEN);
		memcpy(rev[i].new, b->site[i].old, PKI_SITE_LEN);
	}
	need_kick = false;
	for (i = 0; i < b->n; i++)
		need_kick |= pki_insn_has_interior(rev[i].old);
	pki_trap_publish(&rb);
	err2 = run_protocol(&rb, need_kick, &k, &done);
	if (err2 && done < STEP_FIRST)
		rollback(&rb, done);
	pki_trap_retire();
	kick_free(&k);
	if (err2)
		poke_bug(err2, NULL);
	free(rev);
	return err;
}

/* --- the single-store protocol -------------------------------------------- */

/*
 * Why one store is enough for a site that pki_insn_single_store_ok() accepts
 * (five bytes inside one store window: an aligned 16-byte block, or eight
 * bytes of one cache line; old instruction not a sled) and that has a live
 * alias:
 *
 *  (a) The store.  The window holding the site is replaced by ONE locked
 *      cmpxchg16b (aligned block) or lock cmpxchg (a quadword inside one
 *      line) through the alias, expecting the window as verified (the bytes
 *      around the site included).  A locked operation that does not split a
 *      cache line is single-copy atomic on x86-64 (SDM vol. 3, "Guaranteed
 *      Atomic Operations", "Locked Atomic Operations"; AMD APM vol. 2,
 *      "Locked Instructions"): every observer reads the whole old or the
 *      whole new window, and the window lies in one cache line, which the
 *      store modifies in one coherence transaction.  (Sites
 *      inside one aligned quadword would do with cmpxchg8; the 16-byte block
 *      also covers sites at entry + 4..11 of a 16-byte-aligned function,
 *      e.g. after endbr64.)  The alias and the executable view are two virtual
 *      addresses of the same physical bytes, and caches, coherence and the
 *      cores' detection of modified code work on physical addresses, so a
 *      core fetching the site afterwards fetches the same block.  The
 *      cmpxchg also re-checks, atomically with the write, that nobody
 *      changed the block since verify_sites(): if somebody did, the batch
 *      is a verification failure (latched off, reported, undone).
 *  (b) Fetching threads.  A thread reaching the site executes it from bytes
 *      fetched either before or after the store: the whole old instruction or
 *      the whole new one.  This rests on instruction fetch seeing the
 *      block as atomically as data loads do, which the SDM does not spell
 *      out for cross-modifying code; it is the same premise as the INT3
 *      protocol's own first step (a one-byte INT3 store seen whole), it is
 *      what Java HotSpot's call patching (NativeCall::set_destination_mt_safe,
 *      an aligned displacement store) and MSVC hot-patching rely on, and the
 *      stress tests hammer it.  Where the premise is not wanted, set
 *      PKI_POKE_NO_FAST: every batch then takes the INT3 protocol.
 *  (c) Threads inside the site.  The old instruction is a single
 *      instruction (nop5, call or jmp rel32), so no thread is stopped at
 *      bytes 1..4; one inside a callee returns to site + 5, an instruction
 *      boundary of old and new alike.  A sled is refused in (a) for exactly
 *      this reason: it keeps the INT3 protocol and the sled kick.
 *  (d) Traps.  No INT3 is written, so the SIGTRAP handler has nothing to
 *      emulate; a thread still on its way to handling an INT3 of an earlier
 *      batch at this site finds the address in `seen` and re-executes the
 *      site, which holds a whole instruction at every moment.
 *  (e) After the stores, membarrier sync-core: every core running one of our
 *      threads (ours included) serialises, so when the batch returns no
 *      thread can execute an instruction it replaced, the same post-condition
 *      as the INT3 protocol.  The sync is not needed for (a)-(c); it only
 *      bounds how long a core may go on running old bytes it already
 *      fetched.  PKI_POKE_LAZY skips it and leaves that to pki_text_sync()
 *      (measured: ~0.5 us idle, 2-20 us when the other CPUs are busy).
 *  (f) What the new instruction reaches.  The locked cmpxchg16b is a full
 *      barrier and x86 stores become visible in program order, so whatever
 *      the caller wrote before the batch (a trampoline and its data) is
 *      visible before the new bytes are; a thread that runs the new call
 *      finds it.

 *
 * Several sites in one batch are stored one after the other: like the INT3
 * protocol, a batch is not atomic as a whole, only each site is.  A failure
 * after some stores puts their old blocks back the same way.
 */
/*
 * Replace the @len bytes at @addr, now @from, by @to with one locked store
 * through the alias of the window around them (pki_arch_store_window()).
 * -EINVAL (no window or no alias for it), -EILSEQ (the bytes are not @from:
 * someone else changed them), -EIO (the store did not show in the text).
 */
static int store_bytes(unsigned long addr, const uint8_t *from, const uint8_t *to, unsigned int len)
{
	unsigned long start;
	unsigned int win = pki_arch_store_window(addr, len, &start), off;
	uint64_t cur[2], want[2], now[2];
	uint8_t *w;
	bool ok;

	if (!win || (win == PKI_STORE_BLOCK && !have_cas16))
		return -EINVAL;
	w = pki_text_alias(start, win);
	if (!w)
		return -EINVAL;
	off = (unsigned int)(addr - start);
	/*
	 * Through the executable view: what threads execute now.  The loads
	 * need not be one snapshot, but only we write text: a torn read can
	 * only make the exchange below fail.
	 */
	memcpy(cur, (const void *)start, win);
	if (memcmp((uint8_t *)cur + off, from, len))
		return -EILSEQ;
	memcpy(want, cur, sizeof(want));
	memcpy((uint8_t *)want + off, to, len);
	ok = win == PKI_STORE_BLOCK ? pki_arch_cas16(w, cur, want)
				    : pki_arch_cas8(w, cur[0], want[0]);
	if (!ok)
		return -EILSEQ;
	/* Same physical bytes: our own loads through the other view must agree. */
	memcpy(now, (const void *)start, win);
	if (memcmp(now, want, win)) {
		if (win == PKI_STORE_BLOCK)
			pki_arch_cas16(w, want, cur);
		else
			pki_arch_cas8(w, want[0], cur[0]);
		return -EIO;
	}
	return 0;
}

static int store_site(const struct pki_poke *p, const uint8_t *from, const uint8_t *to)
{
	return store_bytes(p->addr, from, to, PKI_SITE_LEN);
}

static bool single_store_ok(const struct pki_poke *site, size_t n)
{
	unsigned long start;
	size_t i;

	if (pki_text_poke_disable & PKI_POKE_NO_FAST)
		return false;
	for (i = 0; i < n; i++) {
		unsigned int win = pki_arch_store_window(site[i].addr, PKI_SITE_LEN, &start);

		if (!pki_insn_single_store_ok(site[i].addr, site[i].old) ||
		    (win == PKI_STORE_BLOCK && !have_cas16) || !pki_text_alias(start, win))
			return false;
	}
	return true;
}

/* Sites verified, aliases live, poke_lock held. */
static int __poke_single_store(const struct pki_poke *site, size_t n, unsigned int flags)
{
	size_t i, done;
	int err = 0;

	for (done = 0; done < n && !err; done++)
		err = store_site(&site[done], site[done].old, site[done].new);
	if (err) {
		done--;
		if (err == -EILSEQ) {
			struct poke_bug bug = {.addr = site[done].addr,
					       .when = "while storing",
					       .want = site[done].old,
					       .have = (const uint8_t *)site[done].addr};

			poke_bug(err, &bug);
		} else {
			pki_warn("text poke %#lx: store through the alias not seen in the text: "
				 "%s\n",
				 site[done].addr, pki_errstr(err));
		}
	} else {
		err = hook(PKI_POKE_AFTER_STORE);
	}
	if (err) {
		for (i = done; i-- > 0;)
			store_site(&site[i], site[i].new, site[i].old);
		sync_cores();
		return err;
	}
	if (!(flags & PKI_POKE_LAZY))
		err = sync_cores();
	/* A failed sync leaves the stores in place: they are complete and correct. */
	atomic_fetch_add(&pki_stat_fast, 1);
	return err;
}

/* --- the sled relay protocol ---------------------------------------------- */

/*
 * Why a sled site needs neither an INT3 nor the sled kick here (the idea is
 * in arch/x86_64/insn.h, the memory in relay.c).  The site holds the sled
 * (off) or the relay call e8 90 90 90 90 (on); its slot holds, when on, a
 * jmp to the site's target, and when off a ret (or, before the first attach,
 * INT3s nobody reaches).  Every change is one store of a byte or of a single
 * instruction:
 *
 *  (a) byte 0 of the site, 90 <-> e8: a one-byte store, seen whole.  Bytes
 *      1..4 never change, so a thread stopped at any of them (preempted, or
 *      in a signal handler of any length, on any stack) resumes into nops
 *      that end at site + 5, on or off.  A thread at byte 0 executes the old
 *      or the new first byte; both are whole instructions with the same
 *      bytes 1..4.
 *  (b) the slot, ret <-> jmp T, or jmp T1 -> jmp T2: one locked store of a
 *      window inside one cache line (single-store protocol, (a)-(b)); a
 *      thread at the slot came through the site's call, so [rsp] = site + 5
 *      and both ret and any jmp to a trampoline are correct for it.
 *  (c) Order.  Attach: slot first, then a core sync, then byte 0, so a thread
 *      that executes the new call finds the new jump.  Detach: byte 0
 *      first, then the slot becomes a ret, so a thread that executed the
 *      call just before and sits at the slot when the batch returns leaves
 *      through the ret, never through a jump to a trampoline that a grace
 *      period may then free.  Retarget: the slot only.  The final core sync
 *      (unless PKI_POKE_LAZY) gives the same post-condition as the other
 *      protocols: no thread can execute a replaced instruction afterwards.
 *      Grace periods need nothing new: a thread in a slot is outside every
 *      trampoline and executes the slot as it is when it gets there, as it
 *      would the site itself.
 *  (d) The slot's place is fixed by the site; if it cannot be mapped, or the
 *      target is out of the slot's rel32 reach, a sled that was never
 *      attached takes the older protocols (INT3 and the kick).  A site once
 *      attached by relay stays on its relay for good (threads may still sit
 *      inside its sled): a later target the slot cannot reach is refused
 *      with -ERANGE.
 */
struct relayed {
	struct pki_poke p; /* what the caller asked, in its (logical) bytes */
	unsigned long slot;
	bool was_on, on;
	uint8_t b1_old, b1_new; /* byte 1: PKI_RELAY_B1 or _ALT (insn.h) */
	uint8_t slot_old[PKI_RELAY_SLOT_LEN], slot_new[PKI_RELAY_SLOT_LEN];
	bool slot_done, byte_done, b1_done;
};

/* A writable view of relay slot @slot: its chunk's alias, made on first use. */
static bool relay_writable(unsigned long slot)
{
	unsigned long start;
	unsigned int win = pki_arch_store_window(slot, PKI_RELAY_SLOT_LEN, &start);

	if (!win || (win == PKI_STORE_BLOCK && !have_cas16))
		return false;
	return pki_text_alias_make(start, win, "[sled relay]");
}

/*
 * Does @p take the relay?  1 (and *@r filled, verified), 0 (no: another
 * protocol), or -errno: -EILSEQ (the text or the slot is not what @p says:
 * patching latched off, reported), -ERANGE/-EINVAL (a site already on its
 * relay cannot reach @p's new target or become a jmp).
 */
/* Can the slot of @site with byte 1 = @b1 be mapped and stored atomically? */
static bool relay_usable(unsigned long site, uint8_t b1)
{
	unsigned long slot = pki_insn_relay_slot(site, b1);

	return !pki_relay_claim(site, slot, false) && !pki_relay_map(site, b1) &&
	       relay_writable(slot) && !pki_relay_claim(site, slot, true);
}

static int relay_choose(const struct pki_poke *p, struct relayed *r)
{
	enum pki_insn_kind ko = pki_insn_classify(p->old), kn = pki_insn_classify(p->new);
	uint8_t text[PKI_SITE_LEN], b1;
	bool on, fresh;

	memcpy(text, (const void *)p->addr, PKI_SITE_LEN);
	if (!pki_insn_relay_form(text, &on, &b1))
		return 0;
	fresh = !on;
	*r = (struct relayed){.p = *p, .was_on = on, .on = kn == PKI_INSN_CALL, .b1_old = b1};
	/* (d): a sled not on its relay yet may still take the older protocols. */
	if (fresh && ((pki_text_poke_disable & (PKI_POKE_NO_FAST | PKI_POKE_NO_RELAY)) ||
		      ko == PKI_INSN_CALL || ko == PKI_INSN_JMP))
		return 0;
	if ((ko == PKI_INSN_CALL) != on) {
		struct poke_bug bug = {
		    .addr = p->addr, .what = "site", .want = p->old, .have = text};

		poke_bug(-EILSEQ, &bug);
		return -EILSEQ;
	}
	if (kn == PKI_INSN_JMP) {
		if (fresh)
			return 0;
		pki_warn("text poke %#lx: a site on its sled relay cannot become a jmp: %s\n",
			 p->addr, pki_errstr(EINVAL));
		return -EINVAL;
	}
	if (!pki_text_byte_ok(p->addr)) {
		if (fresh)
			return 0;
		pki_warn("text poke %#lx: its sled cannot be written any more: %s\n", p->addr,
			 pki_errstr(EIO));
		return -EIO;
	}
	if (fresh) {
		/* Byte 1 as it will be while on: the default slot, or the other. */
		if (relay_usable(p->addr, PKI_RELAY_B1))
			b1 = PKI_RELAY_B1;
		else if (relay_usable(p->addr, PKI_RELAY_B1_ALT))
			b1 = PKI_RELAY_B1_ALT;
		else
			return 0;
	} else if (!relay_writable(pki_insn_relay_slot(p->addr, b1))) {
		pki_warn("text poke %#lx: its sled relay cannot be written any more: %s\n", p->addr,
			 pki_errstr(EIO));
		return -EIO;
	}
	r->slot = pki_insn_relay_slot(p->addr, b1);
	r->b1_new = r->on ? b1 : PKI_RELAY_B1;
	memcpy(r->slot_old, (const void *)r->slot, PKI_RELAY_SLOT_LEN);
	/* The site's literal bytes say "on", whatever the slot holds. */
	if (ko == PKI_INSN_CALL && memcmp(p->old, text, PKI_SITE_LEN)) {
		uint8_t want[PKI_RELAY_SLOT_LEN];

		if (pki_insn_jmp(want, r->slot, pki_insn_branch_target(p->old, p->addr)) ||
		    memcmp(want, r->slot_old, PKI_RELAY_SLOT_LEN)) {
			struct poke_bug bug = {.addr = p->addr,
					       .what = "sled relay slot",
					       .want = want,
					       .have = r->slot_old};

			poke_bug(-EILSEQ, &bug);
			return -EILSEQ;
		}
	}
	if (r->on) {
		if (pki_insn_jmp(r->slot_new, r->slot, pki_insn_branch_target(p->new, p->addr))) {
			if (fresh)
				return 0;
			pki_warn("text poke %#lx: target %#lx out of reach of its sled relay at "
				 "%#lx: %s\n",
				 p->addr, pki_insn_branch_target(p->new, p->addr), r->slot,
				 pki_errstr(ERANGE));
			return -ERANGE;
		}
	} else {
		memcpy(r->slot_new, r->was_on ? pki_relay_ret : r->slot_old, PKI_RELAY_SLOT_LEN);
	}
	return 1;
}

/* Byte 1 (see PKI_RELAY_B1_ALT), changed only while byte 0 is 90. */
static int relay_b1_put(struct relayed *r, uint8_t from, uint8_t to)
{
	int err;

	if (from == to)
		return 0;
	err = pki_text_put_byte(r->p.addr + 1, from, to);
	if (err)
		pki_warn("text poke %#lx: cannot store byte 1 of its sled: %s\n", r->p.addr,
			 pki_errstr(err));
	r->b1_done = !err;
	return err;
}

static int relay_slot_put(struct relayed *r)
{
	int err;

	if (!memcmp(r->slot_old, r->slot_new, PKI_RELAY_SLOT_LEN))
		return 0;
	err = store_bytes(r->slot, r->slot_old, r->slot_new, PKI_RELAY_SLOT_LEN);
	if (err)
		pki_warn("text poke %#lx: cannot store its sled relay slot %#lx: %s\n", r->p.addr,
			 r->slot, pki_errstr(err));
	r->slot_done = !err;
	return err;
}

static int relay_site_put(struct relayed *r)
{
	int err;

	if (r->was_on == r->on)
		return 0;
	err = pki_text_put_byte(r->p.addr, pki_insn_relay_byte0(r->was_on),
				pki_insn_relay_byte0(r->on));
	if (err)
		pki_warn("text poke %#lx: cannot store the first byte of its sled: %s\n", r->p.addr,
			 pki_errstr(err));
	r->byte_done = !err;
	return err;
}

/* Put back what relay_apply() stored, last first. */
static void relay_undo(struct relayed *r, size_t n)
{
	size_t i;

	for (i = n; i-- > 0;) {
		/* Each site's steps backwards (byte 1 moves only while byte 0 is 90). */
		bool b1_first = r[i].was_on && !r[i].on;

		if (!b1_first && r[i].byte_done)
			pki_text_put_byte(r[i].p.addr, pki_insn_relay_byte0(r[i].on),
					  pki_insn_relay_byte0(r[i].was_on));
		if (b1_first && r[i].b1_done)
			pki_text_put_byte(r[i].p.addr + 1, r[i].b1_new, r[i].b1_old);
		if (r[i].slot_done)
			/*
			 * Back to what it held, except the INT3 fill of a slot never
			 * used: a thread that took the call meanwhile may sit there,
			 * and a ret takes it back to the site's end.
			 */
			store_bytes(r[i].slot, r[i].slot_new,
				    r[i].was_on ? r[i].slot_old : pki_relay_ret,
				    PKI_RELAY_SLOT_LEN);
		if (b1_first && r[i].byte_done)
			pki_text_put_byte(r[i].p.addr, pki_insn_relay_byte0(r[i].on),
					  pki_insn_relay_byte0(r[i].was_on));
		if (!b1_first && r[i].b1_done) {
			sync_cores(); /* no core still runs the e8 just taken back */
			pki_text_put_byte(r[i].p.addr + 1, r[i].b1_new, r[i].b1_old);
		}
		r[i].byte_done = r[i].slot_done = r[i].b1_done = false;
	}
	sync_cores();
}

/* The steps of (c) for every relayed site of the batch. */
static int relay_apply(struct relayed *r, size_t n, unsigned int flags)
{
	bool attach = false;
	size_t i;
	int err = 0;

	for (i = 0; i < n && !err; i++)
		if (r[i].on && !r[i].was_on)
			err = relay_b1_put(&r[i], r[i].b1_old, r[i].b1_new);
	for (i = 0; i < n && !err; i++)
		if (r[i].on) {
			err = relay_slot_put(&r[i]);
			attach |= !r[i].was_on;
		}
	if (!err && attach)
		err = sync_cores();
	for (i = 0; i < n && !err; i++)
		err = relay_site_put(&r[i]);
	for (i = 0; i < n && !err; i++)
		if (!r[i].on)
			err = relay_slot_put(&r[i]);
	/*
	 * Byte 1 only once no core can still run the old e8: with a new byte 1
	 * it would call the other slot.
	 */
	for (i = 0; i < n && !err; i++)
		if (!r[i].on && r[i].was_on && r[i].b1_old != r[i].b1_new) {
			err = sync_cores();
			break;
		}
	for (i = 0; i < n && !err; i++)
		if (!r[i].on && r[i].was_on)
			err = relay_b1_put(&r[i], r[i].b1_old, r[i].b1_new);
	if (!err)
		err = hook(PKI_POKE_AFTER_RELAY);
	if (!err && !(flags & PKI_POKE_LAZY))
		err = sync_cores();
	if (err) {
		relay_undo(r, n);
		return err;
	}
	for (i = 0; i < n; i++)
		if (r[i].on && !r[i].was_on)
			atomic_fetch_add(&pki_stat_relayed, 1);
	return 0;
}

/*
 * Move the sites of @site (sorted) that take the relay into @r, keeping the
 * others in order at the front of @site; *@n becomes their number.
 */
static int relay_split(struct pki_poke *site, size_t *n, struct relayed *r, size_t *nr)
{
	size_t i, k = 0;
	int ret;

	*nr = 0;
	for (i = 0; i < *n; i++) {
		ret = relay_choose(&site[i], &r[*nr]);
		if (ret < 0)
			return ret;
		if (ret) {
			(*nr)++;
			continue;
		}
		/*
		 * A site detached from its relay (it owns a slot) holds the sled
		 * again while the caller (the hook layer) says nop5, the off bytes
		 * it asked for: for the other protocols, which verify the text,
		 * the old bytes are the sled's.  Any other nop5 against a sled
		 * is a mismatch, as always.
		 */
		if (pki_insn_classify(site[i].old) == PKI_INSN_NOP5 &&
		    !memcmp((const void *)site[i].addr, pki_nop1x5, PKI_SITE_LEN) &&
		    (pki_relay_owned(site[i].addr, PKI_RELAY_B1) ||
		     pki_relay_owned(site[i].addr, PKI_RELAY_B1_ALT)))
			memcpy(site[i].old, pki_nop1x5, PKI_SITE_LEN);
		if (k != i)
			site[k] = site[i];
		k++;
	}
	*n = k;
	return 0;
}

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
		 "need the INT3 protocol (crossing a cache line, or a sled without relay "
		 "memory): a trap would kill the process; batch refused, nothing changed: %s\n",
		 tid, name, g->n, pki_errstr(EDEADLK));
	return -EDEADLK;
}

/*
 * The kernel kills a process whose thread meets an INT3 with SIGTRAP
 * blocked, so no INT3 is written while any thread blocks it.  Threads block
 * every signal for a moment in places (glibc's thread start, a signal
 * handler's entry): look again for up to 20 ms before refusing.  A thread
 * that blocks it during the batch (a few milliseconds) is not seen: the
 * remaining exposure, only for the sites this protocol still serves.
 */
static int int3_guard(size_t n)
{
	struct int3_guard g = {.n = n};
	int err = 0, i;

	for (i = 0; i < 20; i++) {
		g.report = i == 19;
		err = pki_threads_each((pid_t)syscall(SYS_gettid), int3_guard_one, &g);
		if (err != -EDEADLK)
			return 0;
		if (!g.report)
			usleep(1000);
	}
	return err;
}

/* The sites that take neither the relay nor one store: the INT3 protocol. */
static int __poke_int3(struct pki_batch *b, struct pki_text_range *range, size_t nrange)
{
	struct pki_poke *site = (struct pki_poke *)b->site;
	size_t i, n = b->n;
	int err, err2;

	err = int3_guard(n);
	if (!err)
		err = pki_trap_sites_add(site, n);
	if (err)
		return err;
	if (pki_text_via_mem(n))
		return __poke_apply(b);
	err = pki_text_unprotect(range, nrange);
	if (err)
		return err;
	err = __poke_apply(b);
	err2 = pki_text_reprotect(range, nrange);
	if (!err && err2) {
		/* W^X could not be restored: undo rather than leave it committed. */
		err = err2;
		if (!pki_text_unprotect(range, nrange)) {
			for (i = 0; i < n; i++) {
				uint8_t tmp[PKI_SITE_LEN];

				memcpy(tmp, site[i].old, PKI_SITE_LEN);
				memcpy(site[i].old, site[i].new, PKI_SITE_LEN);
				memcpy(site[i].new, tmp, PKI_SITE_LEN);
			}
			__poke_apply(b);
			pki_text_reprotect(range, nrange);
		}
	}
	return err;
}

static int __poke_batch(struct pki_poke *pokes, size_t n, unsigned int flags)
{
	struct pki_batch b = {0};
	struct pki_text_range *range;
	struct relayed *rel;
	struct pki_poke *site;
	size_t nrange, nrel = 0;
	int err;

	if (atomic_load(&dead))
		return -ECANCELED;
	err = __poke_prepare();
	if (err)
		return err;
	site = malloc(n * sizeof(*site));
	range = malloc(2 * n * sizeof(*range));
	rel = malloc(n * sizeof(*rel));
	if (!site || !range || !rel) {
		err = -ENOMEM;
		goto free_arrays;
	}
	memcpy(site, pokes, n * sizeof(*site));
	qsort(site, n, sizeof(*site), cmp_poke);
	err = check_sites(site, n);
	if (err)
		goto free_arrays;
	err = pki_text_ranges(site, n, range, &nrange);
	if (err)
		goto free_arrays;
	/* Everything is verified before anything is written. */
	err = relay_split(site, &n, rel, &nrel);
	if (!err)
		err = verify_sites(site, n);
	if (!err && nrel)
		err = relay_apply(rel, nrel, flags);
	if (err || !n)
		goto count;
	b.site = site;
	b.n = n;
	if (single_store_ok(site, n))
		err = __poke_single_store(site, n, flags);
	else
		err = __poke_int3(&b, range, nrange);
	if (err && nrel)
		relay_undo(rel, nrel);
count:
	if (!err)
		atomic_fetch_add(&pki_stat_batches, 1);
free_arrays:
	free(rel);
	free(range);
	free(site);
	return err;
}

int pki_text_poke_batch_flags(struct pki_poke *pokes, size_t n, unsigned int flags)
{
	int err;

	if (!n)
		return 0;
	if (atomic_load(&dead))
		return -ECANCELED;
	pthread_mutex_lock(&poke_lock);
	err = __poke_batch(pokes, n, flags);
	pthread_mutex_unlock(&poke_lock);
	return err;
}

int pki_text_poke_batch(struct pki_poke *pokes, size_t n)
{
	return pki_text_poke_batch_flags(pokes, n, 0);
}

int pki_text_sync(void)
{
	int err = 0;

	if (!atomic_load(&ready)) {
		/* Never patched, or a forked child not registered yet. */
		pthread_mutex_lock(&poke_lock);
		if (prepared_once)
			err = __poke_prepare();
		pthread_mutex_unlock(&poke_lock);
		if (err || !atomic_load(&ready))
			return err;
	}
	return sync_cores();
}
