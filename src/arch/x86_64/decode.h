/* SPDX-License-Identifier: MIT */
/*
 * Instruction-length decoding (Zydis), for code that must find instruction
 * boundaries: which instruction made a data access that trapped after it.
 * Never called from a signal handler (Zydis is fine there, but callers read
 * the code bytes first, which they do in a normal thread).
 */
#ifndef PK_ARCH_X86_64_DECODE_H
#define PK_ARCH_X86_64_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * @code holds @len bytes of straight-line x86-64 code that starts, at run
 * time, at address @start (a function entry).  Decode forward from @start and
 * return in *@prev the address of the instruction that ends exactly at @ip:
 * the one a data watchpoint trapping with RIP = @ip just executed.  Decoding
 * forward from a known boundary is safe where decoding backward is not.
 * Returns 0, -ERANGE (@ip not inside @code), or -ENOENT (no instruction ends
 * at @ip: data in the code, or @start is not an instruction boundary).
 */
int pki_insn_prev(const uint8_t *code, size_t len, uint64_t start, uint64_t ip, uint64_t *prev);

/*
 * Where is the return address of the function that starts at @start, when
 * it runs at @ip?  Decodes forward from @start as pki_insn_prev() does,
 * keeping count of what the instructions before @ip put on the stack
 * (push, pop, sub/add of an immediate to %rsp), straight through, as a
 * function's prologue runs.  Returns 1 if `mov %rsp,%rbp` came at the
 * depth `push %rbp` left: the frame pointer is set, walk the frame chain;
 * 0 with *@ra_off the return address's offset from %rsp (0 at the entry);
 * -ENOENT if %rsp is changed another way, a ret or jmp ends the straight
 * path before @ip (what follows it is another path), or the code cannot be
 * decoded.  Conditional branches are taken as falling through.
 */
int pki_insn_frame(const uint8_t *code, size_t len, uint64_t start, uint64_t ip, size_t *ra_off);

/*
 * Does a call instruction end right before @ra, as before a return
 * address (the 7 bytes before @ra must be readable)?  A plausibility check
 * of a word taken from a stack for one.
 */
bool pki_insn_after_call(const uint8_t *ra);

#endif /* PK_ARCH_X86_64_DECODE_H */
