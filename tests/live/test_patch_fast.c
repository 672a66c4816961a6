// SPDX-License-Identifier: MIT
/*
 * The single-store path of the patcher and the writable text aliases it
 * needs (src/arch/x86_64/poke_store.c and poke_relay.c, src/patch/alias.c):
 * which sites take it (non-sled sites inside one cache line, whether in one
 * 16-byte block or across two), which take their sled relay (gcc sleds) and
 * which keep the INT3 protocol
 * (sites crossing a cache line), correctness while threads hammer a site
 * flipped 100,000 times, W^X as /proc/self/maps shows it, fork() after patching (parent and
 * child patch independently), and dlclose() of a patched library.  Targets
 * are assembly with known alignment; patched sites call stubs that count.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <ucontext.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <probekit/probekit.h>

#include "harness.h"
#include "patch_fixture.h"
#include "base/maps.h"
#include "patch/patch.h"

long fa_aligned(long a, long b);
long fa_aligned2(long a, long b);
long fa_straddle(long a, long b);
long fa_endbr(long a, long b);
long fa_sled(long a, long b);
long fa_line(long a, long b);
long fa_sled_alt(long a, long b);
long fa_sled_twin(long a, long b);
void fa_guard(void);
/*
 * fa_aligned(2) start a 16-byte block (site fits in it), fa_endbr's site
 * follows an endbr64 (entry + 4, still inside), fa_straddle starts 12 bytes
 * into one (its site crosses into the next), fa_sled holds gcc's five
 * one-byte nops, fa_line starts 60 bytes into a cache line (its site crosses
 * into the next line).
 */
__asm__(".text\n"
	".balign 16\n"
	".globl fa_aligned\n.type fa_aligned,@function\n"
	"fa_aligned:\n"
	"	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
	"	lea (%rdi,%rsi), %rax\n"
	"	ret\n"
	".size fa_aligned, .-fa_aligned\n"
	".balign 16\n"
	".globl fa_aligned2\n.type fa_aligned2,@function\n"
	"fa_aligned2:\n"
	"	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
	"	lea 1(%rdi,%rsi), %rax\n"
	"	ret\n"
	".size fa_aligned2, .-fa_aligned2\n"
	".balign 16\n"
	".globl fa_endbr\n.type fa_endbr,@function\n"
	"fa_endbr:\n"
	"	.byte 0xf3, 0x0f, 0x1e, 0xfa\n"
	"	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
	"	lea 4(%rdi,%rsi), %rax\n"
	"	ret\n"
	".size fa_endbr, .-fa_endbr\n"
	".balign 64\n"
	"	.fill 12, 1, 0x90\n"
	".globl fa_straddle\n.type fa_straddle,@function\n"
	"fa_straddle:\n"
	"	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
	"	lea 2(%rdi,%rsi), %rax\n"
	"	ret\n"
	".size fa_straddle, .-fa_straddle\n"
	".balign 16\n"
	".globl fa_sled\n.type fa_sled,@function\n"
	"fa_sled:\n"
	"	.byte 0x90, 0x90, 0x90, 0x90, 0x90\n"
	"	lea 3(%rdi,%rsi), %rax\n"
	"	ret\n"
	".size fa_sled, .-fa_sled\n"
	".balign 64\n"
	"	.fill 60, 1, 0x90\n"
	".globl fa_line\n.type fa_line,@function\n"
	"fa_line:\n"
	"	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
	"	lea 5(%rdi,%rsi), %rax\n"
	"	ret\n"
	".size fa_line, .-fa_line\n"
	".balign 64\n"
	"	.fill 40, 1, 0xcc\n"
	".globl fa_sled_alt\n.type fa_sled_alt,@function\n"
	"fa_sled_alt:\n"
	"	.byte 0x90, 0x90, 0x90, 0x90, 0x90\n"
	"	lea 8(%rdi,%rsi), %rax\n"
	"	ret\n"
	".size fa_sled_alt, .-fa_sled_alt\n"
	"	.fill 0x68 - (. - fa_sled_alt), 1, 0xcc\n"
	".globl fa_sled_twin\n.type fa_sled_twin,@function\n"
	"fa_sled_twin:\n"
	"	.byte 0x90, 0x90, 0x90, 0x90, 0x90\n"
	"	lea 9(%rdi,%rsi), %rax\n"
	"	ret\n"
	".size fa_sled_twin, .-fa_sled_twin\n"
	".globl fa_guard\n.type fa_guard,@function\n"
	"fa_guard:\n"
	"	ret\n"
	"	.byte 0x90\n"
	".size fa_guard, .-fa_guard\n");

static long (*volatile f_aligned)(long, long) = fa_aligned;
static long (*volatile f_aligned2)(long, long) = fa_aligned2;
static long (*volatile f_straddle)(long, long) = fa_straddle;
static long (*volatile f_endbr)(long, long) = fa_endbr;
static long (*volatile f_sled)(long, long) = fa_sled;
static long (*volatile f_line)(long, long) = fa_line;
static long (*volatile f_sled_alt)(long, long) = fa_sled_alt;
static long (*volatile f_sled_twin)(long, long) = fa_sled_twin;

static struct pki_poke_stats stats(void)
{
	struct pki_poke_stats st;

	pki_text_poke_stats(&st);
	return st;
}

