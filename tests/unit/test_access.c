// SPDX-License-Identifier: MIT
/*
 * The redirected step (arch/x86_64/access.h), for real: each instruction of
 * tests/unit/access_insns.S runs twice at the same addresses, once on plain memory
 * (the reference) and once with its page watched: mapped PROT_NONE, its
 * memfd's pages also reachable through an alias.  The watched run goes through
 * SIGSEGV -> pki_access_decode/begin -> the copy -> SIGTRAP -> pki_access_end,
 * as the watch manager will, and must end with the same registers (general,
 * flags, %ymm0-15) and the same memory as the reference; the page is never
 * unprotected.  A genuine fault of the other operand goes through
 * pki_access_abort and must leave what the reference's own fault leaves.
 * Then -ERANGE, the refusals and the decoded fields.
 */
#include <check.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <Zydis/Zydis.h>

#include "arch/x86_64/access.h"
#include "harness.h"

#define PG 4096ul
/*
 * The area, below 2 GiB (absolute disp32 operands reach it): pages 0-2 the
 * region (U0, W the watched page, U1), 3 a hole that always faults, 8 the
 * snippet (RX view), 9 the copies (RX view).
 */
#define AREA	  0x50000000ul
#define AREA_PGS  12
#define REGION	  AREA
#define W	  (REGION + PG)
#define U1	  (REGION + 2 * PG)
#define HOLE	  (REGION + 3 * PG)
#define SNIP_RX	  (AREA + 8 * PG)
#define CODE_RX	  (AREA + 9 * PG)
#define REGION_SZ (3 * PG)

/* pkt_cpu, as tests/unit/access_insns.S lays it out. */
struct pkt_cpu {
	uint64_t r[16]; /* Zydis order: rax rcx rdx rbx rsp rbp rsi rdi r8..r15 */
	uint64_t flags;
	uint8_t ymm[16][32];
} __attribute__((packed));

void pkt_run(struct pkt_cpu *cpu, const void *snippet);
void pkt_run_back(void);

enum { RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8, R9, R10, R11, R12, R13, R14, R15 };
static const int gidx[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP,
			     REG_RSI, REG_RDI, REG_R8,	REG_R9,	 REG_R10, REG_R11,
			     REG_R12, REG_R13, REG_R14, REG_R15};

#define CF	  0x001u
#define ZF	  0x040u
#define DF	  0x400u
#define FLAGS_CMP 0xcd5u /* CF PF AF ZF SF OF DF */

/* A register's initial value: plain, an address in the region, or 8 bytes read there. */
enum { VAL = 1, ADDR, MEMV };
struct regset {
	uint8_t reg, kind;
	uint64_t v;
};
#define V(r, x)                                                                                    \
	{                                                                                          \
		r, VAL, (uint64_t)(x)                                                              \
	}
#define A(r, off)                                                                                  \
	{                                                                                          \
		r, ADDR, (uint64_t)(off)                                                           \
	}
#define M(r, off)                                                                                  \
	{                                                                                          \
		r, MEMV, (uint64_t)(off)                                                           \
	}
/* Offsets in the region. */
#define OW(x)  (PG + (x))
#define OU0(x) (x)
#define OU1(x) (2 * PG + (x))

enum expect {
	EXP_SAME,    /* as the reference, redirected at least once */
	EXP_ABORT,   /* a genuine fault after the copy's: as the reference's fault */
	EXP_ERANGE,  /* begin refuses */
	EXP_NOTSUPP, /* decode refuses */
};

struct tcase {
	const char *name;
	const uint8_t *start, *end;
	struct regset set[6];
	uint64_t flags;
	long target; /* region offset a disp/moffs is patched to reach, or -1 */
	enum expect expect;
	bool unbounded;	 /* unmoved accesses unbounded (else kept in their page) */
	unsigned clamps; /* rep steps whose count begin clamps */
};

#define SYM(n) extern const uint8_t pkt_i_##n[], pkt_i_##n##_end[];
// clang-format off
#define INSNS(X) \
	X(mov_load) \
	X(mov_load_self) \
	X(mov_store_self8) \
	X(add_store_self) \
	X(mov_load_sib_r8) \
	X(mov_store_r12) \
	X(mov_load32) \
	X(mov_store_imm32) \
	X(mov_store_imm64) \
	X(mov_load16_r10) \
	X(mov_store_ah) \
	X(mov_load_dh) \
	X(movzbl_self_r11) \
	X(movswq) \
	X(movslq_sib) \
	X(movsbw_r14) \
	X(cmovne_taken) \
	X(cmove_not_taken) \
	X(rip_load) \
	X(rip_store) \
	X(rip_add_imm) \
	X(abs_load) \
	X(moffs_load) \
	X(addr32_load) \
	X(addr32_sib) \
	X(add_load_r14) \
	X(sub_imm_store) \
	X(neg_mem) \
	X(inc_r15) \
	X(not_mem16) \
	X(shl_cl) \
	X(rol_imm16) \
	X(cmp_mem) \
	X(test_imm8) \
	X(imul_load) \
	X(mul_mem) \
	X(lock_add) \
	X(lock_xadd) \
	X(xchg_mem) \
	X(lock_cmpxchg) \
	X(lock_cmpxchg16b) \
	X(lock_cmpxchg8b) \
	X(setne_r8) \
	X(bt_imm) \
	X(bts_reg) \
	X(btr_reg_neg) \
	X(btc_reg32) \
	X(bt_reg16) \
	X(fnstcw) \
	X(movdqu_load) \
	X(movups_store) \
	X(movaps_load) \
	X(movq_load) \
	X(movd_store) \
	X(pinsrw) \
	X(pextrb_r8) \
	X(paddd_xmm8) \
	X(movsd_sse) \
	X(vmovdqu_load) \
	X(vmovdqu_store_r13) \
	X(vpaddd_load) \
	X(vbroadcastss) \
	X(vmaskmovps_store) \
	X(vpmaskmovd_load) \
	X(vmovdqu_rip) \
	X(movsb) \
	X(movsq) \
	X(stosq) \
	X(lodsl) \
	X(scasb) \
	X(cmpsq) \
	X(rep_movsb) \
	X(rep_movsq) \
	X(rep_stosq) \
	X(rep_stosb) \
	X(repe_cmpsb) \
	X(repne_scasb) \
	X(rep_lodsw) \
	X(push_mem) \
	X(pop_mem) \
	X(call_mem) \
	X(jmp_mem) \
	X(gather) \
	X(xsave) \
	X(xrstor) \
	X(fxsave) \
	X(enter) \
	X(leave) \
	X(xlat) \
	X(fs_load) \
	X(gs_abs) \
	X(addr32_movsb) \
	X(insb) \
	X(maskmovdqu) \
	X(movdir64b) \
	X(bndldx) \
	X(lea) \
	X(lea_rip) \
	X(nopw) \
	X(prefetch) \
	X(ud2)
