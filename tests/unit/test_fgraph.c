// SPDX-License-Identifier: MIT
/*
 * Exit tracing behind the vector-free trampolines, in process: a
 * PK_OPS_F_NOVEC ops records the entry and hijacks the return; the return
 * trampoline (which keeps every general register) records the exit.  Results in
 * rax and xmm0 and the vector arguments must arrive intact, every call must
 * leave an entry and an exit event, and the shadow stack must be empty
 * again afterwards.  Both clocks: the monotonic one reaches the vDSO through
 * the vector-saving thunk on every event; the first event of the thread
 * (buffer and shadow stack allocation) goes through it with either.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <probekit/hook.h>

#include "fgraph_hook.h"
#include "harness.h"
#include "hook_fixture.h"
#include "trace/fgraph.h"
#include "trace/format.h"
#include "trace/trace.h"

static void run(int clock)
{
	PK_OPTS(pki_trace_opts, o, .clock = clock, .buf_events = 4096, .no_drainer = true,
		.program = "test-fgraph");
	char path[] = "/tmp/pkfgraph-test-XXXXXX";
	PK_OPTS(pk_ops, ops, .func = fgraph_test_hook, .flags = PK_OPS_F_NOVEC,
		.filter = PK_OPTS_INIT(
		    pk_ops_filter,
		    .ips = (unsigned long[]){(unsigned long)fx_mix, (unsigned long)fx_funcs[1]},
		    .nips = 2));
	struct pki_trace_counts c;
	int fd = mkstemp(path);

	ck_assert_int_ge(fd, 0);
	close(fd);
	fx_install();
	ck_assert_int_eq(pki_fgraph_init(), 0);
	ck_assert_int_eq(pki_trace_open(path, &o), 0);
	ck_assert_int_eq(pk_ops_register(&ops), 0);
	for (int i = 0; i < 100; i++) {
		ck_assert(fx_mix(1.5, i, 0.25) == 1.5 * i + 0.25); /* xmm0 result, xmm args */
		ck_assert_int_eq(fx_funcs[1](1, 2, 3, 4, 5, i), 1 + 4 + 9 + 16 + 25 + 6 * i + 1);
	}
	ck_assert_uint_eq(pki_fgraph_tls.depth, 0);
	ck_assert_int_eq(pk_ops_unregister(&ops), 0);
	ck_assert_int_eq(pki_trace_flush(), 0);
	pki_trace_counts(&c);
	ck_assert_uint_eq(c.recorded, 400); /* 200 calls: entry + exit each */
	ck_assert_uint_eq(c.lost, 0);
	ck_assert_int_eq(pki_trace_close(), 0);
	unlink(path);
}

/*
 * What a caller built with -fipa-ra may keep across a call (rettramp.S):
 * fg_keep() loads a sentinel into every caller-saved general register but
 * rax, calls fg_leaf() (which writes only rax) and returns the mask of those
 * that changed.  Traced, the return goes through the return trampoline,
 * whose C may write any of them: it must put all back.  (The way in takes
 * r11: fg_leaf is a patchable site, whose entry may, since gcc compiles no
 * -fipa-ra code around a patchable entry; a relocated site's entry keeps it,
 * test_hook_reloc.)
 */
__attribute__((noinline, patchable_function_entry(5))) long fg_leaf(void)
{
	return 42;
}

long fg_keep(void);
__asm__(".text\n"
	".type fg_keep, @function\n"
	"fg_keep:\n"
	"	sub $8, %rsp\n"
	"	mov $0x1111, %rcx\n"
	"	mov $0x2222, %rdx\n"
	"	mov $0x3333, %rsi\n"
	"	mov $0x4444, %rdi\n"
	"	mov $0x5555, %r8\n"
	"	mov $0x6666, %r9\n"
	"	mov $0x7777, %r10\n"
	"	mov $0x8888, %r11\n"
	"	call fg_leaf\n"
	"	xor %eax, %eax\n"
	"	cmp $0x1111, %rcx; je 1f; or $0x01, %eax; 1:\n"
	"	cmp $0x2222, %rdx; je 1f; or $0x02, %eax; 1:\n"
	"	cmp $0x3333, %rsi; je 1f; or $0x04, %eax; 1:\n"
	"	cmp $0x4444, %rdi; je 1f; or $0x08, %eax; 1:\n"
	"	cmp $0x5555, %r8;  je 1f; or $0x10, %eax; 1:\n"
	"	cmp $0x6666, %r9;  je 1f; or $0x20, %eax; 1:\n"
	"	cmp $0x7777, %r10; je 1f; or $0x40, %eax; 1:\n"
	"	cmp $0x8888, %r11; je 1f; or $0x80, %eax; 1:\n"
	"	add $8, %rsp\n"
	"	ret\n"
	".size fg_keep, .-fg_keep\n");

