/* SPDX-License-Identifier: MIT */
/*
 * x86-64 side of the patcher's signal handlers: where an INT3 trap happened,
 * and how to make an interrupted thread behave as if it had executed a site's
 * instruction, by editing the ucontext the kernel saved.  Everything here is
 * async-signal-safe (no calls at all beyond memory accesses).
 */
#ifndef PK_ARCH_X86_64_TRAP_H
#define PK_ARCH_X86_64_TRAP_H

#include <stdbool.h>
#include <stdint.h>

#include "arch/x86_64/insn.h"

/* Instruction pointer saved in @uc (a ucontext_t *). */
unsigned long pki_arch_uc_ip(const void *uc);
void pki_arch_uc_set_ip(void *uc, unsigned long ip);

/*
 * Address of the INT3 that raised a SIGTRAP with si_code SI_KERNEL: the trap
 * leaves IP just past the one-byte instruction.
 */
unsigned long pki_arch_int3_addr(const void *uc);

/*
 * Make the thread interrupted in @uc continue as if it had executed @insn
 * (PKI_SITE_LEN bytes at @site) instead of the INT3 at @site.  Returns false,
 * leaving @uc alone, for an instruction it cannot emulate.  A call writes the
 * return address below the interrupted stack pointer, exactly where the real
 * call would have: the kernel put the signal frame below the red zone, so
 * nothing live is there.
 */
bool pki_arch_int3_emulate(void *uc, unsigned long site, const uint8_t insn[PKI_SITE_LEN]);

#endif /* PK_ARCH_X86_64_TRAP_H */