START_TEST(fast_path_for_aligned_nop5)
{
	struct pki_poke p = poke_to(fa_aligned, stub_a, NULL);
	struct pki_poke_stats st;

	ck_assert(pki_insn_single_store_ok(p.addr, p.old));
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	st = stats();
	ck_assert_uint_eq(st.fast, 1);
	ck_assert_uint_eq(st.batches, 1);
	ck_assert_uint_eq(st.aliases, 1);
	ck_assert_mem_eq((void *)p.addr, p.new, PKI_SITE_LEN);
	ck_assert_int_eq(f_aligned(40, 2), 42);
	ck_assert_uint_eq(count(&count_a), 1);

	/* call -> call, then back to the nop: one store each. */
	p = poke_to(fa_aligned, stub_b, NULL);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(f_aligned(1, 2), 3);
	ck_assert_uint_eq(count(&count_b), 1);
	p = poke_to(fa_aligned, NULL, pki_nop5);
	ck_assert_int_eq(pki_text_poke_batch_flags(&p, 1, PKI_POKE_LAZY), 0);
	ck_assert_int_eq(pki_text_sync(), 0);
	ck_assert_mem_eq((void *)p.addr, pki_nop5, PKI_SITE_LEN);
	ck_assert_int_eq(f_aligned(1, 2), 3);
	ck_assert_uint_eq(count(&count_a) + count(&count_b), 2);
	st = stats();
	ck_assert_uint_eq(st.fast, 3);
	ck_assert_uint_eq(st.emulated + st.restarted, 0);
	ck_assert(!pki_text_poke_dead());
}
END_TEST

START_TEST(fast_path_after_endbr64)
{
	struct pki_poke p = poke_to(fa_endbr, stub_a, NULL);

	ck_assert_uint_eq(p.addr & 15, 4);
	ck_assert(pki_insn_single_store_ok(p.addr, p.old));
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(stats().fast, 1);
	ck_assert_int_eq(f_endbr(1, 1), 6);
	ck_assert_uint_eq(count(&count_a), 1);
	p = poke_to(fa_endbr, NULL, pki_nop5);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(stats().fast, 2);
	ck_assert_int_eq(f_endbr(1, 1), 6);
	ck_assert_uint_eq(count(&count_a), 1);
	ck_assert_uint_eq(stats().emulated, 0);
}
END_TEST

START_TEST(straddling_block_takes_one_store)
{
	struct pki_poke p = poke_to(fa_straddle, stub_a, NULL), q;

	ck_assert_uint_eq(p.addr & 15, 12);
	ck_assert(pki_insn_single_store_ok(p.addr, p.old));
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(stats().fast, 1);
	ck_assert_uint_eq(stats().emulated, 0);
	ck_assert_int_eq(f_straddle(1, 1), 4);
	ck_assert_uint_eq(count(&count_a), 1);

	p = poke_to(fa_straddle, NULL, pki_nop5);
	q = poke_to(fa_aligned, stub_b, NULL);
	struct pki_poke both[2] = {p, q};

	ck_assert_int_eq(pki_text_poke_batch(both, 2), 0);
	ck_assert_uint_eq(stats().fast, 2);
	ck_assert_int_eq(f_straddle(1, 1) + f_aligned(1, 1), 6);
	ck_assert_uint_eq(count(&count_a), 1);
	ck_assert_uint_eq(count(&count_b), 1);
	ck_assert_mem_eq((void *)site_of(fa_straddle), pki_nop5, PKI_SITE_LEN);
	/* Written through the alias: the text was never made writable. */
	ck_assert_uint_eq(stats().aliases, 1);
}
END_TEST

START_TEST(line_crossing_site_keeps_int3)
{
	struct pki_poke p = poke_to(fa_line, stub_a, NULL), q;

	ck_assert_uint_eq(p.addr & 63, 60);
	ck_assert(!pki_insn_single_store_ok(p.addr, p.old));
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(stats().fast, 0);
	ck_assert_uint_eq(stats().batches, 1);
	ck_assert_int_eq(f_line(1, 1), 7);
	ck_assert_uint_eq(count(&count_a), 1);

	/* One line-crossing site puts the rest of the batch on the INT3 protocol. */
	p = poke_to(fa_line, NULL, pki_nop5);
	q = poke_to(fa_aligned, stub_b, NULL);
	struct pki_poke both[2] = {p, q};

	ck_assert_int_eq(pki_text_poke_batch(both, 2), 0);
	ck_assert_uint_eq(stats().fast, 0);
	ck_assert_int_eq(f_line(1, 1) + f_aligned(1, 1), 9);
	ck_assert_uint_eq(count(&count_a), 1);
	ck_assert_uint_eq(count(&count_b), 1);
}
END_TEST

/*
 * A sled takes its relay: byte 0 becomes e8 and nothing else of the site
 * ever changes, so no INT3 and no kick; off, the sled is back byte for byte.
 * Core syncs: two for the first attach (its slot held the INT3 fill), one
 * for each later batch (a retarget, a detach, an attach onto the ret the
 * detach left).
 */
static unsigned long syncs_since(unsigned long *last)
{
	unsigned long now = stats().syncs, d = now - *last;

	*last = now;
	return d;
}