// clang-format on
INSNS(SYM)

#define I(n) #n, pkt_i_##n, pkt_i_##n##_end
#define NOT  -1

static const struct tcase cases[] = {
    /* Plain moves; the base register also the destination or the source. */
    {I(mov_load), {A(RAX, OW(0x100))}, 0, NOT, EXP_SAME, false, 0},
    {I(mov_load_self), {A(RAX, OW(0x108))}, 0, NOT, EXP_SAME, false, 0},
    {I(mov_store_self8), {A(RAX, OW(0x10))}, 0, NOT, EXP_SAME, false, 0},
    {I(add_store_self), {A(RAX, OW(0x18))}, 0, NOT, EXP_SAME, false, 0},
    {I(mov_load_sib_r8), {A(R8, OW(0x100)), V(R15, 3)}, 0, NOT, EXP_SAME, false, 0},
    {I(mov_store_r12), {A(R12, OW(0x200))}, 0, NOT, EXP_SAME, false, 0},
    {I(mov_load32), {A(RCX, OW(0xffc - 4))}, 0, NOT, EXP_SAME, false, 0},
    {I(mov_store_imm32), {A(RDX, OW(0))}, 0, NOT, EXP_SAME, false, 0},
    {I(mov_store_imm64), {A(RSI, OW(0x300))}, 0, NOT, EXP_SAME, false, 0},
    {I(mov_load16_r10), {A(RDI, OW(0x301))}, 0, NOT, EXP_SAME, false, 0},
    {I(mov_store_ah), {A(RBX, OW(0x40)), V(RAX, 0xabcd)}, 0, NOT, EXP_SAME, false, 0},
    {I(mov_load_dh), {A(RCX, OW(0x41))}, 0, NOT, EXP_SAME, false, 0},
    {I(movzbl_self_r11), {A(R11, OW(0x77))}, 0, NOT, EXP_SAME, false, 0},
    {I(movswq), {A(RAX, OW(0x80))}, 0, NOT, EXP_SAME, false, 0},
    {I(movslq_sib), {A(RBX, OW(0x80)), V(RCX, 5)}, 0, NOT, EXP_SAME, false, 0},
    {I(movsbw_r14), {A(R14, OW(0x90))}, 0, NOT, EXP_SAME, false, 0},
    {I(cmovne_taken), {A(RAX, OW(0xa0))}, 0, NOT, EXP_SAME, false, 0},
    {I(cmove_not_taken), {A(RAX, OW(0xa0))}, 0, NOT, EXP_SAME, false, 0},
    {I(rip_load), {V(RAX, 0)}, 0, OW(0x180), EXP_SAME, false, 0},
    {I(rip_store), {V(RBX, 0x55667788)}, 0, OW(0x184), EXP_SAME, false, 0},
    {I(rip_add_imm), {V(RAX, 0)}, 0, OW(0x188), EXP_SAME, false, 0},
    {I(abs_load), {V(RAX, 0)}, 0, OW(0x190), EXP_SAME, false, 0},
    {I(moffs_load), {V(RAX, 0)}, 0, OW(0x197), EXP_SAME, false, 0},
    {I(addr32_load), {V(RAX, 0xdead000000000000ull | (W + 0x200))}, 0, NOT, EXP_SAME, false, 0},
    {I(addr32_sib),
     {V(RAX, 0xffffffff00000000ull | (W + 0x200)), V(RCX, 0x1234500000010ull)},
     0,
     NOT,
     EXP_SAME,
     false,
     0},
    /* Arithmetic with memory, locked read-modify-writes, bit tests, setcc. */
    {I(add_load_r14), {A(RSI, OW(0x400))}, 0, NOT, EXP_SAME, false, 0},
    {I(sub_imm_store), {A(R9, OW(0x404))}, 0, NOT, EXP_SAME, false, 0},
    {I(neg_mem), {A(RAX, OW(0x408))}, 0, NOT, EXP_SAME, false, 0},
    {I(inc_r15), {A(R15, OW(0x410))}, 0, NOT, EXP_SAME, false, 0},
    {I(not_mem16), {A(RBX, OW(0x410))}, 0, NOT, EXP_SAME, false, 0},
    {I(shl_cl), {A(RAX, OW(0x418)), V(RCX, 13)}, 0, NOT, EXP_SAME, false, 0},
    {I(rol_imm16), {A(RBX, OW(0x420))}, 0, NOT, EXP_SAME, false, 0},
    {I(cmp_mem), {A(RBX, OW(0x428)), M(RAX, OW(0x428))}, 0, NOT, EXP_SAME, false, 0},
    {I(test_imm8), {A(RCX, OW(0x431))}, 0, NOT, EXP_SAME, false, 0},
    {I(imul_load), {A(RAX, OW(0x438))}, 0, NOT, EXP_SAME, false, 0},
    {I(mul_mem), {A(RBX, OW(0x440)), V(RAX, 0x123456789)}, 0, NOT, EXP_SAME, false, 0},
    {I(lock_add), {A(RDI, OW(0x448))}, 0, NOT, EXP_SAME, false, 0},
    {I(lock_xadd), {A(RBX, OW(0x450))}, 0, NOT, EXP_SAME, false, 0},
    {I(xchg_mem), {A(RDX, OW(0x458))}, 0, NOT, EXP_SAME, false, 0},
    {I(lock_cmpxchg), {A(RCX, OW(0x460)), M(RAX, OW(0x460))}, 0, NOT, EXP_SAME, false, 0},
    {I(lock_cmpxchg), {A(RCX, OW(0x460)), V(RAX, 1)}, 0, NOT, EXP_SAME, false, 0},
    {I(lock_cmpxchg16b),
     {A(RSI, OW(0x470)), M(RAX, OW(0x470)), M(RDX, OW(0x478))},
     0,
     NOT,
     EXP_SAME,
     false,
     0},
    {I(lock_cmpxchg16b), {A(RSI, OW(0x470))}, 0, NOT, EXP_SAME, false, 0},
    {I(lock_cmpxchg8b), {A(RDI, OW(0x480)), V(RAX, 0), V(RDX, 0)}, 0, NOT, EXP_SAME, false, 0},
    {I(setne_r8), {A(R8, OW(0x488))}, 0, NOT, EXP_SAME, false, 0},
    {I(bt_imm), {A(RAX, OW(0x490))}, 0, NOT, EXP_SAME, false, 0},
    {I(bts_reg), {A(RAX, OW(0x490)), V(RCX, 77)}, 0, NOT, EXP_SAME, false, 0},
    {I(btr_reg_neg), {A(R10, OW(0x4a0)), V(RDX, -100)}, 0, NOT, EXP_SAME, false, 0},
    {I(btc_reg32), {A(RBX, OW(0x4b0)), V(RCX, 0xffffffff00000021ull)}, 0, NOT, EXP_SAME, false, 0},
    {I(bt_reg16), {A(RDI, OW(0x4c0)), V(RSI, 0x1234fff0)}, 0, NOT, EXP_SAME, false, 0},
    {I(fnstcw), {A(RAX, OW(0x4d0))}, 0, NOT, EXP_SAME, false, 0},
    /* SSE and AVX. */
    {I(movdqu_load), {A(RAX, OW(0x501))}, 0, NOT, EXP_SAME, false, 0},
    {I(movups_store), {A(RBX, OW(0x513))}, 0, NOT, EXP_SAME, false, 0},
    {I(movaps_load), {A(RCX, OW(0x520))}, 0, NOT, EXP_SAME, false, 0},
    {I(movq_load), {A(RDX, OW(0x530))}, 0, NOT, EXP_SAME, false, 0},
    {I(movd_store), {A(RSI, OW(0x538))}, 0, NOT, EXP_SAME, false, 0},
    {I(pinsrw), {A(RDI, OW(0x540))}, 0, NOT, EXP_SAME, false, 0},
    {I(pextrb_r8), {A(R8, OW(0x548))}, 0, NOT, EXP_SAME, false, 0},
    {I(paddd_xmm8), {A(R9, OW(0x550))}, 0, NOT, EXP_SAME, false, 0},
    {I(movsd_sse), {A(RAX, OW(0x560))}, 0, NOT, EXP_SAME, false, 0},
    {I(vmovdqu_load), {A(RAX, OW(0x571))}, 0, NOT, EXP_SAME, false, 0},
    {I(vmovdqu_store_r13), {A(R13, OW(0xfe0))}, 0, NOT, EXP_SAME, false, 0},
    {I(vpaddd_load), {A(RBX, OW(0x5a0))}, 0, NOT, EXP_SAME, false, 0},
    {I(vbroadcastss), {A(RCX, OW(0x5c4))}, 0, NOT, EXP_SAME, false, 0},
    {I(vmaskmovps_store), {A(RDX, OW(0x5e0))}, 0, NOT, EXP_SAME, false, 0},
    {I(vpmaskmovd_load), {A(RAX, OW(0x600))}, 0, NOT, EXP_SAME, false, 0},
    {I(vmovdqu_rip), {V(RAX, 0)}, 0, OW(0x620), EXP_SAME, false, 0},
    /* String instructions, one or both operands moved. */
    {I(movsb), {A(RSI, OW(0x700)), A(RDI, OU1(0x10))}, 0, NOT, EXP_SAME, false, 0},
    {I(movsq), {A(RSI, OW(0x708)), A(RDI, OW(0x800))}, 0, NOT, EXP_SAME, false, 0},
    {I(movsq), {A(RSI, OU0(0x708)), A(RDI, OW(0x800))}, DF, NOT, EXP_SAME, false, 0},
    {I(stosq), {A(RDI, OW(0x810)), V(RAX, 0x1122334455667788)}, 0, NOT, EXP_SAME, false, 0},
    {I(lodsl), {A(RSI, OW(0x820))}, DF, NOT, EXP_SAME, false, 0},
    {I(scasb), {A(RDI, OW(0x830))}, 0, NOT, EXP_SAME, false, 0},
    {I(cmpsq), {A(RSI, OW(0x840)), A(RDI, OW(0x840))}, 0, NOT, EXP_SAME, false, 0},
    /* rep: into W from U0 (clamped to W, resumed natively in U1). */
    {I(rep_movsb), {A(RSI, OU0(0x10)), A(RDI, OW(PG - 5)), V(RCX, 20)}, 0, NOT, EXP_SAME, false, 1},
    /* Both in W, the destination leaves first, then the source. */
    {I(rep_movsb), {A(RSI, OW(4000)), A(RDI, OW(4050)), V(RCX, 200)}, 0, NOT, EXP_SAME, false, 2},
    /* Downwards from W into U0. */
    {I(rep_movsq), {A(RSI, OW(0x40)), A(RDI, OU1(0x200)), V(RCX, 20)}, DF, NOT, EXP_SAME, false, 1},
    {I(rep_stosq), {A(RDI, OW(PG - 24)), V(RCX, 10), V(RAX, -2)}, 0, NOT, EXP_SAME, false, 1},
    {I(rep_stosq), {A(RDI, OU0(PG - 16)), V(RCX, 600), V(RAX, 7)}, 0, NOT, EXP_SAME, false, 1},
    {I(rep_stosb), {A(RDI, OW(0x10)), V(RCX, 5), V(RAX, 0x41)}, 0, NOT, EXP_SAME, false, 0},
    {I(repe_cmpsb), {A(RSI, OW(4090)), A(RDI, OW(4090)), V(RCX, 30)}, 0, NOT, EXP_SAME, false, 1},
    {I(repe_cmpsb),
     {A(RSI, OW(0x100)), A(RDI, OU1(0x100)), V(RCX, 30)},
     0,
     NOT,
     EXP_SAME,
     false,
     0},
    {I(repne_scasb), {A(RDI, OW(4000)), V(RCX, 300), V(RAX, 0x100)}, 0, NOT, EXP_SAME, false, 1},
    {I(rep_lodsw), {A(RSI, OW(PG - 6)), V(RCX, 9)}, 0, NOT, EXP_SAME, false, 1},
    /* The other operand faults for real: aborted, the fault as the program's own. */
    {I(movsq), {A(RSI, OW(0x900)), A(RDI, 3 * PG + 8)}, 0, NOT, EXP_ABORT, true, 0},
    {I(rep_movsb), {A(RSI, OW(0x900)), A(RDI, 3 * PG - 3), V(RCX, 10)}, 0, NOT, EXP_ABORT, true, 0},
    {I(mov_load), {A(RAX, 3 * PG + 0x10)}, 0, NOT, EXP_ABORT, false, 0},
    /* Out of the alias's bounds: -ERANGE. */
    {I(mov_load), {A(RAX, OW(PG - 4))}, 0, NOT, EXP_ERANGE, false, 0},
    {I(mov_load), {A(RAX, OW(-4))}, 0, NOT, EXP_ERANGE, false, 0},
    {I(movsq), {A(RSI, OW(PG - 4)), A(RDI, OU1(0))}, 0, NOT, EXP_ERANGE, false, 0},
    {I(vmovdqu_load), {A(RAX, OW(PG - 16))}, 0, NOT, EXP_ERANGE, false, 0},
    /* Refused when met for real. */
    {I(push_mem), {A(RAX, OW(0))}, 0, NOT, EXP_NOTSUPP, false, 0},
    {I(fxsave), {A(RAX, OW(0))}, 0, NOT, EXP_NOTSUPP, false, 0},
    {I(xlat), {A(RBX, OW(0)), V(RAX, 3)}, 0, NOT, EXP_NOTSUPP, false, 0},
};

