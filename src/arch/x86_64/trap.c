// SPDX-License-Identifier: MIT
/*
 * x86-64 INT3 emulation on a saved ucontext: see trap.h.  Called from signal
 * handlers only; touches nothing but @uc and the interrupted stack.
 */
#include <signal.h>
#include <ucontext.h>

#include "arch/x86_64/trap.h"

unsigned long pki_arch_uc_ip(const void *uc)
{
	return (unsigned long)((const ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
}

void pki_arch_uc_set_ip(void *uc, unsigned long ip)
{
	((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP] = (greg_t)ip;
}

unsigned long pki_arch_int3_addr(const void *uc)
{
	return pki_arch_uc_ip(uc) - 1;
}

bool pki_arch_int3_emulate(void *uc, unsigned long site, const uint8_t insn[PKI_SITE_LEN])
{
	greg_t *regs = ((ucontext_t *)uc)->uc_mcontext.gregs;
	unsigned long next = site + PKI_SITE_LEN;

	switch (pki_insn_classify(insn)) {
	case PKI_INSN_NOP5:
	case PKI_INSN_NOP1X5:
		regs[REG_RIP] = (greg_t)next;
		return true;
	case PKI_INSN_CALL:
		regs[REG_RSP] -= 8;
		*(unsigned long *)regs[REG_RSP] = next;
		regs[REG_RIP] = (greg_t)pki_insn_branch_target(insn, site);
		return true;
	case PKI_INSN_JMP:
		regs[REG_RIP] = (greg_t)pki_insn_branch_target(insn, site);
		return true;
	case PKI_INSN_UNKNOWN:
		break;
	}
	return false;
}
