// SPDX-License-Identifier: MIT
/*
 * Live text patching (src/patch/): batches on real functions of this binary
 * while they run.  Targets are compiled with a five-byte patchable entry
 * (gcc: five one-byte nops) or written in assembly with one five-byte nop;
 * patched sites call assembly stubs that only count.  Every case runs in its
 * own forked process (Check fork mode): a latched-off patcher or an installed
 * SIGTRAP handler does not leak into the next case.
 */
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <probekit/probekit.h>

#include "harness.h"
#include "patch_fixture.h"
#include "base/maps.h"
#include "base/signals.h"
#include "patch/patch.h"

#define TARGET __attribute__((noipa, patchable_function_entry(5, 0)))

TARGET int t_add(int a, int b)
{
	return a + b;
}

TARGET long t_mul(long a, long b)
{
	return a * b;
}

/* Enough sites for a batch that takes the mprotect path (over 8 sites). */
#define MANY 12
#define MANY_FN(i)                                                                                 \
	TARGET int many##i(int a)                                                                  \
	{                                                                                          \
		return a + i;                                                                      \
	}
/* clang-format off */
MANY_FN(0) MANY_FN(1) MANY_FN(2) MANY_FN(3) MANY_FN(4) MANY_FN(5)
MANY_FN(6) MANY_FN(7) MANY_FN(8) MANY_FN(9) MANY_FN(10) MANY_FN(11)
    /* clang-format on */

    static int (*volatile many[MANY])(int) = {many0, many1, many2, many3, many4,  many5,
					      many6, many7, many8, many9, many10, many11};

/* A site holding one five-byte nop, as clang writes it. */
long t_nop5(long a, long b);
__asm__(".text\n"
	".globl t_nop5\n.type t_nop5,@function\n"
	"t_nop5:\n"
	"	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
	"	lea (%rdi,%rsi), %rax\n"
	"	ret\n"
	".size t_nop5, .-t_nop5\n");

/* Called through volatile pointers so the compiler cannot see the bodies. */
static int (*volatile f_add)(int, int) = t_add;
static long (*volatile f_mul)(long, long) = t_mul;
static long (*volatile f_nop5)(long, long) = t_nop5;

/*
 * These cases test the INT3 protocol and the sled kick, which sleds take
 * only when their relay is off (the relay is tested in test_patch_fast).
 */
static void setup_int3(void)
{
	setup();
	pki_text_poke_disable = PKI_POKE_NO_RELAY;
}

static int prot_of(unsigned long addr)
{
	struct pki_maps maps;
	const struct pki_map *m;
	int prot;

	ck_assert_int_eq(pki_maps_read(&maps), 0);
	m = pki_maps_find(&maps, addr);
	ck_assert_ptr_nonnull(m);
	prot = m->prot;
	pki_maps_free(&maps);
	return prot;
}

START_TEST(sled_to_call_and_back)
{
	unsigned long site = site_of(t_add);
	struct pki_poke p = poke_to(t_add, stub_a, pki_nop1x5);
	int i;

	ck_assert_mem_eq((void *)site, pki_nop1x5, PKI_SITE_LEN);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_mem_eq((void *)site, p.new, PKI_SITE_LEN);
	for (i = 0; i < 1000; i++)
		ck_assert_int_eq(f_add(i, 3), i + 3);
	ck_assert_uint_eq(count(&count_a), 1000);

	p = poke_to(t_add, NULL, pki_nop1x5);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_mem_eq((void *)site, pki_nop1x5, PKI_SITE_LEN);
	ck_assert_int_eq(f_add(1, 2), 3);
	ck_assert_uint_eq(count(&count_a), 1000);
	ck_assert(!pki_text_poke_dead());
}
END_TEST