/* The state a run ends in. */
struct outcome {
	bool faulted; /* a genuine fault ended it (registers at the fault) */
	int ret;      /* EXP_ERANGE/NOTSUPP: what decode/begin returned */
	struct pkt_cpu cpu;
	uint64_t rip;
	uint8_t mem[REGION_SZ];
};

static uint8_t *snip_rw, *code_rw, *alias;
static struct outcome out;
static struct pkt_cpu cpu;
static sigjmp_buf env;
static volatile int mode; /* 0 the reference, 1 watched */
static struct pki_access_undo undo;
static unsigned nbegin, nend, nabort, nclamp;
static bool in_copy, bad_trap;
static const struct tcase *tc;

static uint8_t pattern(unsigned long i)
{
	return (uint8_t)(i * 7 + (i >> 8) * 13 + (i >> 5) + 3);
}

static void fill(uint8_t *p)
{
	for (unsigned long i = 0; i < REGION_SZ; i++)
		p[i] = pattern(i);
}

static void record_fault(const ucontext_t *uc)
{
	out.faulted = true;
	for (int i = 0; i < 16; i++)
		out.cpu.r[i] = (uint64_t)uc->uc_mcontext.gregs[gidx[i]];
	out.cpu.r[RSP] = 0;
	out.cpu.flags = (uint64_t)uc->uc_mcontext.gregs[REG_EFL];
	out.rip = (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
}

static void on_segv(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;
	uintptr_t addr = (uintptr_t)si->si_addr, rip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
	struct pki_access_insn ai;
	intptr_t delta[2] = {0, 0};
	uintptr_t lo[2] = {0, 0}, hi[2] = {0, 0};
	int ret;

	(void)sig;
	if (!mode) {
		record_fault(uc);
		siglongjmp(env, 1);
	}
	if (rip >= CODE_RX && rip < CODE_RX + PG) { /* the copy faulted */
		pki_access_abort(uc, &undo);
		nabort++;
		in_copy = false;
		record_fault(uc);
		siglongjmp(env, 1);
	}
	if (addr < W || addr >= W + PG) { /* not the watched page */
		record_fault(uc);
		siglongjmp(env, 1);
	}
	ret = pki_access_decode(uc, &ai);
	if (ret) {
		out.ret = ret;
		siglongjmp(env, 1);
	}
	for (unsigned i = 0; i < ai.nacc; i++) {
		uintptr_t a = ai.acc[i].addr, page = a & ~(PG - 1);

		if (a + ai.acc[i].size > W && a < W + PG) {
			delta[i] = (intptr_t)((uintptr_t)alias - REGION);
			lo[i] = (uintptr_t)alias + PG;
			hi[i] = lo[i] + PG;
		} else if (!tc->unbounded && page >= REGION && page < W + 2 * PG) {
			lo[i] = page;
			hi[i] = page + PG;
		}
	}
	ret = pki_access_begin(uc, &ai, delta, lo, hi, code_rw, CODE_RX, &undo);
	if (ret) {
		out.ret = ret;
		siglongjmp(env, 1);
	}
	nbegin++;
	nclamp += undo.iters < undo.rcx;
	in_copy = true;
}

static void on_trap(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;

	(void)sig;
	(void)si;
	if (!in_copy || !pki_access_at_end(uc, &undo)) {
		bad_trap = true;
		siglongjmp(env, 1);
	}
	pki_access_end(uc, &undo);
	in_copy = false;
	nend++;
}

/* A double mapping of one memfd page at @rx (RX) and somewhere (RW). */
static uint8_t *double_map(uintptr_t rx)
{
	int fd = memfd_create("pkt_code", 0);
	void *rw, *x;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, PG), 0);
	rw = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	x = mmap((void *)rx, PG, PROT_READ | PROT_EXEC, MAP_SHARED | MAP_FIXED, fd, 0);
	ck_assert_ptr_ne(rw, MAP_FAILED);
	ck_assert_ptr_eq(x, (void *)rx);
	close(fd);
	return rw;
}