START_TEST(exits_keep_every_register)
{
#ifdef __SANITIZE_THREAD__
	/*
	 * fg_leaf is in this program's own text, which a patch batch replaces
	 * with an alias mapping (patch/alias.c): TSan's mmap interceptor faults
	 * on shadow for such a MAP_FIXED over the executable.  The other builds
	 * run it.
	 */
	printf("exits_keep_every_register: not under TSan\n");
	return;
#endif

	PK_OPTS(pki_trace_opts, o, .clock = PKI_CLOCK_MONOTONIC, .buf_events = 4096,
		.no_drainer = true, .program = "test-fgraph");
	char path[] = "/tmp/pkfgraph-test-XXXXXX";
	PK_OPTS(pk_ops, ops, .func = fgraph_test_hook, .flags = PK_OPS_F_NOVEC,
		.filter = PK_OPTS_INIT(
		    pk_ops_filter, .ips = (unsigned long[]){(unsigned long)fg_leaf}, .nips = 1));
	struct pki_trace_counts c;
	int fd = mkstemp(path);

	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(pki_fgraph_init(), 0);
	ck_assert_int_eq(pki_trace_open(path, &o), 0);
	ck_assert_int_eq(pk_ops_register(&ops), 0);
	for (int i = 0; i < 10; i++)
		ck_assert_int_eq(fg_keep() & ~0x80, 0);
	ck_assert_int_eq(pk_ops_unregister(&ops), 0);
	ck_assert_int_eq(pki_trace_flush(), 0);
	pki_trace_counts(&c);
	ck_assert_uint_eq(c.recorded, 20); /* it was traced: 10 entries, 10 exits */
	ck_assert_int_eq(pki_trace_close(), 0);
	unlink(path);
}
END_TEST

/*
 * pki_vecsafe_call() keeps the whole vector state (vecsafe.S): vs_probe()
 * puts a pattern in all of ymm1 and ymm8, calls @fn through @saver, and
 * stores both back; vs_clobber() writes them and clears the upper halves, as
 * libc's AVX code does.
 */
void vs_probe(void *saver, void *fn, const void *pattern, void *out);
__asm__(".text\n"
	".type vs_probe, @function\n"
	"vs_probe:\n" /* saver(1, 2, 3, fn), ymm1 and ymm8 = *pattern around it */
	"	push %rbx\n"
	"	push %r12\n"
	"	sub $8, %rsp\n"
	"	mov %rcx, %rbx\n"
	"	mov %rdi, %r12\n"
	"	vmovdqu (%rdx), %ymm1\n"
	"	vmovdqu (%rdx), %ymm8\n"
	"	mov %rsi, %rcx\n"
	"	mov $1, %edi\n"
	"	mov $2, %esi\n"
	"	mov $3, %edx\n"
	"	call *%r12\n"
	"	vmovdqu %ymm1, (%rbx)\n"
	"	vmovdqu %ymm8, 32(%rbx)\n"
	"	vzeroupper\n"
	"	add $8, %rsp\n"
	"	pop %r12\n"
	"	pop %rbx\n"
	"	ret\n"
	".size vs_probe, .-vs_probe\n");

/* Legacy-SSE writes of xmm1 and xmm8 (as the vDSO's code would make). */
static unsigned long vs_clobber_sse(unsigned long a, unsigned long b, unsigned long c)
{
	__asm__ volatile("pcmpeqd %%xmm1, %%xmm1\n\t"
			 "pcmpeqd %%xmm8, %%xmm8" ::
			     : "xmm1", "xmm8");
	return a + b + c;
}

static unsigned long vs_clobber(unsigned long a, unsigned long b, unsigned long c)
{
	__asm__ volatile("vpcmpeqd %%ymm1, %%ymm1, %%ymm1\n\t"
			 "vpcmpeqd %%ymm8, %%ymm8, %%ymm8\n\t"
			 "vzeroupper" ::
			     : "xmm1", "xmm8");
	return a + b + c;
}

START_TEST(slowcall_keeps_vector_state)
{
	uint8_t pattern[32], out[64];

	if (!__builtin_cpu_supports("avx")) {
		printf("no AVX: not checked\n");
		return;
	}
	for (int i = 0; i < 32; i++)
		pattern[i] = (uint8_t)(i * 7 + 1);
	vs_probe((void *)pki_vecsafe_call, (void *)vs_clobber, pattern, out);
	ck_assert_int_eq(memcmp(out, pattern, 32), 0);
	ck_assert_int_eq(memcmp(out + 32, pattern, 32), 0);
	memset(out, 0, sizeof(out));
	vs_probe((void *)pki_vecsafe_call_sse, (void *)vs_clobber_sse, pattern, out);
	ck_assert_int_eq(memcmp(out, pattern, 32), 0);
	ck_assert_int_eq(memcmp(out + 32, pattern, 32), 0);
}
END_TEST

START_TEST(exits_monotonic)
{
	run(PKI_CLOCK_MONOTONIC);
}
END_TEST

START_TEST(exits_best_clock)
{
	run(0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("fgraph");
	TCase *tc = tcase_create("novec");

	tcase_add_test(tc, exits_monotonic);
	tcase_add_test(tc, exits_best_clock);
	tcase_add_test(tc, exits_keep_every_register);
	tcase_add_test(tc, slowcall_keeps_vector_state);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return pk_test_run(suite());
}
