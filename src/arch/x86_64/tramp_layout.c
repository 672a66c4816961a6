// SPDX-License-Identifier: MIT
/*
 * The build's check of tramp_layout.h: every number tramp.S uses for a C
 * struct's field is that field's offset (the kernel's asm-offsets, as
 * assertions).  No code.
 */
#include <stddef.h>

#include <probekit/hook.h>

#include "arch/x86_64/tramp.h"
#include "arch/x86_64/tramp_layout.h"

#define LAYOUT(asm_value, c_value) _Static_assert((asm_value) == (c_value), #asm_value)

LAYOUT(R_DI, offsetof(struct pk_regs, di));
LAYOUT(R_SI, offsetof(struct pk_regs, si));
LAYOUT(R_DX, offsetof(struct pk_regs, dx));
LAYOUT(R_CX, offsetof(struct pk_regs, cx));
LAYOUT(R_R8, offsetof(struct pk_regs, r8));
LAYOUT(R_R9, offsetof(struct pk_regs, r9));
LAYOUT(R_AX, offsetof(struct pk_regs, ax));
LAYOUT(R_SP, offsetof(struct pk_regs, sp));
/* the private slots follow struct pk_regs, then eight 16-byte vector registers */
LAYOUT(R_R10, sizeof(struct pk_regs));
LAYOUT(R_R11, R_R10 + 8);
LAYOUT(R_XMM, R_R11 + 8);
LAYOUT(FRAME, R_XMM + 8 * 16);
LAYOUT(FRAME_NV, R_XMM);
LAYOUT(FRAME % 16, 0);

LAYOUT(TLS_NEST, offsetof(struct pki_tramp_tls, nest));
LAYOUT(TLS_WANT, offsetof(struct pki_tramp_tls, want));

LAYOUT(ENTRY_SIZE, PKI_TRAMP_ENTRY_SIZE);
LAYOUT(E_TARGET, PKI_TRAMP_ENTRY_DATA + offsetof(struct pki_tramp_entry, target));
LAYOUT(E_USER, PKI_TRAMP_ENTRY_DATA + offsetof(struct pki_tramp_entry, user));
LAYOUT(E_OPS, PKI_TRAMP_ENTRY_DATA + offsetof(struct pki_tramp_entry, ops));
LAYOUT(E_DIRECT, PKI_TRAMP_ENTRY_DATA + offsetof(struct pki_tramp_entry, direct));
LAYOUT(PKI_TRAMP_ENTRY_DATA + sizeof(struct pki_tramp_entry), PKI_TRAMP_ENTRY_SIZE);
/* a relocated site's address: the last word of the slot after its entry */
LAYOUT(RELOC_IP, 2 * PKI_TRAMP_ENTRY_SIZE - 8);