static void setup_area(void)
{
	struct sigaction sa = {.sa_flags = SA_SIGINFO};
	void *p = mmap((void *)AREA, AREA_PGS * PG, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);

	ck_assert_ptr_eq(p, (void *)AREA);
	snip_rw = double_map(SNIP_RX);
	code_rw = double_map(CODE_RX);
	sigemptyset(&sa.sa_mask);
	sa.sa_sigaction = on_segv;
	ck_assert_int_eq(sigaction(SIGSEGV, &sa, NULL), 0);
	sa.sa_sigaction = on_trap;
	ck_assert_int_eq(sigaction(SIGTRAP, &sa, NULL), 0);
}

/* The snippet: the instruction (its disp aimed at tc->target) and a jmp back to pkt_run. */
static void make_snippet(const struct tcase *t)
{
	size_t len = (size_t)(t->end - t->start);
	uint64_t back = (uint64_t)(uintptr_t)pkt_run_back;
	static const uint8_t jmp[6] = {0xff, 0x25, 0, 0, 0, 0};

	memcpy(snip_rw, t->start, len);
	if (t->target != NOT) {
		ZydisDecoder dec;
		ZydisDecodedInstruction in;
		ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
		uint64_t to = REGION + (uint64_t)t->target;

		ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
		ck_assert(ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, snip_rw, len, &in, ops)));
		ck_assert(in.raw.disp.size == 32 || in.raw.disp.size == 64);
		if (in.attributes & ZYDIS_ATTRIB_IS_RELATIVE) {
			int32_t d = (int32_t)(to - (SNIP_RX + len));

			memcpy(snip_rw + in.raw.disp.offset, &d, 4);
		} else {
			memcpy(snip_rw + in.raw.disp.offset, &to, in.raw.disp.size / 8);
		}
	}
	memcpy(snip_rw + len, jmp, sizeof(jmp));
	memcpy(snip_rw + len + sizeof(jmp), &back, 8);
}