START_TEST(sled_takes_its_relay)
{
	uint8_t off[PKI_SITE_LEN];
	struct pki_poke p = poke_to(fa_sled, stub_a, NULL);
	struct pki_poke_stats st;
	unsigned long syncs = stats().syncs;

	ck_assert(!pki_insn_single_store_ok(p.addr, p.old));
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(syncs_since(&syncs), 2);
	ck_assert_mem_eq((void *)p.addr, pki_relay_call, PKI_SITE_LEN);
	ck_assert_int_eq(f_sled(1, 1), 5);
	ck_assert_uint_eq(count(&count_a), 1);

	/* Retarget: the slot only. */
	struct pki_poke r = p;

	memcpy(r.old, p.new, PKI_SITE_LEN);
	pki_insn_call(r.new, r.addr, (unsigned long)stub_b);
	ck_assert_int_eq(pki_text_poke_batch(&r, 1), 0);
	ck_assert_uint_eq(syncs_since(&syncs), 1);
	ck_assert_mem_eq((void *)p.addr, pki_relay_call, PKI_SITE_LEN);
	ck_assert_int_eq(f_sled(1, 1), 5);
	ck_assert_uint_eq(count(&count_a), 1);
	ck_assert_uint_eq(count(&count_b), 1);

	/* Off: the caller's off bytes (nop5) mean the sled, restored exactly. */
	pki_insn_site_off(off, pki_nop1x5);
	memcpy(p.old, r.new, PKI_SITE_LEN);
	memcpy(p.new, off, PKI_SITE_LEN);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(syncs_since(&syncs), 1);
	ck_assert_mem_eq((void *)p.addr, pki_nop1x5, PKI_SITE_LEN);
	ck_assert_int_eq(f_sled(1, 1), 5);
	ck_assert_uint_eq(count(&count_a) + count(&count_b), 2);

	/* And on again from the caller's nop5. */
	memcpy(p.old, off, PKI_SITE_LEN);
	pki_insn_call(p.new, p.addr, (unsigned long)stub_a);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(syncs_since(&syncs), 1);
	ck_assert_int_eq(f_sled(1, 1), 5);
	ck_assert_uint_eq(count(&count_a), 2);
	st = stats();
	ck_assert_uint_eq(st.relayed, 2);
	ck_assert_uint_eq(st.kicks, 0);
	ck_assert_uint_eq(st.emulated, 0);
	ck_assert_uint_eq(st.batches, 4);
}
END_TEST

/*
 * Thread T stops at byte 2 of the sled (single-stepped there), and a
 * signal handler of its own (SIGUSR1, which does not block anything of ours)
 * interrupts it there and runs for the whole batch that attaches the sled.
 * The sled kick would be answered from inside that handler, whose IP is not
 * in the sled, and T would resume inside the new call's rel32.  With the
 * relay, bytes 1..4 never change: T resumes into nops and returns right.
 */
static atomic_int h3_parked, h3_go;
static unsigned long h3_site;

static void h3_usr1(int sig)
{
	(void)sig;
	atomic_store(&h3_parked, 1);
	while (!atomic_load(&h3_go))
		;
}

static void h3_step(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;
	unsigned long ip = (unsigned long)uc->uc_mcontext.gregs[REG_RIP];

	(void)sig;
	if (si->si_code != TRAP_TRACE)
		return;
	if (ip == h3_site + 2) {
		uc->uc_mcontext.gregs[REG_EFL] &= ~0x100l;
		pthread_kill(pthread_self(), SIGUSR1); /* delivered at byte 2 */
	}
}

static void *h3_thread(void *arg)
{
	long r;

	(void)arg;
	__asm__ volatile("pushfq; orq $0x100, (%%rsp); popfq" ::: "memory", "cc");
	r = f_sled(40, 2);
	__asm__ volatile("pushfq; andq $~0x100, (%%rsp); popfq" ::: "memory", "cc");
	return (void *)r;
}

START_TEST(sled_attached_under_long_handler)
{
	struct sigaction step = {.sa_sigaction = h3_step, .sa_flags = SA_SIGINFO};
	struct sigaction usr1 = {.sa_handler = h3_usr1};
	struct pki_poke p = poke_to(fa_sled, stub_a, NULL);
	pthread_t t;
	void *ret;

	h3_site = p.addr;
	sigemptyset(&step.sa_mask);
	sigemptyset(&usr1.sa_mask);
	ck_assert_int_eq(sigaction(SIGTRAP, &step, NULL), 0);
	ck_assert_int_eq(sigaction(SIGUSR1, &usr1, NULL), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, h3_thread, NULL), 0);
	while (!atomic_load(&h3_parked))
		sched_yield();
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	atomic_store(&h3_go, 1);
	ck_assert_int_eq(pthread_join(t, &ret), 0);
	ck_assert_int_eq((long)ret, 45);
	ck_assert_uint_eq(count(&count_a), 0); /* it entered before the attach */
	ck_assert_int_eq(f_sled(1, 1), 5);
	ck_assert_uint_eq(count(&count_a), 1);
}
END_TEST

/*
 * Worker threads that block every signal (sigfillset + pthread_sigmask)
 * and call the sites while batches change them.  An INT3 would kill the
 * process: the sled takes its relay and the aligned site one store, with no
 * trap; the line-crossing site, which would need one, is refused with
 * -EDEADLK and left as it was.
 */
static atomic_bool h4_stop, h4_wrong;

static void *h4_worker(void *arg)
{
	sigset_t all;
	long i;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, NULL);
	while (!atomic_load_explicit(&h4_stop, memory_order_relaxed))
		for (i = 0; i < 64; i++)
			if (f_sled(i, 1) != i + 4 || f_aligned(i, 1) != i + 1 ||
			    f_line(i, 1) != i + 6)
				atomic_store(&h4_wrong, true);
	return NULL;
}

START_TEST(sigtrap_blocked_threads_never_meet_a_trap)
{
	uint8_t off[PKI_SITE_LEN];
	pthread_t t[2];
	int i;

	pki_insn_site_off(off, pki_nop1x5);
	for (i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, h4_worker, NULL), 0);
	for (i = 0; i < 2000; i++) {
		struct pki_poke p[2] = {poke_to(fa_sled, i & 1 ? stub_a : stub_b, NULL),
					poke_to(fa_aligned, stub_a, NULL)};

		ck_assert_int_eq(pki_text_poke_batch(p, 2), 0);
		memcpy(p[0].old, p[0].new, PKI_SITE_LEN);
		memcpy(p[0].new, off, PKI_SITE_LEN);
		p[1] = poke_to(fa_aligned, NULL, pki_nop5);
		ck_assert_int_eq(pki_text_poke_batch(p, 2), 0);
	}
	struct pki_poke q = poke_to(fa_line, stub_a, NULL);

	ck_assert_int_eq(pki_text_poke_batch(&q, 1), -EDEADLK);
	ck_assert_mem_eq((void *)q.addr, pki_nop5, PKI_SITE_LEN);
	ck_assert(!pki_text_poke_dead());
	atomic_store(&h4_stop, true);
	for (i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_join(t[i], NULL), 0);
	ck_assert(!atomic_load(&h4_wrong));
	ck_assert_uint_eq(stats().emulated, 0);
	ck_assert_uint_eq(stats().kicks, 0);
	/* No thread blocks SIGTRAP any more: the same batch goes through. */
	ck_assert_int_eq(pki_text_poke_batch(&q, 1), 0);
	ck_assert_int_eq(f_line(1, 1), 7);
	ck_assert_uint_ge(count(&count_a), 1);
}
END_TEST