START_TEST(nop5_call_retarget_in_one_batch)
{
	struct pki_poke p[3];

	p[0] = poke_to(t_nop5, stub_a, NULL);
	p[1] = poke_to(t_mul, stub_a, NULL);
	p[2] = poke_to(t_add, stub_b, NULL);
	ck_assert_int_eq(pki_text_poke_batch(p, 3), 0);
	ck_assert_int_eq(f_nop5(40, 2), 42);
	ck_assert_int_eq(f_mul(6, 7), 42);
	ck_assert_int_eq(f_add(40, 2), 42);
	ck_assert_uint_eq(count(&count_a), 2);
	ck_assert_uint_eq(count(&count_b), 1);

	/* call -> call: retarget every site to the other stub. */
	p[0] = poke_to(t_nop5, stub_b, NULL);
	p[1] = poke_to(t_mul, stub_b, NULL);
	p[2] = poke_to(t_add, stub_a, NULL);
	ck_assert_int_eq(pki_text_poke_batch(p, 3), 0);
	ck_assert_int_eq(f_nop5(1, 2), 3);
	ck_assert_int_eq(f_mul(2, 2), 4);
	ck_assert_int_eq(f_add(1, 1), 2);
	ck_assert_uint_eq(count(&count_a), 3);
	ck_assert_uint_eq(count(&count_b), 3);

	p[0] = poke_to(t_nop5, NULL, pki_nop5);
	p[1] = poke_to(t_mul, NULL, pki_nop1x5);
	p[2] = poke_to(t_add, NULL, pki_nop1x5);
	ck_assert_int_eq(pki_text_poke_batch(p, 3), 0);
	ck_assert_mem_eq((void *)site_of(t_nop5), pki_nop5, PKI_SITE_LEN);
	ck_assert_int_eq(f_nop5(1, 2) + f_mul(2, 2) + f_add(1, 1), 9);
	ck_assert_uint_eq(count(&count_a) + count(&count_b), 6);
}
END_TEST

static char last_msg[512];

static int capture(enum pk_print_level level, const char *fmt, va_list ap)
{
	(void)level;
	return vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
}

START_TEST(mismatch_latches_off)
{
	unsigned long site = site_of(t_mul);
	struct pki_poke p[2] = {poke_to(t_add, stub_a, NULL), poke_to(t_mul, stub_a, NULL)};
	char want[64];

	pk_set_print(capture);
	memcpy(p[1].old, pki_nop5, PKI_SITE_LEN); /* not what is there */
	ck_assert_int_eq(pki_text_poke_batch(p, 2), -EILSEQ);
	ck_assert(pki_text_poke_dead());
	/* Nothing was written, not even the site that matched. */
	ck_assert_mem_eq((void *)site_of(t_add), pki_nop1x5, PKI_SITE_LEN);
	ck_assert_mem_eq((void *)site, pki_nop1x5, PKI_SITE_LEN);
	snprintf(want, sizeof(want),
		 "text poke %#lx: expected 0f 1f 44 00 00, found 90 90 90 90 90", site);
	ck_assert_msg(strstr(last_msg, want), "report was: %s", last_msg);

	/* Latched: even a correct batch is refused now. */
	p[1] = poke_to(t_mul, stub_a, NULL);
	ck_assert_int_eq(pki_text_poke_batch(&p[1], 1), -ECANCELED);
	ck_assert_int_eq(f_mul(3, 3), 9);
	ck_assert_uint_eq(count(&count_a), 0);
}
END_TEST

static const int some_data = 1;

START_TEST(bad_batches_rejected)
{
	struct pki_poke p[2] = {poke_to(t_add, stub_a, NULL), poke_to(t_add, stub_b, NULL)};
	struct pki_poke data = {.addr = (unsigned long)&some_data};

	ck_assert_int_eq(pki_text_poke_batch(p, 2), -EINVAL); /* duplicate */
	p[1].addr += 2;
	ck_assert_int_eq(pki_text_poke_batch(p, 2), -EINVAL); /* overlap */
	memcpy(data.old, pki_nop5, PKI_SITE_LEN);
	memcpy(data.new, pki_nop5, PKI_SITE_LEN);
	ck_assert_int_eq(pki_text_poke_batch(&data, 1), -EINVAL); /* not text */
	p[1] = p[0];
	memset(p[1].new, 0x48, PKI_SITE_LEN);
	ck_assert_int_eq(pki_text_poke_batch(&p[1], 1), -EINVAL); /* not emulatable */

	ck_assert(!pki_text_poke_dead());
	ck_assert_mem_eq((void *)site_of(t_add), pki_nop1x5, PKI_SITE_LEN);
	ck_assert_int_eq(pki_text_poke_batch(p, 1), 0);
	ck_assert_int_eq(f_add(2, 2), 4);
	ck_assert_uint_eq(count(&count_a), 1);
}
END_TEST

