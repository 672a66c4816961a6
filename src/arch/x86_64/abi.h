/* SPDX-License-Identifier: MIT */
/*
 * How the programs probekit enters are built, installed and run on x86-64,
 * as messages and paths name it: their ELF machine (EM_X86_64), the Debian
 * multiarch triplet under which a distribution puts libraries, and the
 * hardware shadow stack a thread may run with (which return trampolines
 * cannot live with: src/trace/fgraph.h).
 */
#ifndef PK_ARCH_X86_64_ABI_H
#define PK_ARCH_X86_64_ABI_H

#define PKI_ELF_MACHINE_NAME "x86-64"
#define PKI_MULTIARCH	     "x86_64-linux-gnu"
#define PKI_SHSTK_NAME	     "CET shadow stack (x86_Thread_features: shstk)"

#include <stdbool.h>

/* Is a CET user shadow stack on for this thread? (shstk.c; normal context) */
bool pki_arch_shstk(void);

#endif /* PK_ARCH_X86_64_ABI_H */