/*
 * A sled whose default slot would cross a cache line takes the other (byte
 * 1 = clc), which changes byte 1 both ways: a core sync before byte 0 on,
 * and before byte 1 off.
 */
START_TEST(sled_relay_other_slot)
{
	static const uint8_t on_alt[PKI_SITE_LEN] = {0xe8, PKI_RELAY_B1_ALT, 0x90, 0x90, 0x90};
	unsigned long start, syncs = stats().syncs;
	struct pki_poke p = poke_to(fa_sled_alt, stub_a, NULL);

	ck_assert_uint_eq(p.addr & 63, 40);
	ck_assert(!pki_arch_store_window(pki_insn_relay_slot(p.addr, PKI_RELAY_B1),
					 PKI_RELAY_SLOT_LEN, &start));
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(syncs_since(&syncs), 2);
	ck_assert_mem_eq((void *)p.addr, on_alt, PKI_SITE_LEN);
	ck_assert_int_eq(f_sled_alt(1, 1), 10);
	ck_assert_uint_eq(count(&count_a), 1);
	memcpy(p.old, p.new, PKI_SITE_LEN);
	memcpy(p.new, pki_nop5, PKI_SITE_LEN);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(syncs_since(&syncs), 2);
	ck_assert_mem_eq((void *)p.addr, pki_nop1x5, PKI_SITE_LEN);
	ck_assert_int_eq(f_sled_alt(1, 1), 10);
	ck_assert_uint_eq(count(&count_a), 1);
	/* On again: the slot holds a ret, but byte 1 changes: the sync again. */
	memcpy(p.new, p.old, PKI_SITE_LEN);
	memcpy(p.old, pki_nop5, PKI_SITE_LEN);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(syncs_since(&syncs), 2);
	ck_assert_mem_eq((void *)p.addr, on_alt, PKI_SITE_LEN);
	ck_assert_int_eq(f_sled_alt(1, 1), 10);
	ck_assert_uint_eq(count(&count_a), 2);
	ck_assert_uint_eq(stats().relayed, 2);
	ck_assert_uint_eq(stats().emulated, 0);
}
END_TEST

/*
 * A relay chunk the program unmapped (ours, but its address space is the
 * program's to misuse): the next attach asks the kernel's map, finds no
 * chunk, and takes another protocol; the patcher never reads or writes
 * the hole.
 */
START_TEST(relay_chunk_unmapped_by_program)
{
	struct pki_poke p = poke_to(fa_sled, stub_a, NULL);
	unsigned long chunk = pki_insn_relay_slot(p.addr, PKI_RELAY_B1) & ~0xfffful;

	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(f_sled(1, 1), 5);
	memcpy(p.old, p.new, PKI_SITE_LEN);
	memcpy(p.new, pki_nop5, PKI_SITE_LEN);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(munmap((void *)chunk, 0x10000), 0);
	memcpy(p.new, p.old, PKI_SITE_LEN);
	memcpy(p.old, pki_nop5, PKI_SITE_LEN);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(f_sled(1, 1), 5);
	ck_assert_uint_eq(count(&count_a), 2);
	ck_assert(!pki_text_poke_dead());
}
END_TEST

/*
 * fa_sled_twin sits 0x68 bytes after fa_sled_alt: its default slot is
 * fa_sled_alt's other one.  Each must keep a slot of its own.
 */
START_TEST(sled_relay_slots_never_shared)
{
	struct pki_poke p[2] = {poke_to(fa_sled_alt, stub_a, NULL),
				poke_to(fa_sled_twin, stub_b, NULL)};

	ck_assert_uint_eq(site_of(fa_sled_twin) - site_of(fa_sled_alt), 0x68);
	ck_assert_uint_eq(pki_insn_relay_slot(p[0].addr, PKI_RELAY_B1_ALT),
			  pki_insn_relay_slot(p[1].addr, PKI_RELAY_B1));
	ck_assert_int_eq(pki_text_poke_batch(&p[0], 1), 0);
	ck_assert_int_eq(pki_text_poke_batch(&p[1], 1), 0);
	ck_assert_uint_eq(stats().relayed, 2);
	ck_assert_int_eq(f_sled_alt(1, 1), 10);
	ck_assert_int_eq(f_sled_twin(1, 1), 11);
	ck_assert_uint_eq(count(&count_a), 1);
	ck_assert_uint_eq(count(&count_b), 1);
}
END_TEST

/*
 * A batch whose relayed part would go in and whose other part is refused
 * writes nothing (reloc-sites.md, RS2f): the guard runs before the relay,
 * so the slot still holds the INT3 fill, no thread ever reached it.
 */
static atomic_bool rb_stop;

static void *rb_blocker(void *arg)
{
	sigset_t all;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, NULL);
	while (!atomic_load(&rb_stop))
		usleep(1000);
	return NULL;
}