START_TEST(text_not_writable_after_commit)
{
	unsigned long site = site_of(t_add);
	int before = prot_of(site);
	struct pki_poke p = poke_to(t_add, stub_a, NULL);

	ck_assert(before & PROT_EXEC);
	ck_assert(!(before & PROT_WRITE));
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(prot_of(site), before);
	p = poke_to(t_add, NULL, pki_nop1x5);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(prot_of(site), before);
}
END_TEST

START_TEST(large_batch_mprotect_path)
{
	struct pki_poke p[MANY];
	int prot = prot_of(site_of(many[0])), i;

	/* The old ways: no writable alias, INT3 protocol for every batch. */
	pki_text_poke_disable |= PKI_POKE_NO_ALIAS | PKI_POKE_NO_FAST;

	for (i = 0; i < MANY; i++)
		p[i] = poke_to(many[i], stub_a, NULL);
	ck_assert_int_eq(pki_text_poke_batch(p, MANY), 0);
	for (i = 0; i < MANY; i++) {
		ck_assert_int_eq(many[i](100), 100 + i);
		ck_assert_int_eq(prot_of(site_of(many[i])), prot);
	}
	ck_assert_uint_eq(count(&count_a), MANY);

	/* A failure half-way through is undone on this path too. */
	pki_text_poke_hook = fail_hook;
	fail_at = PKI_POKE_AFTER_TAILS;
	for (i = 0; i < MANY; i++)
		p[i] = poke_to(many[i], NULL, pki_nop1x5);
	ck_assert_int_eq(pki_text_poke_batch(p, MANY), -EIO);
	for (i = 0; i < MANY; i++)
		ck_assert_mem_eq((void *)p[i].addr, p[i].old, PKI_SITE_LEN);
	ck_assert_int_eq(prot_of(site_of(many[0])), prot);

	ck_assert_int_eq(pki_text_poke_batch(p, MANY), 0);
	for (i = 0; i < MANY; i++) {
		ck_assert_mem_eq((void *)site_of(many[i]), pki_nop1x5, PKI_SITE_LEN);
		ck_assert_int_eq(many[i](1), 1 + i);
	}
	ck_assert_uint_eq(count(&count_a), MANY);
	ck_assert_int_eq(prot_of(site_of(many[0])), prot);
}
END_TEST

/* --- a thread hitting a site mid-batch ------------------------------------ */

static enum pki_poke_stage call_at;
static int call_result;

static int call_from_hook(enum pki_poke_stage stage)
{
	if (stage == call_at)
		call_result = f_add(20, 22);
	return 0;
}

START_TEST(int3_emulates_new_instruction)
{
	static const enum pki_poke_stage stages[] = {PKI_POKE_AFTER_INT3, PKI_POKE_AFTER_TAILS};
	struct pki_poke_stats st;
	size_t i;

	/* call -> sled could take the single-store path: no INT3 to hit. */
	pki_text_poke_disable |= PKI_POKE_NO_FAST;
	pki_text_poke_hook = call_from_hook;
	for (i = 0; i < 2; i++) {
		struct pki_poke p = poke_to(t_add, stub_a, NULL);

		call_at = stages[i];
		call_result = 0;
		ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
		ck_assert_int_eq(call_result, 42);
		ck_assert_uint_eq(count(&count_a), i + 1); /* the INT3 ran the call */
		p = poke_to(t_add, NULL, pki_nop1x5);
		call_result = 0;
		ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
		ck_assert_int_eq(call_result, 42);
		ck_assert_uint_eq(count(&count_a), i + 1); /* the INT3 ran the nops */
	}
	pki_text_poke_stats(&st);
	ck_assert_uint_eq(st.emulated, 4);
	ck_assert_uint_eq(st.batches, 4);
}
END_TEST