static void init_cpu(const struct tcase *t, const uint8_t *mem)
{
	memset(&cpu, 0, sizeof(cpu));
	for (int i = 0; i < 16; i++)
		cpu.r[i] = 0x0101010101010101ull * (uint64_t)(i + 1) ^ 0x8040201008040201ull;
	for (int i = 0; i < 16; i++)
		for (int j = 0; j < 32; j++)
			cpu.ymm[i][j] = (uint8_t)(i * 37 + j * 11 + (j & 4 ? 0x80 : 0));
	cpu.flags = 0x202 | t->flags;
	for (int i = 0; i < 6 && t->set[i].kind; i++) {
		const struct regset *s = &t->set[i];

		if (s->kind == ADDR)
			cpu.r[s->reg] = REGION + s->v;
		else if (s->kind == MEMV)
			memcpy(&cpu.r[s->reg], mem + s->v, 8);
		else
			cpu.r[s->reg] = s->v;
	}
}

static void run(const struct tcase *t, uint8_t *mem, int m)
{
	memset(&out, 0, sizeof(out));
	mode = m;
	tc = t;
	init_cpu(t, mem);
	if (!sigsetjmp(env, 1)) {
		pkt_run(&cpu, (const void *)SNIP_RX);
		out.cpu = cpu;
		out.rip = 0;
	}
	out.cpu.r[RSP] = 0;
	memcpy(out.mem, mem, REGION_SZ);
}