START_TEST(relay_rollback_leaves_a_ret)
{
	struct pki_poke p[2] = {poke_to(fa_sled, stub_a, NULL), poke_to(fa_line, stub_b, NULL)};
	unsigned long slot = pki_insn_relay_slot(p[0].addr, PKI_RELAY_B1);
	pthread_t t;

	ck_assert_int_eq(pthread_create(&t, NULL, rb_blocker, NULL), 0);
	usleep(20000);
	ck_assert_int_eq(pki_text_poke_batch(p, 2), -EDEADLK);
	ck_assert_mem_eq((void *)p[0].addr, pki_nop1x5, PKI_SITE_LEN);
	ck_assert_mem_eq((void *)p[1].addr, pki_nop5, PKI_SITE_LEN);
	for (size_t i = 0; i < PKI_RELAY_SLOT_LEN; i++)
		ck_assert_uint_eq(((const uint8_t *)slot)[i], PKI_INSN_INT3);
	ck_assert(!pki_text_poke_dead());
	ck_assert_int_eq(f_sled(1, 1) + f_line(1, 1), 5 + 7);
	ck_assert_uint_eq(count(&count_a) + count(&count_b), 0);
	atomic_store(&rb_stop, true);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
}
END_TEST

/*
 * Detached from its relay, a site holds the sled while its caller says
 * nop5; if it then takes another protocol (here: relays off), that one
 * must verify against the sled, not latch patching off.
 */
START_TEST(relay_off_then_other_protocol)
{
	struct pki_poke p = poke_to(fa_sled, stub_a, NULL);

	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	memcpy(p.old, p.new, PKI_SITE_LEN);
	memcpy(p.new, pki_nop5, PKI_SITE_LEN);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_mem_eq((void *)p.addr, pki_nop1x5, PKI_SITE_LEN);
	pki_text_poke_disable = PKI_POKE_NO_RELAY;
	memcpy(p.old, pki_nop5, PKI_SITE_LEN);
	pki_insn_call(p.new, p.addr, (unsigned long)stub_b);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert(!pki_text_poke_dead());
	ck_assert_mem_eq((void *)p.addr, p.new, PKI_SITE_LEN);
	ck_assert_int_eq(f_sled(1, 1), 5);
	ck_assert_uint_eq(count(&count_b), 1);
}
END_TEST

/* The caller's bytes must match the relay's state: a wrong slot latches off. */
START_TEST(relay_slot_mismatch_latches_off)
{
	struct pki_poke p = poke_to(fa_sled, stub_a, NULL), q;

	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	q = p;
	memcpy(q.old, q.new, PKI_SITE_LEN);
	pki_insn_call(q.old, q.addr, (unsigned long)stub_b); /* not what the slot holds */
	memcpy(q.new, pki_nop5, PKI_SITE_LEN);
	ck_assert_int_eq(pki_text_poke_batch(&q, 1), -EILSEQ);
	ck_assert(pki_text_poke_dead());
	ck_assert_mem_eq((void *)p.addr, pki_relay_call, PKI_SITE_LEN);
	ck_assert_int_eq(f_sled(1, 1), 5);
	ck_assert_uint_eq(count(&count_a), 1);
}
END_TEST

/* PKI_POKE_NO_RELAY: the sled takes the INT3 protocol, and comes back as nop5. */
START_TEST(sled_without_relay_keeps_int3_then_nop5)
{
	uint8_t off[PKI_SITE_LEN];
	struct pki_poke p = poke_to(fa_sled, stub_a, NULL);

	pki_text_poke_disable = PKI_POKE_NO_RELAY;
	pki_insn_site_off(off, p.old);
	ck_assert_mem_eq(off, pki_nop5, PKI_SITE_LEN);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(stats().fast, 0);
	ck_assert_uint_eq(stats().relayed, 0);
	ck_assert_int_eq(f_sled(1, 1), 5);
	p = poke_to(fa_sled, NULL, off);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(stats().fast, 1);
	ck_assert_mem_eq((void *)p.addr, pki_nop5, PKI_SITE_LEN);
	ck_assert_uint_eq(count(&count_a), 1);
}
END_TEST

START_TEST(fast_failure_rolls_back)
{
	struct pki_poke p[2] = {poke_to(fa_aligned, stub_a, NULL),
				poke_to(fa_aligned2, stub_b, NULL)};

	pki_text_poke_hook = fail_hook;
	fail_at = PKI_POKE_AFTER_STORE;
	ck_assert_int_eq(pki_text_poke_batch(p, 2), -EIO);
	ck_assert_mem_eq((void *)p[0].addr, pki_nop5, PKI_SITE_LEN);
	ck_assert_mem_eq((void *)p[1].addr, pki_nop5, PKI_SITE_LEN);
	ck_assert(!pki_text_poke_dead());
	ck_assert_uint_eq(stats().fast, 0);
	ck_assert_int_eq(f_aligned(1, 1) + f_aligned2(1, 1), 5);
	ck_assert_uint_eq(count(&count_a) + count(&count_b), 0);

	ck_assert_int_eq(pki_text_poke_batch(p, 2), 0);
	ck_assert_int_eq(f_aligned(1, 1) + f_aligned2(1, 1), 5);
	ck_assert_uint_eq(count(&count_a) + count(&count_b), 2);
}
END_TEST

START_TEST(fast_mismatch_latches_off)
{
	struct pki_poke p = poke_to(fa_aligned, stub_a, NULL);

	p.old[4] = 0x08; /* clang's nop5: not what is there */
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), -EILSEQ);
	ck_assert(pki_text_poke_dead());
	ck_assert_mem_eq((void *)p.addr, pki_nop5, PKI_SITE_LEN);
	p = poke_to(fa_aligned, stub_a, NULL);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), -ECANCELED);
}
END_TEST