START_TEST(failure_rolls_back)
{
	static const enum pki_poke_stage stages[] = {PKI_POKE_AFTER_INT3, PKI_POKE_AFTER_TAILS,
						     PKI_POKE_AFTER_FIRST};
	int prot = prot_of(site_of(t_add));
	size_t i;

	pki_text_poke_disable |= PKI_POKE_NO_FAST;
	pki_text_poke_hook = fail_hook;
	for (i = 0; i < 3; i++) {
		struct pki_poke p[2] = {poke_to(t_add, stub_a, NULL),
					poke_to(t_nop5, stub_b, NULL)};

		fail_at = stages[i];
		failed = false;
		ck_assert_int_eq(pki_text_poke_batch(p, 2), -EIO);
		ck_assert_mem_eq((void *)site_of(t_add), pki_nop1x5, PKI_SITE_LEN);
		ck_assert_mem_eq((void *)site_of(t_nop5), pki_nop5, PKI_SITE_LEN);
		ck_assert_int_eq(prot_of(site_of(t_add)), prot);
		ck_assert(!pki_text_poke_dead());
	}
	ck_assert_int_eq(f_add(1, 1) + (int)f_nop5(1, 1), 4);
	ck_assert_uint_eq(count(&count_a) + count(&count_b), 0);
}
END_TEST

/* --- a thread stopped inside the sled being converted --------------------- */

/*
 * Thread T single-steps (EFLAGS.TF) into t_add's sled and parks in the
 * application's SIGTRAP handler with its IP at byte 2 of the sled.  The batch
 * converting the sled sends the kick while T is parked; T then leaves the
 * handler and the kick lands with IP = site + 2: it must move T to site + 5
 * before the tail (the call's rel32) is written.
 */
static atomic_int parked, go;
static unsigned long traced_site, ip_after_park;
static bool entered;

static void tf_handler(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;
	unsigned long ip = (unsigned long)uc->uc_mcontext.gregs[REG_RIP];

	(void)sig;
	if (si->si_code != TRAP_TRACE)
		return;
	if (ip >= traced_site && ip < traced_site + PKI_SITE_LEN) {
		entered = true;
		if (ip == traced_site + 2 && !atomic_load(&parked)) {
			atomic_store(&parked, 1);
			while (!atomic_load(&go))
				;
		}
		return;
	}
	if (entered) {
		if (!ip_after_park)
			ip_after_park = ip;
		uc->uc_mcontext.gregs[REG_EFL] &= ~0x100l;
	}
}

static void *traced_thread(void *arg)
{
	int r;

	(void)arg;
	__asm__ volatile("pushfq; orq $0x100, (%%rsp); popfq" ::: "memory", "cc");
	r = f_add(40, 2);
	return (void *)(long)r;
}

static int release_hook(enum pki_poke_stage stage)
{
	if (stage == PKI_POKE_AFTER_KICK_SENT)
		atomic_store(&go, 1);
	return 0;
}

START_TEST(kick_moves_thread_out_of_sled)
{
	struct sigaction sa = {.sa_sigaction = tf_handler, .sa_flags = SA_SIGINFO | SA_NODEFER};
	struct pki_poke p = poke_to(t_mul, stub_b, NULL);
	struct pki_poke_stats st;
	pthread_t t;
	void *ret;

	traced_site = site_of(t_add);
	sigemptyset(&sa.sa_mask);
	ck_assert_int_eq(sigaction(SIGTRAP, &sa, NULL), 0);
	/* A first batch installs the patcher's handlers, chained to tf_handler. */
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);

	ck_assert_int_eq(pthread_create(&t, NULL, traced_thread, NULL), 0);
	while (!atomic_load(&parked))
		sched_yield();
	pki_text_poke_hook = release_hook;
	p = poke_to(t_add, stub_a, NULL);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(pthread_join(t, &ret), 0);
	ck_assert_int_eq((long)ret, 42);
	pki_text_poke_stats(&st);
	ck_assert_uint_eq(st.sled_moves, 1);
	/* T resumed at the end of the sled, not at byte 3. */
	ck_assert_uint_gt(ip_after_park, traced_site + PKI_SITE_LEN);
	ck_assert_uint_eq(count(&count_a), 0);
	ck_assert_int_eq(f_add(1, 2), 3);
	ck_assert_uint_eq(count(&count_a), 1);
}
END_TEST

/*
 * A thread that blocks the kick signal is never signalled; it is looked
 * at again until it is seen asleep outside the sleds.  One that is busy for
 * a while and then sleeps lets the batch through; one that never sleeps
 * makes it fail after the timeout with every site as it was.
 */