/* Map the region plain (reference) or watched (W PROT_NONE, memfd, alias). */
static uint8_t *map_region(bool watched)
{
	void *p;

	if (!watched) {
		p = mmap((void *)REGION, REGION_SZ, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		ck_assert_ptr_eq(p, (void *)REGION);
		fill(p);
		return p;
	}
	int fd = memfd_create("pkt_watched", 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, REGION_SZ), 0);
	alias = mmap(NULL, REGION_SZ, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(alias, MAP_FAILED);
	fill(alias);
	p = mmap((void *)REGION, REGION_SZ, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
	ck_assert_ptr_eq(p, (void *)REGION);
	ck_assert_int_eq(mprotect((void *)W, PG, PROT_NONE), 0);
	close(fd);
	return alias;
}

static void dump_diff(const struct outcome *a, const struct outcome *b)
{
	for (int i = 0; i < 16; i++)
		if (a->cpu.r[i] != b->cpu.r[i])
			fprintf(stderr, "  r%d: ref %#lx watched %#lx\n", i,
				(unsigned long)a->cpu.r[i], (unsigned long)b->cpu.r[i]);
	if ((a->cpu.flags ^ b->cpu.flags) & FLAGS_CMP)
		fprintf(stderr, "  flags: ref %#lx watched %#lx\n", (unsigned long)a->cpu.flags,
			(unsigned long)b->cpu.flags);
	for (int i = 0; i < 16; i++)
		if (memcmp(a->cpu.ymm[i], b->cpu.ymm[i], 32))
			fprintf(stderr, "  ymm%d differs\n", i);
	for (unsigned long i = 0; i < REGION_SZ; i++)
		if (a->mem[i] != b->mem[i]) {
			fprintf(stderr, "  mem +%#lx: ref %#x watched %#x\n", i, a->mem[i],
				b->mem[i]);
			break;
		}
}

START_TEST(redirect)
{
	const struct tcase *t = &cases[_i];
	static struct outcome ref;

	setup_area();
	make_snippet(t);
	run(t, map_region(false), 0);
	ref = out;
	nbegin = nend = nabort = nclamp = 0;
	run(t, map_region(true), 1);
	ck_assert_msg(!bad_trap, "%s: a SIGTRAP not at the copy's end", t->name);
	switch (t->expect) {
	case EXP_ERANGE:
	case EXP_NOTSUPP:
		ck_assert_msg(out.ret == (t->expect == EXP_ERANGE ? -ERANGE : -EOPNOTSUPP),
			      "%s: ret %d", t->name, out.ret);
		return;
	case EXP_ABORT:
		ck_assert_msg(ref.faulted && out.faulted, "%s: no fault (ref %d, watched %d)",
			      t->name, ref.faulted, out.faulted);
		ck_assert_uint_eq(ref.rip, out.rip);
		break;
	case EXP_SAME:
		ck_assert_msg(!ref.faulted && !out.faulted && !out.ret,
			      "%s: ref faulted %d, watched faulted %d ret %d", t->name, ref.faulted,
			      out.faulted, out.ret);
		ck_assert_msg(nbegin >= 1 && nend == nbegin, "%s: %u redirected, %u ended", t->name,
			      nbegin, nend);
		ck_assert_msg(nclamp == t->clamps, "%s: %u steps clamped, not %u", t->name, nclamp,
			      t->clamps);
		break;
	}
	if (memcmp(ref.cpu.r, out.cpu.r, sizeof(ref.cpu.r)) ||
	    ((ref.cpu.flags ^ out.cpu.flags) & FLAGS_CMP) ||
	    (!ref.faulted && memcmp(ref.cpu.ymm, out.cpu.ymm, sizeof(ref.cpu.ymm))) ||
	    memcmp(ref.mem, out.mem, REGION_SZ)) {
		fprintf(stderr, "%s (case %d) differs:\n", t->name, _i);
		dump_diff(&ref, &out);
		ck_abort_msg("%s: watched run differs from the reference", t->name);
	}
	if (t->expect == EXP_ABORT && nbegin)
		ck_assert_uint_eq(nabort, 1);
}
END_TEST

/* A context stopped at @code with registers @set (ADDR: the value itself). */
static void ctx_at(ucontext_t *uc, const uint8_t *code, const struct regset *set, unsigned n,
		   uint64_t flags)
{
	memset(uc, 0, sizeof(*uc));
	for (int i = 0; i < 16; i++)
		uc->uc_mcontext.gregs[gidx[i]] = (greg_t)(0x1000ull * (uint64_t)(i + 1));
	for (unsigned i = 0; i < n; i++)
		uc->uc_mcontext.gregs[gidx[set[i].reg]] = (greg_t)set[i].v;
	uc->uc_mcontext.gregs[REG_RIP] = (greg_t)(uintptr_t)code;
	uc->uc_mcontext.gregs[REG_EFL] = (greg_t)(0x202 | flags);
}

#define X 0x7f0000001000ull

static void check_acc(const struct pki_access *a, uintptr_t addr, uint32_t size, bool r, bool w,
		      int dir)
{
	ck_assert_uint_eq(a->addr, addr);
	ck_assert_uint_eq(a->size, size);
	ck_assert_int_eq(a->read, r);
	ck_assert_int_eq(a->write, w);
	ck_assert_int_eq(a->dir, dir);
}

START_TEST(decode_fields)
{
	struct pki_access_insn ai;
	ucontext_t uc;

	ctx_at(&uc, pkt_i_add_store_self, (struct regset[]){V(RAX, X)}, 1, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert_uint_eq(ai.len, 3);
	ck_assert_uint_eq(ai.nacc, 1);
	ck_assert(!ai.rep);
	check_acc(&ai.acc[0], X, 8, true, true, 0);

	ctx_at(&uc, pkt_i_mov_load_sib_r8, (struct regset[]){V(R8, X), V(R15, 3)}, 2, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	check_acc(&ai.acc[0], X + 0x10 + 24, 8, true, false, 0);

	ctx_at(&uc, pkt_i_vmovdqu_load, (struct regset[]){V(RAX, X)}, 1, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	check_acc(&ai.acc[0], X, 32, true, false, 0);

	ctx_at(&uc, pkt_i_vmovdqu_store_r13, (struct regset[]){V(R13, X)}, 1, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	check_acc(&ai.acc[0], X, 32, false, true, 0);

	ctx_at(&uc, pkt_i_movsd_sse, (struct regset[]){V(RAX, X)}, 1,
	       0); /* not movsd the string op */
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert_uint_eq(ai.nacc, 1);
	check_acc(&ai.acc[0], X, 8, true, false, 0);

	ctx_at(&uc, pkt_i_setne_r8, (struct regset[]){V(R8, X)}, 1, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	check_acc(&ai.acc[0], X, 1, false, true, 0);

	ctx_at(&uc, pkt_i_cmp_mem, (struct regset[]){V(RBX, X)}, 1, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	check_acc(&ai.acc[0], X, 8, true, false, 0);

	ctx_at(&uc, pkt_i_lock_cmpxchg16b, (struct regset[]){V(RSI, X)}, 1, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert_uint_eq(ai.acc[0].size, 16);
	ck_assert(ai.acc[0].read && ai.acc[0].write);

	ctx_at(&uc, pkt_i_fnstcw, (struct regset[]){V(RAX, X)}, 1, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	check_acc(&ai.acc[0], X, 2, false, true, 0);

	/* bt family: an immediate offset stays in the operand, a register one may not. */
	ctx_at(&uc, pkt_i_bt_imm, (struct regset[]){V(RAX, X)}, 1, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	check_acc(&ai.acc[0], X, 4, true, false, 0);
	ctx_at(&uc, pkt_i_bts_reg, (struct regset[]){V(RAX, X), V(RCX, 77)}, 2, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	check_acc(&ai.acc[0], X + 8, 8, true, true, 0);
	ctx_at(&uc, pkt_i_btr_reg_neg, (struct regset[]){V(R10, X), V(RDX, -100)}, 2, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert_uint_eq(ai.acc[0].addr, X - 16);
	ctx_at(&uc, pkt_i_btr_reg_neg, (struct regset[]){V(R10, X), V(RDX, -64)}, 2, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert_uint_eq(ai.acc[0].addr, X - 8);
	ctx_at(&uc, pkt_i_btc_reg32, (struct regset[]){V(RBX, X), V(RCX, 0xffffffff00000021ull)}, 2,
	       0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	check_acc(&ai.acc[0], X + 4, 4, true, true, 0);
	ctx_at(&uc, pkt_i_bt_reg16, (struct regset[]){V(RDI, X), V(RSI, 0x1234fff0)}, 2, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	check_acc(&ai.acc[0], X + 2 - 2, 2, true, false, 0);

	/* RIP-relative (after the instruction), absolute, 32-bit addresses. */
	ctx_at(&uc, pkt_i_rip_load, NULL, 0, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert_uint_eq(ai.acc[0].addr, (uintptr_t)pkt_i_rip_load + 7 + 0x11223344);
	ctx_at(&uc, pkt_i_moffs_load, NULL, 0, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	check_acc(&ai.acc[0], 0x1122334455667788ull, 1, true, false, 0);
	ctx_at(&uc, pkt_i_addr32_sib,
	       (struct regset[]){V(RAX, 0xffffffff00000000ull | 0xfffffff0), V(RCX, 0x100000010)},
	       2, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert_uint_eq(ai.acc[0].addr, (uint32_t)(0xfffffff0u + 8 + 0x20));

	/* String instructions: both operands, the direction, rep. */
	ctx_at(&uc, pkt_i_movsq, (struct regset[]){V(RSI, X), V(RDI, X + 0x100)}, 2, DF);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert_uint_eq(ai.nacc, 2);
	ck_assert(!ai.rep);
	for (int i = 0; i < 2; i++)
		check_acc(&ai.acc[i], ai.acc[i].write ? X + 0x100 : X, 8, !ai.acc[i].write,
			  ai.acc[i].write, -1);
	ck_assert(ai.acc[0].write != ai.acc[1].write);
	ctx_at(&uc, pkt_i_repe_cmpsb, (struct regset[]){V(RSI, X), V(RDI, X + 0x100)}, 2, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert(ai.rep);
	ck_assert_uint_eq(ai.nacc, 2);
	check_acc(&ai.acc[0], ai.acc[0].addr, 1, true, false, 1);
	check_acc(&ai.acc[1], ai.acc[1].addr, 1, true, false, 1);
	ctx_at(&uc, pkt_i_rep_stosq, (struct regset[]){V(RDI, X)}, 1, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert(ai.rep);
	ck_assert_uint_eq(ai.nacc, 1);
	check_acc(&ai.acc[0], X, 8, false, true, 1);
}
END_TEST

/* Refused, or no access at all. */
START_TEST(decode_refused)
{
	static const struct {
		const char *name;
		const uint8_t *code;
		int ret;
	} t[] = {
	    {"push_mem", pkt_i_push_mem, -EOPNOTSUPP},
	    {"pop_mem", pkt_i_pop_mem, -EOPNOTSUPP},
	    {"gather", pkt_i_gather, -EOPNOTSUPP},
	    {"xsave", pkt_i_xsave, -EOPNOTSUPP},
	    {"xrstor", pkt_i_xrstor, -EOPNOTSUPP},
	    {"fxsave", pkt_i_fxsave, -EOPNOTSUPP},
	    {"enter", pkt_i_enter, -EOPNOTSUPP},
	    {"leave", pkt_i_leave, -EOPNOTSUPP},
	    {"xlat", pkt_i_xlat, -EOPNOTSUPP},
	    {"fs_load", pkt_i_fs_load, -EOPNOTSUPP},
	    {"gs_abs", pkt_i_gs_abs, -EOPNOTSUPP},
	    {"addr32_movsb", pkt_i_addr32_movsb, -EOPNOTSUPP},
	    {"insb", pkt_i_insb, -EOPNOTSUPP},
	    {"maskmovdqu", pkt_i_maskmovdqu, -EOPNOTSUPP},
	    {"movdir64b", pkt_i_movdir64b, -EOPNOTSUPP},
	    {"bndldx", pkt_i_bndldx, -EOPNOTSUPP},
	    {"lea", pkt_i_lea, 0},
	    {"lea_rip", pkt_i_lea_rip, 0},
	    {"nopw", pkt_i_nopw, 0},
	    {"prefetch", pkt_i_prefetch, 0},
	    {"ud2", pkt_i_ud2, 0},
	};
	static const uint8_t invalid[] = {0x06, 0x90}; /* push %es: not in 64-bit mode */
	struct pki_access_insn ai;
	struct pki_access_undo undo_;
	intptr_t delta[2] = {0x1000, 0};
	uintptr_t lo[2] = {0, 0}, hi[2] = {UINTPTR_MAX, 0};
	uint8_t code[PKI_ACCESS_CODE_MAX];
	ucontext_t uc;

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		ctx_at(&uc, t[i].code, (struct regset[]){V(RAX, X), V(RBX, X)}, 2, 0);
		ck_assert_msg(pki_access_decode(&uc, &ai) == t[i].ret, "%s", t[i].name);
		if (t[i].ret)
			continue;
		ck_assert_msg(ai.nacc == 0, "%s: %u accesses", t[i].name, ai.nacc);
		ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, 0, &undo_),
				 -EINVAL);
	}
	ctx_at(&uc, invalid, NULL, 0, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), -EINVAL);
}
END_TEST

/* begin/end/abort on contexts alone: the copy, the borrowed register, rep bookkeeping. */
START_TEST(begin_end_abort)
{
	struct pki_access_insn ai;
	struct pki_access_undo u;
	intptr_t delta[2] = {0x100000, 0x100000};
	uintptr_t lo[2] = {X + 0x100000, X + 0x100000}, hi[2] = {X + 0x101000, X + 0x101000};
	uintptr_t nolo[2] = {0, 0}, nohi[2] = {0, 0};
	uint8_t code[PKI_ACCESS_CODE_MAX];
	const uintptr_t at = 0x600000;
	ucontext_t uc, before;
	ZydisDecoder dec;
	ZydisDecodedInstruction in;
	ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
	greg_t *g = uc.uc_mcontext.gregs;

	ZydisDecoderInit(&dec, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);

	/* A RIP-relative load: the copy is position-independent, [R] = the moved address. */
	ctx_at(&uc, pkt_i_rip_load, NULL, 0, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	delta[0] = 0x100000;
	lo[0] = ai.acc[0].addr + 0x100000;
	hi[0] = lo[0] + 8;
	before = uc;
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, at, &u), 0);
	ck_assert_uint_eq((uintptr_t)g[REG_RIP], at);
	ck_assert(ZYAN_SUCCESS(ZydisDecoderDecodeFull(&dec, code, sizeof(code), &in, ops)));
	ck_assert_int_eq(in.mnemonic, ZYDIS_MNEMONIC_MOV);
	ck_assert(!(in.attributes & ZYDIS_ATTRIB_IS_RELATIVE));
	ck_assert_int_eq(ops[1].type, ZYDIS_OPERAND_TYPE_MEMORY);
	ck_assert_int_eq(ops[1].mem.index, ZYDIS_REGISTER_NONE);
	ck_assert_int_eq(ops[1].mem.disp.value, 0);
	ck_assert_int_ge(u.reg, 0);
	ck_assert_uint_eq((uintptr_t)g[u.reg], ai.acc[0].addr + 0x100000);
	ck_assert_uint_eq(code[in.length], 0xcc);
	ck_assert_uint_eq(u.trap_rip, at + in.length + 1);
	/* Aborted: exactly as before. */
	pki_access_abort(&uc, &u);
	ck_assert_mem_eq(uc.uc_mcontext.gregs, before.uc_mcontext.gregs, sizeof(gregset_t));
	/* Ended: the register back, after the instruction. */
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, at, &u), 0);
	g[REG_RIP] = (greg_t)u.trap_rip;
	g[REG_RAX] = 42;
	ck_assert(pki_access_at_end(&uc, &u));
	pki_access_end(&uc, &u);
	ck_assert_uint_eq((uintptr_t)g[REG_RIP], (uintptr_t)pkt_i_rip_load + 7);
	ck_assert_uint_eq((uintptr_t)g[u.reg], (uintptr_t)before.uc_mcontext.gregs[u.reg]);
	ck_assert_int_eq(g[REG_RAX], 42);
	/* One byte short of the bounds: -ERANGE, the context untouched. */
	hi[0] = lo[0] + 7;
	uc = before;
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, at, &u), -ERANGE);
	ck_assert_mem_eq(uc.uc_mcontext.gregs, before.uc_mcontext.gregs, sizeof(gregset_t));
	/* Moved but unbounded: -EINVAL. */
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, nolo, nohi, code, at, &u), -EINVAL);

	/* %ah in the instruction: the borrowed register needs no REX prefix. */
	ctx_at(&uc, pkt_i_mov_store_ah, (struct regset[]){V(RBX, X)}, 1, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	lo[0] = X + 0x100000;
	hi[0] = lo[0] + PG;
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, at, &u), 0);
	ck_assert(u.reg == REG_RDI || u.reg == REG_RSI || u.reg == REG_RDX || u.reg == REG_RCX ||
		  u.reg == REG_RBP);

	/* rep movsb, 100 iterations of which 16 fit: clamped, then resumed. */
	ctx_at(&uc, pkt_i_rep_movsb,
	       (struct regset[]){V(RSI, X + PG - 16), V(RDI, X + 0x200), V(RCX, 100)}, 3, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	for (int i = 0; i < 2; i++) {
		lo[i] = X + 0x100000;
		hi[i] = lo[i] + PG;
	}
	before = uc;
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, at, &u), 0);
	ck_assert_int_eq(g[REG_RCX], 16);
	ck_assert_uint_eq((uintptr_t)g[REG_RSI], X + PG - 16 + 0x100000);
	ck_assert_uint_eq((uintptr_t)g[REG_RDI], X + 0x200 + 0x100000);
	ck_assert_mem_eq(code, pkt_i_rep_movsb, 2);
	/* The copy stopped after 5 (a genuine fault): abort keeps those 5. */
	g[REG_RSI] += 5, g[REG_RDI] += 5, g[REG_RCX] -= 5;
	pki_access_abort(&uc, &u);
	ck_assert_int_eq(g[REG_RCX], 95);
	ck_assert_uint_eq((uintptr_t)g[REG_RSI], X + PG - 16 + 5);
	ck_assert_uint_eq((uintptr_t)g[REG_RDI], X + 0x200 + 5);
	ck_assert_uint_eq((uintptr_t)g[REG_RIP], (uintptr_t)pkt_i_rep_movsb);
	/* The copy ran its 16: back to the instruction with 84 left. */
	uc = before;
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, at, &u), 0);
	g[REG_RSI] += 16, g[REG_RDI] += 16, g[REG_RCX] = 0, g[REG_RIP] = (greg_t)u.trap_rip;
	pki_access_end(&uc, &u);
	ck_assert_int_eq(g[REG_RCX], 84);
	ck_assert_uint_eq((uintptr_t)g[REG_RSI], X + PG);
	ck_assert_uint_eq((uintptr_t)g[REG_RIP], (uintptr_t)pkt_i_rep_movsb);
	/* A count of zero cannot have faulted. */
	uc = before;
	g[REG_RCX] = 0;
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, at, &u), -EINVAL);

	/* repe cmpsb: the clamped run ending on a difference ends the instruction. */
	ctx_at(&uc, pkt_i_repe_cmpsb, (struct regset[]){V(RSI, X + PG - 4), V(RDI, X), V(RCX, 9)},
	       3, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, at, &u), 0);
	ck_assert_int_eq(g[REG_RCX], 4);
	g[REG_RSI] += 4, g[REG_RDI] += 4, g[REG_RCX] = 0, g[REG_RIP] = (greg_t)u.trap_rip;
	g[REG_EFL] &= ~(greg_t)ZF; /* the 4th differed */
	pki_access_end(&uc, &u);
	ck_assert_int_eq(g[REG_RCX], 5);
	ck_assert_uint_eq((uintptr_t)g[REG_RIP], (uintptr_t)pkt_i_repe_cmpsb + 2);
	/* ... and one whose copy stopped early keeps its count. */
	ctx_at(&uc, pkt_i_repe_cmpsb, (struct regset[]){V(RSI, X + PG - 4), V(RDI, X), V(RCX, 9)},
	       3, 0);
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, at, &u), 0);
	g[REG_RCX] = 2, g[REG_RIP] = (greg_t)u.trap_rip;
	pki_access_end(&uc, &u);
	ck_assert_int_eq(g[REG_RCX], 7);
	ck_assert_uint_eq((uintptr_t)g[REG_RIP], (uintptr_t)pkt_i_repe_cmpsb + 2);

	/* The first iteration already out of bounds (downwards): -ERANGE. */
	ctx_at(&uc, pkt_i_rep_stosq, (struct regset[]){V(RDI, X + 4), V(RCX, 3)}, 1, DF);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	lo[0] = X + 0x100000 + 8;
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, at, &u), -ERANGE);
	lo[0] = X + 0x100000; /* the first fits, the second (X - 4) not */
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, at, &u), 0);
	ck_assert_int_eq(g[REG_RCX], 1);
	ctx_at(&uc, pkt_i_rep_stosq, (struct regset[]){V(RDI, X + 16), V(RCX, 3)}, 1, DF);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, at, &u), 0);
	ck_assert_int_eq(g[REG_RCX], 3); /* 16, 8, 0: all three fit */
}
END_TEST