/*
 * A breakpoint somebody else put in the text (a debugger's or a uprobe's
 * INT3, written like ptrace does: a forced write through /proc/self/mem)
 * must not be copied into a memfd, where it would no longer be theirs.
 */
static void force_byte(unsigned long addr, uint8_t b)
{
	int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)addr), 1);
	close(fd);
}

START_TEST(foreign_int3_prevents_alias)
{
	unsigned long guard = (unsigned long)fa_guard + 1; /* never executed */
	struct pki_poke p = poke_to(fa_aligned, stub_a, NULL);

	force_byte(guard, 0xcc);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(stats().aliases, 0);
	ck_assert_uint_eq(stats().fast, 0);
	ck_assert_int_eq(f_aligned(1, 1), 2);
	ck_assert_uint_eq(count(&count_a), 1);

	/* Breakpoint gone: the next batch makes the alias. */
	force_byte(guard, 0x90);
	p = poke_to(fa_aligned, NULL, pki_nop5);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(stats().aliases, 1);
	ck_assert_uint_eq(stats().fast, 1);
	ck_assert_int_eq(f_aligned(1, 1), 2);
	ck_assert_uint_eq(count(&count_a), 1);
}
END_TEST

START_TEST(no_alias_falls_back)
{
	struct pki_poke p = poke_to(fa_aligned, stub_a, NULL);
	struct pki_maps maps;
	const struct pki_map *m;

	pki_text_poke_disable = PKI_POKE_NO_ALIAS;
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(stats().fast, 0);
	ck_assert_uint_eq(stats().aliases, 0);
	ck_assert_int_eq(f_aligned(1, 1), 2);
	ck_assert_uint_eq(count(&count_a), 1);
	ck_assert_int_eq(pki_maps_read(&maps), 0);
	m = pki_maps_find(&maps, p.addr);
	ck_assert_ptr_nonnull(m);
	ck_assert(!m->shared);
	ck_assert(!(m->prot & PROT_WRITE));
	pki_maps_free(&maps);
}
END_TEST

/* PROBEKIT_TEXT_ALIAS=0 (read at the first batch) keeps text on its file. */
START_TEST(env_disables_alias)
{
	struct pki_poke p = poke_to(fa_aligned, stub_a, NULL);
	struct pki_maps maps;
	const struct pki_map *m;

	ck_assert_int_eq(setenv("PROBEKIT_TEXT_ALIAS", "0", 1), 0);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_uint_eq(stats().aliases, 0);
	ck_assert_int_eq(f_aligned(1, 1), 2);
	ck_assert_uint_eq(count(&count_a), 1);
	ck_assert_int_eq(pki_maps_read(&maps), 0);
	m = pki_maps_find(&maps, p.addr);
	ck_assert_ptr_nonnull(m);
	ck_assert(!m->shared);
	pki_maps_free(&maps);
}
END_TEST

/* --- W^X, as the kernel reports it ----------------------------------------- */

START_TEST(wx_in_proc_maps)
{
	struct pki_poke p = poke_to(fa_aligned, stub_a, NULL);
	char line[4096], *name;
	unsigned long lo, hi, site = p.addr;
	int exec_view = 0, alias_view = 0;
	FILE *f;

	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	f = fopen("/proc/self/maps", "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		char perm[5];

		ck_assert_int_eq(sscanf(line, "%lx-%lx %4s", &lo, &hi, perm), 3);
		/* Nothing anywhere is writable and executable. */
		ck_assert_msg(!(perm[1] == 'w' && perm[2] == 'x'), "W+X: %s", line);
		name = strstr(line, "/memfd:probekit:");
		if (site >= lo && site < hi) {
			ck_assert_str_eq(perm, "r-xs");
			ck_assert_msg(name, "site mapping: %s", line);
			exec_view++;
		} else if (name) {
			ck_assert_str_eq(perm, "rw-s");
			alias_view++;
		}
	}
	fclose(f);
	ck_assert_int_eq(exec_view, 1);
	ck_assert_int_eq(alias_view, 1);
	ck_assert_int_eq(f_aligned(1, 1), 2);
}
END_TEST

/* --- fork ------------------------------------------------------------------ */

static void expect_call(unsigned long site, void (*stub)(void))
{
	uint8_t want[PKI_SITE_LEN];

	ck_assert_int_eq(pki_insn_call(want, site, (unsigned long)stub), 0);
	ck_assert_mem_eq((void *)site, want, PKI_SITE_LEN);
}

START_TEST(fork_parent_and_child_independent)
{
	struct pki_poke p = poke_to(fa_aligned, stub_a, NULL);
	int to_child[2], to_parent[2], status;
	char c = 0;
	pid_t pid;

	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(pipe(to_child), 0);
	ck_assert_int_eq(pipe(to_parent), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		/* Child: exit status says which check failed. */
		uint8_t call_a[PKI_SITE_LEN];

		close(to_child[1]);
		close(to_parent[0]);
		pki_insn_call(call_a, p.addr, (unsigned long)stub_a);
		if (memcmp((void *)p.addr, call_a, PKI_SITE_LEN) || f_aligned(2, 2) != 4 ||
		    count(&count_a) != 1)
			_exit(10);
		p = poke_to(fa_aligned, NULL, pki_nop5);
		if (pki_text_poke_batch(&p, 1))
			_exit(11);
		if (f_aligned(2, 2) != 4 || count(&count_a) != 1)
			_exit(12);
		if (write(to_parent[1], &c, 1) != 1 || read(to_child[0], &c, 1) != 1)
			_exit(13);
		/* The parent retargeted its site meanwhile: not ours. */
		if (memcmp((void *)p.addr, pki_nop5, PKI_SITE_LEN) || f_aligned(2, 2) != 4 ||
		    count(&count_a) != 1 || count(&count_b) != 0)
			_exit(14);
		_exit(0);
	}
	close(to_child[0]);
	close(to_parent[1]);
	if (read(to_parent[0], &c, 1) != 1) {
		ck_assert_int_eq(waitpid(pid, &status, 0), pid);
		ck_abort_msg("child died early: status %#x", status);
	}
	/* The child put its nop back: the parent still calls stub_a. */
	expect_call(p.addr, stub_a);
	ck_assert_int_eq(f_aligned(2, 2), 4);
	ck_assert_uint_eq(count(&count_a), 1); /* the child's call was its own */
	p = poke_to(fa_aligned, stub_b, NULL);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(write(to_child[1], &c, 1), 1);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status));
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	expect_call(p.addr, stub_b);
	ck_assert_int_eq(f_aligned(2, 2), 4);
	ck_assert_uint_eq(count(&count_b), 1);
	ck_assert(!pki_text_poke_dead());
	ck_assert_uint_eq(stats().aliases, 1);
}
END_TEST