static atomic_int h5_phase;
static atomic_bool h5_forever;

static void *h5_thread(void *arg)
{
	sigset_t kick;
	struct timespec t0, now;

	(void)arg;
	sigemptyset(&kick);
	sigaddset(&kick, SIGRTMAX - 1);
	pthread_sigmask(SIG_BLOCK, &kick, NULL);
	atomic_store(&h5_phase, 1);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do /* busy: never seen blocked in the kernel */
		clock_gettime(CLOCK_MONOTONIC, &now);
	while (atomic_load(&h5_forever) ||
	       (now.tv_sec - t0.tv_sec) * 1000000000l + now.tv_nsec - t0.tv_nsec < 300000000l);
	atomic_store(&h5_phase, 2);
	while (atomic_load(&h5_phase) != 3)
		usleep(1000);
	return NULL;
}

START_TEST(kick_waits_for_thread_that_blocks_it)
{
	struct pki_poke p = poke_to(t_add, stub_a, NULL);
	pthread_t t;

	ck_assert_int_eq(pthread_create(&t, NULL, h5_thread, NULL), 0);
	while (!atomic_load(&h5_phase))
		sched_yield();
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(f_add(1, 2), 3);
	ck_assert_uint_eq(count(&count_a), 1);
	atomic_store(&h5_phase, 3);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
}
END_TEST

START_TEST(kick_gives_up_on_thread_that_never_sleeps)
{
	struct pki_poke p = poke_to(t_add, stub_a, NULL);
	pthread_t t;

	atomic_store(&h5_forever, true);
	ck_assert_int_eq(pthread_create(&t, NULL, h5_thread, NULL), 0);
	while (!atomic_load(&h5_phase))
		sched_yield();
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), -ETIMEDOUT);
	ck_assert_mem_eq((void *)p.addr, pki_nop1x5, PKI_SITE_LEN);
	ck_assert(!pki_text_poke_dead());
	ck_assert_int_eq(f_add(1, 2), 3);
	ck_assert_uint_eq(count(&count_a), 0);
	atomic_store(&h5_forever, false);
	while (atomic_load(&h5_phase) != 2)
		sched_yield();
	/* Asleep now: the same batch goes through. */
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(f_add(1, 2), 3);
	ck_assert_uint_eq(count(&count_a), 1);
	atomic_store(&h5_phase, 3);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
}
END_TEST

/* --- stress ----------------------------------------------------------------- */

#define WORKERS 4

static atomic_bool stop, wrong;
static unsigned long calls[WORKERS];

static void *worker(void *arg)
{
	long id = (long)arg, i;
	unsigned long n = 0;

	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		for (i = 0; i < 64; i++) {
			if (f_add((int)i, 1) != i + 1 || f_mul(i, 3) != i * 3 ||
			    f_nop5(i, 5) != i + 5 || many[i % MANY]((int)i) != i + i % MANY)
				atomic_store(&wrong, true);
		}
		n += 4 * 64;
	}
	calls[id] = n;
	return NULL;
}