/*
 * jmp *(%rax) and call *(%rax): decoded as branches reading their pointer,
 * done on the context (RIP from the pointer given; a call pushes the
 * return address), refused by begin, and the call refused under a shadow
 * stack.
 */
START_TEST(branch_emulated)
{
	uint64_t stack[4] = {0}, target = 0x12345678abcull;
	struct pki_access_insn ai;
	struct pki_access_undo undo_;
	intptr_t delta[2] = {0x1000, 0};
	uintptr_t lo[2] = {0, 0}, hi[2] = {UINTPTR_MAX, 0};
	uint8_t code[PKI_ACCESS_CODE_MAX];
	ucontext_t uc;

	ctx_at(&uc, pkt_i_jmp_mem, (struct regset[]){V(RAX, X + 0x40)}, 1, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert_int_eq(ai.branch, PKI_ACCESS_JMP);
	ck_assert_int_eq(ai.nacc, 1);
	check_acc(&ai.acc[0], X + 0x40, 8, true, false, 0);
	ck_assert_int_eq(pki_access_begin(&uc, &ai, delta, lo, hi, code, 0, &undo_), -EINVAL);
	ck_assert_int_eq(pki_access_branch(&uc, &ai, &target, false), 0);
	ck_assert_uint_eq((uint64_t)uc.uc_mcontext.gregs[REG_RIP], target);

	ctx_at(&uc, pkt_i_call_mem,
	       (struct regset[]){V(RAX, X + 0x40), V(RSP, (uintptr_t)&stack[3])}, 2, 0);
	ck_assert_int_eq(pki_access_decode(&uc, &ai), 0);
	ck_assert_int_eq(ai.branch, PKI_ACCESS_CALL);
	ck_assert_int_eq(pki_access_branch(&uc, &ai, &target, true), -EOPNOTSUPP);
	ck_assert_uint_eq((uint64_t)uc.uc_mcontext.gregs[REG_RIP], (uintptr_t)pkt_i_call_mem);
	ck_assert_int_eq(pki_access_branch(&uc, &ai, &target, false), 0);
	ck_assert_uint_eq((uint64_t)uc.uc_mcontext.gregs[REG_RIP], target);
	ck_assert_uint_eq((uint64_t)uc.uc_mcontext.gregs[REG_RSP], (uintptr_t)&stack[2]);
	ck_assert_uint_eq(stack[2], (uintptr_t)pkt_i_call_mem + ai.len);
	/* not at the instruction any more */
	ck_assert_int_eq(pki_access_branch(&uc, &ai, &target, false), -EINVAL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("access");
	TCase *tc_run = tcase_create("redirect");

	TCase *tc_pure = tcase_create("pure");

	tcase_add_test(tc_pure, decode_fields);
	tcase_add_test(tc_pure, decode_refused);
	tcase_add_test(tc_pure, branch_emulated);
	tcase_add_test(tc_pure, begin_end_abort);
	suite_add_tcase(s, tc_pure);
	tcase_add_loop_test(tc_run, redirect, 0, (int)(sizeof(cases) / sizeof(cases[0])));
	suite_add_tcase(s, tc_run);
	return pk_test_run(s);
}