/* --- dlclose --------------------------------------------------------------- */

/*
 * A counting stub within rel32 reach of @near (a library far from this
 * program's text): movabs $count_a, %rax; lock incq (%rax); ret.  %rax is
 * free at a function entry (not variadic).
 */
static void (*stub_near(unsigned long near))(void)
{
	uint8_t code[] = {0x48, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0x48, 0xff, 0x00, 0xc3};
	unsigned long try, where = (unsigned long)&count_a;
	void *page = MAP_FAILED;

	memcpy(code + 2, &where, 8);
	for (try = 1; try < 512 && page == MAP_FAILED; try++) {
		unsigned long hint = ((near & ~0xffffful) - try * 0x100000ul);

		page = mmap((void *)hint, 4096, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	}
	ck_assert_ptr_ne(page, MAP_FAILED);
	memcpy(page, code, sizeof(code));
	ck_assert_int_eq(mprotect(page, 4096, PROT_READ | PROT_EXEC), 0);
	return (void (*)(void))page;
}

START_TEST(dlclose_of_patched_library)
{
	int (*one)(int);
	struct pki_poke p;
	unsigned long old_site;
	void *h;
	int round;

	for (round = 0; round < 2; round++) {
		h = dlopen(PKT_DL_PATH, RTLD_NOW | RTLD_LOCAL);
		ck_assert_msg(h, "dlopen: %s", dlerror());
		one = (int (*)(int))dlsym(h, "pkt_dl_one");
		ck_assert_ptr_nonnull(one);
		/* A fresh copy of the library: the file's own sled, unpatched. */
		p = poke_to((void *)one, stub_near((unsigned long)one), NULL);
		ck_assert_mem_eq(p.old, pki_nop1x5, PKI_SITE_LEN);
		ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
		ck_assert_int_eq(one(1), 2);
		ck_assert_uint_eq(count(&count_a), (unsigned long)round + 1);
		old_site = p.addr;
		ck_assert_int_eq(dlclose(h), 0);
		/* Unmapped now (unless something else moved in): refused, no crash. */
		if (!dlopen(PKT_DL_PATH, RTLD_NOW | RTLD_NOLOAD)) {
			struct pki_maps maps;
			bool mapped;

			ck_assert_int_eq(pki_maps_read(&maps), 0);
			mapped = pki_maps_find(&maps, old_site);
			pki_maps_free(&maps);
			if (!mapped) {
				p = (struct pki_poke){.addr = old_site};
				memcpy(p.old, pki_nop5, PKI_SITE_LEN);
				memcpy(p.new, pki_nop5, PKI_SITE_LEN);
				ck_assert_int_eq(pki_text_poke_batch(&p, 1), -EINVAL);
			}
		}
	}
	ck_assert(!pki_text_poke_dead());
	/* The stale alias of the first copy was dropped for the second one. */
	ck_assert_uint_le(stats().aliases, 2);
	ck_assert_int_eq(f_aligned(1, 1), 2);
}
END_TEST

/*
 * fork() after dlclose() of a patched library: its alias is stale, and the
 * parent's fork handler must not map the old text back over what now lives
 * in that range (here a page of ours with a marker; in a program, the next
 * library the loader put there).
 */
START_TEST(fork_after_dlclose_leaves_range_alone)
{
	unsigned long page_addr;
	int (*one)(int);
	struct pki_poke p;
	uint8_t *page;
	pid_t pid;
	void *h;
	int st;

	h = dlopen(PKT_DL_PATH, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(h, "dlopen: %s", dlerror());
	one = (int (*)(int))dlsym(h, "pkt_dl_one");
	ck_assert_ptr_nonnull(one);
	p = poke_to((void *)one, stub_near((unsigned long)one), NULL);
	ck_assert_int_eq(pki_text_poke_batch(&p, 1), 0);
	ck_assert_int_eq(one(1), 2);
	page_addr = (unsigned long)one & ~4095ul;
	ck_assert_int_eq(dlclose(h), 0);
	page = mmap((void *)page_addr, 4096, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (page == MAP_FAILED) {
		/* Still mapped (something else holds the library): nothing to check. */
		ck_assert(dlopen(PKT_DL_PATH, RTLD_NOW | RTLD_NOLOAD) || errno == EEXIST);
		return;
	}
	memset(page, 0x5a, 4096);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(page[0] == 0x5a ? 0 : 1);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	ck_assert_msg(page[0] == 0x5a && page[4095] == 0x5a,
		      "the parent's page at %#lx was replaced at fork", page_addr);
	ck_assert(!pki_text_poke_dead());
	munmap(page, 4096);
}
END_TEST

/* --- threads hammering a site flipped 100,000 times -------------------------- */

#define WORKERS 4
#define FLIPS	100000

static atomic_bool stop, wrong;
static unsigned long calls[WORKERS];

static void *worker(void *arg)
{
	long id = (long)arg, i;
	unsigned long n = 0;

	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		for (i = 0; i < 64; i++) {
			if (f_aligned(i, 1) != i + 1 || f_straddle(i, 1) != i + 3 ||
			    f_sled(i, 1) != i + 4 || f_line(i, 1) != i + 6)
				atomic_store(&wrong, true);
		}
		n += 4 * 64;
	}
	calls[id] = n;
	return NULL;
}

START_TEST(stress_flip_under_fire)
{
	unsigned long total = 0, hits, fast_before;
	struct pki_poke_stats st;
	pthread_t t[WORKERS];
	uint8_t sled_off[PKI_SITE_LEN];
	long i;

	pki_insn_site_off(sled_off, pki_nop1x5);
	for (i = 0; i < WORKERS; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, worker, (void *)i), 0);
	fast_before = stats().fast;
	for (i = 0; i < FLIPS; i++) {
		/* attach (alternating stubs), detach; every other pair lazy */
		unsigned int flags = i & 2 ? PKI_POKE_LAZY : 0;
		struct pki_poke p = poke_to(fa_aligned, i & 1 ? stub_b : stub_a, NULL);

		ck_assert_int_eq(pki_text_poke_batch_flags(&p, 1, flags), 0);
		p = poke_to(fa_aligned, NULL, pki_nop5);
		ck_assert_int_eq(pki_text_poke_batch_flags(&p, 1, flags), 0);
		if (i % 500 == 0) {
			/* Batches in between: the straddling site (one store), the
			 * sled (its relay) and a line-crossing site (INT3). */
			struct pki_poke q[3] = {poke_to(fa_straddle, stub_a, NULL),
						poke_to(fa_sled, stub_b, NULL),
						poke_to(fa_line, stub_a, NULL)};

			ck_assert_int_eq(pki_text_poke_batch(q, 3), 0);
			q[0] = poke_to(fa_straddle, NULL, pki_nop5);
			q[1] = poke_to(fa_sled, NULL, i % 1000 ? sled_off : pki_nop1x5);
			q[2] = poke_to(fa_line, NULL, pki_nop5);
			ck_assert_int_eq(pki_text_poke_batch(q, 3), 0);
		}
	}
	atomic_store(&stop, true);
	for (i = 0; i < WORKERS; i++) {
		ck_assert_int_eq(pthread_join(t[i], NULL), 0);
		total += calls[i];
	}
	ck_assert(!atomic_load(&wrong));
	ck_assert(!pki_text_poke_dead());
	ck_assert_int_eq(pki_text_sync(), 0);
	hits = count(&count_a) + count(&count_b);
	ck_assert_uint_le(hits, total);
	/* Detached: no stub runs any more. */
	ck_assert_int_eq(f_aligned(1, 1) + f_straddle(1, 1) + f_sled(1, 1) + f_line(1, 1),
			 2 + 4 + 5 + 7);
	ck_assert_mem_eq((void *)site_of(fa_sled), pki_nop1x5, PKI_SITE_LEN);
	ck_assert_uint_eq(count(&count_a) + count(&count_b), hits);
	ck_assert_mem_eq((void *)site_of(fa_aligned), pki_nop5, PKI_SITE_LEN);
	st = stats();
	/* Every nop5 <-> call flip took the single-store path. */
	ck_assert_uint_ge(st.fast - fast_before, 2 * FLIPS);
	printf("stress: %d flips, %lu calls, %lu stub hits, %lu fast batches, %lu emulated, "
	       "%lu restarted, %lu sled moves\n",
	       FLIPS, total, hits, st.fast, st.emulated, st.restarted, st.sled_moves);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("patch_fast");
	TCase *tc = tcase_create("fast");
	TCase *stress = tcase_create("stress");

	pk_test_require_membarrier_sync_core();
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, fast_path_for_aligned_nop5);
	tcase_add_test(tc, fast_path_after_endbr64);
	tcase_add_test(tc, straddling_block_takes_one_store);
	tcase_add_test(tc, line_crossing_site_keeps_int3);
	tcase_add_test(tc, sled_takes_its_relay);
	tcase_add_test(tc, relay_slot_mismatch_latches_off);
	tcase_add_test(tc, sled_relay_other_slot);
	tcase_add_test(tc, sled_relay_slots_never_shared);
	tcase_add_test(tc, relay_chunk_unmapped_by_program);
	tcase_add_test(tc, relay_rollback_leaves_a_ret);
	tcase_add_test(tc, relay_off_then_other_protocol);
	tcase_add_test(tc, sled_attached_under_long_handler);
	tcase_add_test(tc, sigtrap_blocked_threads_never_meet_a_trap);
	tcase_add_test(tc, sled_without_relay_keeps_int3_then_nop5);
	tcase_add_test(tc, fast_failure_rolls_back);
	tcase_add_test(tc, fast_mismatch_latches_off);
	tcase_add_test(tc, no_alias_falls_back);
	tcase_add_test(tc, env_disables_alias);
	tcase_add_test(tc, foreign_int3_prevents_alias);
	tcase_add_test(tc, wx_in_proc_maps);
	tcase_add_test(tc, fork_parent_and_child_independent);
	tcase_add_test(tc, dlclose_of_patched_library);
	tcase_add_test(tc, fork_after_dlclose_leaves_range_alone);
	suite_add_tcase(s, tc);

	tcase_add_checked_fixture(stress, setup, NULL);
	tcase_set_timeout(stress, 120);
	tcase_add_test(stress, stress_flip_under_fire);
	suite_add_tcase(s, stress);
	return pk_test_run(s);
}
