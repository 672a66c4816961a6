/* SPDX-License-Identifier: MIT */
/*
 * x86-64 debug-register specifics for the watchpoint layer: how many slots a
 * thread has, which lengths and alignments the hardware takes (and how
 * messages name them), when a data breakpoint traps, how the kernel wants an
 * execute breakpoint described, where the trapping RIP, the stack and frame
 * pointers and the perf sigtrap data live in a signal frame, and how the
 * frame-pointer chain is laid out (a backtrace from the trap).
 * Async-signal-safe throughout.
 */
#ifndef PK_ARCH_X86_64_HWBP_H
#define PK_ARCH_X86_64_HWBP_H

#include <linux/hw_breakpoint.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

/* DR0-DR3: four slots per thread, shared by code and data breakpoints. */
#define PKI_HWBP_SLOTS 4

/* The lengths a data breakpoint takes: 1/2/4/8 bytes (DR7 LEN field). */
static inline bool pki_hwbp_len_ok(size_t len)
{
	return len == 1 || len == 2 || len == 4 || len == 8;
}

/* ... naturally aligned (address alignment). */
static inline bool pki_hwbp_data_ok(uintptr_t addr, size_t len)
{
	return pki_hwbp_len_ok(len) && !(addr & (len - 1));
}

/*
 * A range longer or less aligned than one register takes is split over
 * several (doc/design/hw-watch-split.md, S1): into its minimal cover by
 * naturally aligned pieces of 1, 2, 4 or 8 bytes, each the largest that
 * starts where the previous ended and does not pass the end.  Pieces never
 * overlap and cover exactly [@addr, @addr + @len).  Returns how many pieces
 * the cover has, storing the first min(that, @max) in @out; 0 for an empty
 * or wrapping range.  Pure: no state, async-signal-safe.
 */
#define PKI_HWBP_PIECE_MAX 8 /* the longest piece */

struct pki_hwbp_piece {
	uintptr_t addr;
	size_t len;
};

static inline int pki_hwbp_split(uintptr_t addr, size_t len, struct pki_hwbp_piece *out, int max)
{
	uintptr_t a = addr, end = addr + len;
	int n = 0;

	if (!len || end < addr)
		return 0;
	while (a < end) {
		size_t sz = PKI_HWBP_PIECE_MAX;

		while (sz > 1 && ((a & (sz - 1)) || sz > end - a))
			sz /= 2;
		if (n < max)
			out[n] = (struct pki_hwbp_piece){.addr = a, .len = sz};
		n++;
		a += sz;
	}
	return n;
}

/* The longest range that can be watched with every slot free: 32 bytes. */
#define PKI_HWBP_SPAN_MAX (PKI_HWBP_SLOTS * PKI_HWBP_PIECE_MAX)

/*
 * For messages: who does the watching, the lengths pki_hwbp_len_ok() takes,
 * and what the PKI_HWBP_SLOTS slots are; PKI_HWBP_SPLIT_LENS says what a
 * split over free slots takes.
 */
#define PKI_HWBP_CPU	    "x86"
#define PKI_HWBP_LENS	    "1, 2, 4 or 8"
#define PKI_HWBP_SLOTS_NAME "debug registers"
#define PKI_HWBP_SPLIT_LENS                                                                        \
	"up to 32 bytes, in naturally aligned pieces of 1, 2, 4 or 8 bytes, one per free debug "   \
	"register"

/*
 * A data breakpoint traps after the access (a trap, not a fault): the
 * signal's RIP is the next instruction, and memory already holds the value
 * written.
 */
#define PKI_HWBP_TRAP_AFTER 1

/*
 * The kernel wants execute breakpoints described with bp_len ==
 * sizeof(long) (x86 ignores the length of an instruction breakpoint); the API
 * calls that length 1, "the instruction at addr".
 */
static inline uint64_t pki_hwbp_kernel_len(bool exec, size_t len)
{
	return exec ? sizeof(long) : len;
}

/* RIP of the interrupted context. */
static inline uintptr_t pki_uc_ip(const ucontext_t *uc)
{
	return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
}

/* Make the interrupted context trap after its next instruction (EFLAGS.TF), or not. */
static inline void pki_uc_set_step(ucontext_t *uc, bool on)
{
	if (on)
		uc->uc_mcontext.gregs[REG_EFL] |= 0x100;
	else
		uc->uc_mcontext.gregs[REG_EFL] &= ~0x100LL;
}

/* Is @si the trap of a single step (pki_uc_set_step)? */
static inline bool pki_si_single_step(const siginfo_t *si)
{
	return si->si_code == TRAP_TRACE;
}

/* Was the page fault of @uc a write (the error code's W bit)? */
static inline bool pki_uc_fault_write(const ucontext_t *uc)
{
	return uc->uc_mcontext.gregs[REG_ERR] & 2;
}

/* Stack pointer (RSP) and frame pointer (RBP) of the interrupted context. */
static inline uintptr_t pki_uc_sp(const ucontext_t *uc)
{
	return (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
}

static inline uintptr_t pki_uc_fp(const ucontext_t *uc)
{
	return (uintptr_t)uc->uc_mcontext.gregs[REG_RBP];
}

/*
 * The interrupted context's registers in DWARF's numbering (the x86-64
 * psABI's: rax, rdx, rcx, rbx, rsi, rdi, rbp, rsp, r8-r15, then the return
 * address column, rip), for an unwinder that reads .eh_frame.
 */
#define PKI_DWARF_NREGS 17

static inline void pki_uc_dwarf_regs(const ucontext_t *uc, uint64_t regs[PKI_DWARF_NREGS])
{
	static const int map[PKI_DWARF_NREGS] = {
	    REG_RAX, REG_RDX, REG_RCX, REG_RBX, REG_RSI, REG_RDI, REG_RBP, REG_RSP, REG_R8,
	    REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15, REG_RIP};

	for (int i = 0; i < PKI_DWARF_NREGS; i++)
		regs[i] = (uint64_t)uc->uc_mcontext.gregs[map[i]];
}

/*
 * The frame-pointer chain: at FP the caller's FP, at FP + PKI_FRAME_RA_OFF
 * the return address.  At a function's first instruction the frame is not
 * set up yet: the return address is at the top of the stack (the call
 * pushed it).
 */
#define PKI_FRAME_RA_OFF 8

/*
 * si_perf_data / si_perf_type / si_perf_flags of a TRAP_PERF SIGTRAP.  glibc
 * 2.36 does not name these fields yet: on x86-64 the kernel's _sigfault._perf
 * union follows si_addr (offset 16) at offset 24, _type at 32, _flags at 36
 * (Linux 5.18+; zero before).  TRAP_PERF_FLAG_ASYNC: the thread blocked
 * SIGTRAP at the access, the signal was queued and is delivered late.
 */
#ifndef TRAP_PERF
#define TRAP_PERF 6
#endif
#ifndef TRAP_PERF_FLAG_ASYNC
#define TRAP_PERF_FLAG_ASYNC (1U << 0)
#endif

static inline uint64_t pki_si_perf_data(const siginfo_t *si)
{
	uint64_t v;

	memcpy(&v, (const char *)si + 24, sizeof(v));
	return v;
}

static inline uint32_t pki_si_perf_type(const siginfo_t *si)
{
	uint32_t v;

	memcpy(&v, (const char *)si + 32, sizeof(v));
	return v;
}

static inline uint32_t pki_si_perf_flags(const siginfo_t *si)
{
	uint32_t v;

	memcpy(&v, (const char *)si + 36, sizeof(v));
	return v;
}

#endif /* PK_ARCH_X86_64_HWBP_H */