START_TEST(stress_patch_while_calling)
{
	const void *fn[3] = {(void *)t_add, (void *)t_mul, (void *)t_nop5};
	const uint8_t *orig[3] = {pki_nop1x5, pki_nop1x5, pki_nop5};
	struct pki_poke_stats st;
	pthread_t t[WORKERS];
	struct timespec start, now;
	unsigned long total = 0, rounds = 0, before;
	long i;
	int k;

	for (i = 0; i < WORKERS; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, worker, (void *)i), 0);
	clock_gettime(CLOCK_MONOTONIC, &start);
	do {
		struct pki_poke p[3];
		void (*stub)(void) = rounds & 1 ? stub_b : stub_a;

		/* all to stub, retarget, then back; sometimes one site alone */
		for (k = 0; k < 3; k++)
			p[k] = poke_to(fn[k], stub, NULL);
		ck_assert_int_eq(pki_text_poke_batch(p, 3), 0);
		for (k = 0; k < 3; k++)
			p[k] = poke_to(fn[k], stub == stub_a ? stub_b : stub_a, NULL);
		ck_assert_int_eq(pki_text_poke_batch(p, rounds % 3 ? 3 : 1), 0);
		for (k = 0; k < 3; k++)
			p[k] = poke_to(fn[k], NULL, orig[k]);
		ck_assert_int_eq(pki_text_poke_batch(p, 3), 0);
		if (rounds % 4 == 0) {
			/* a batch big enough for the mprotect path, and back */
			struct pki_poke m[MANY];

			for (k = 0; k < MANY; k++)
				m[k] = poke_to(many[k], stub, NULL);
			ck_assert_int_eq(pki_text_poke_batch(m, MANY), 0);
			for (k = 0; k < MANY; k++)
				m[k] = poke_to(many[k], NULL, pki_nop1x5);
			ck_assert_int_eq(pki_text_poke_batch(m, MANY), 0);
		}
		rounds++;
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (now.tv_sec - start.tv_sec < 2);
	atomic_store(&stop, true);
	for (i = 0; i < WORKERS; i++) {
		ck_assert_int_eq(pthread_join(t[i], NULL), 0);
		total += calls[i];
	}
	ck_assert(!atomic_load(&wrong));
	ck_assert(!pki_text_poke_dead());
	/* Every stub hit is a call the workers made; none after the last batch. */
	before = count(&count_a) + count(&count_b);
	ck_assert_uint_le(before, total);
	ck_assert_int_eq(f_add(1, 1) + f_mul(2, 2) + (int)f_nop5(3, 3), 12);
	ck_assert_uint_eq(count(&count_a) + count(&count_b), before);
	for (k = 0; k < 3; k++)
		ck_assert_mem_eq((void *)site_of(fn[k]), orig[k], PKI_SITE_LEN);
	pki_text_poke_stats(&st);
	printf("stress: %lu rounds, %lu calls, %lu stub hits, %lu emulated, %lu restarted, "
	       "%lu sled moves\n",
	       rounds, total, before, st.emulated, st.restarted, st.sled_moves);
}
END_TEST

/* --- SIGTRAP chaining ----------------------------------------------------- */

static volatile sig_atomic_t app_traps, app_code;

static void app_handler(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	app_traps++;
	app_code = si->si_code;
}

START_TEST(foreign_sigtraps_reach_app_handler)
{
	struct sigaction sa = {.sa_sigaction = app_handler, .sa_flags = SA_SIGINFO};
	struct pki_poke p = poke_to(t_add, stub_a, NULL);

	sigemptyset(&sa.sa_mask);
	ck_assert_int_eq(sigaction(SIGTRAP, &sa, NULL), 0);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(raise(SIGTRAP), 0);
	ck_assert_int_eq(app_traps, 1);
	ck_assert_int_eq(app_code, SI_TKILL);
	__asm__ volatile("int3" ::: "memory");
	ck_assert_int_eq(app_traps, 2);
	ck_assert_int_eq(app_code, SI_KERNEL);
	ck_assert_int_eq(f_add(1, 1), 2);
	ck_assert_uint_eq(count(&count_a), 1);
}
END_TEST

START_TEST(foreign_sigtrap_default_action_kept)
{
	struct pki_poke p = poke_to(t_add, stub_a, NULL);

	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	raise(SIGTRAP); /* no application handler: the process dies of SIGTRAP */
}
END_TEST

/* --- a signal handler that calls a site, nested in our SIGTRAP handler ---- */

/*
 * Thread C calls t_add in a loop while the batch converting it stands still
 * after its INT3 (PKI_POKE_AFTER_INT3), so every call traps; SIGALRM comes
 * every 50 us and its handler calls t_add too.  An alarm that arrives while
 * C is in the kernel for an INT3 is delivered on top of the SIGTRAP frame:
 * its handler runs inside probekit's SIGTRAP handler and traps again there.
 * With SIGTRAP blocked in that handler, the kernel killed the process.
 * Only probekit's SIGTRAP (and kick) handlers block PKI_SIG_KICK: an alarm
 * whose interrupted mask holds it landed inside them.
 */
static atomic_bool nest_stop;
static atomic_long nest_alarms, nest_inside, nest_bad;

static void nest_alarm(int sig, siginfo_t *si, void *ucv)
{
	const ucontext_t *uc = ucv;

	(void)sig;
	(void)si;
	atomic_fetch_add(&nest_alarms, 1);
	if (sigismember(&uc->uc_sigmask, PKI_SIG_KICK))
		atomic_fetch_add(&nest_inside, 1);
	if (f_add(2, 3) != 5)
		atomic_fetch_add(&nest_bad, 1);
}

static void *nest_caller(void *arg)
{
	sigset_t alrm;

	(void)arg;
	sigemptyset(&alrm);
	sigaddset(&alrm, SIGALRM);
	pthread_sigmask(SIG_UNBLOCK, &alrm, NULL);
	while (!atomic_load(&nest_stop))
		if (f_add(1, 2) != 3)
			atomic_fetch_add(&nest_bad, 1);
	return NULL;
}

static int nest_hook(enum pki_poke_stage stage)
{
	struct timespec t0, now, ms = {0, 1000000};

	if (stage != PKI_POKE_AFTER_INT3)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		nanosleep(&ms, NULL);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (atomic_load(&nest_inside) < 50 && now.tv_sec - t0.tv_sec < 3);
	return 0;
}

START_TEST(handler_calls_site_inside_sigtrap_handler)
{
	struct sigaction sa = {.sa_sigaction = nest_alarm, .sa_flags = SA_SIGINFO | SA_RESTART};
	struct itimerval every = {{0, 50}, {0, 50}}, off = {{0, 0}, {0, 0}};
	struct pki_poke p = poke_to(t_add, stub_a, NULL);
	sigset_t alrm;
	pthread_t t;

	pki_text_poke_disable = PKI_POKE_NO_FAST;
	sigemptyset(&sa.sa_mask);
	ck_assert_int_eq(sigaction(SIGALRM, &sa, NULL), 0);
	/* the alarms go to C only */
	sigemptyset(&alrm);
	sigaddset(&alrm, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &alrm, NULL);
	ck_assert_int_eq(pthread_create(&t, NULL, nest_caller, NULL), 0);
	ck_assert_int_eq(setitimer(ITIMER_REAL, &every, NULL), 0);
	pki_text_poke_hook = nest_hook;
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	pki_text_poke_hook = NULL;
	setitimer(ITIMER_REAL, &off, NULL);
	atomic_store(&nest_stop, true);
	pthread_join(t, NULL);
	printf("nested: %ld of %ld alarms landed in the SIGTRAP handler\n",
	       atomic_load(&nest_inside), atomic_load(&nest_alarms));
	ck_assert_int_eq(atomic_load(&nest_bad), 0);
	ck_assert_int_gt(atomic_load(&nest_inside), 0);
	ck_assert_int_eq(f_add(1, 1), 2);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("patch");
	TCase *tc = tcase_create("poke");
	TCase *stress = tcase_create("stress");

	pk_test_require_membarrier_sync_core();
	tcase_add_checked_fixture(tc, setup_int3, NULL);
	tcase_add_test(tc, sled_to_call_and_back);
	tcase_add_test(tc, nop5_call_retarget_in_one_batch);
	tcase_add_test(tc, mismatch_latches_off);
	tcase_add_test(tc, bad_batches_rejected);
	tcase_add_test(tc, text_not_writable_after_commit);
	tcase_add_test(tc, large_batch_mprotect_path);
	tcase_add_test(tc, int3_emulates_new_instruction);
	tcase_add_test(tc, failure_rolls_back);
	/* The kick tests wait for a busy thread: 4 s is short on a loaded 2-CPU machine. */
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, kick_moves_thread_out_of_sled);
	tcase_add_test(tc, kick_waits_for_thread_that_blocks_it);
	tcase_add_test(tc, kick_gives_up_on_thread_that_never_sleeps);
	tcase_add_test(tc, foreign_sigtraps_reach_app_handler);
	tcase_add_test_raise_signal(tc, foreign_sigtrap_default_action_kept, SIGTRAP);
	tcase_add_test(tc, handler_calls_site_inside_sigtrap_handler);
	suite_add_tcase(s, tc);

	tcase_add_checked_fixture(stress, setup_int3, NULL);
	tcase_set_timeout(stress, 30);
	tcase_add_test(stress, stress_patch_while_calling);
	suite_add_tcase(s, stress);
	return pk_test_run(s);
}
