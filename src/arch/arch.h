/* SPDX-License-Identifier: MIT */
/*
 * The one header generic code includes for what depends on the
 * architecture: the ELF machine's name and the multiarch triplet (abi.h),
 * the site length and instruction bytes (insn.h), the atomic text store
 * (store.h), the patching protocols and their contract with the batch
 * layer (x86_64/poke.h, arch/poke.h), trampolines (tramp.h), return-address
 * tracking (callret.h), debug-register facts (hwbp.h), decoding
 * (decode.h), reading a hooked call's arguments (fetch.h), prologue
 * relocation (reloc.h), code run in another process's thread under ptrace
 * (remote.h), the timestamp counter (tsc.h), CRC32C (crc32c.h) and
 * vector-register safety (vecsafe.h).  Only x86-64 exists: everything
 * lives under src/arch/x86_64/, which nothing outside src/arch/ includes.
 */
#ifndef PK_ARCH_ARCH_H
#define PK_ARCH_ARCH_H

#if defined(__x86_64__)
#include "arch/x86_64/abi.h"
#include "arch/x86_64/access.h"
#include "arch/x86_64/callret.h"
#include "arch/x86_64/crc32c.h"
#include "arch/x86_64/decode.h"
#include "arch/x86_64/fetch.h"
#include "arch/x86_64/hwbp.h"
#include "arch/x86_64/insn.h"
#include "arch/x86_64/poke.h"
#include "arch/x86_64/reloc.h"
#include "arch/x86_64/remote.h"
#include "arch/x86_64/store.h"
#include "arch/x86_64/tramp.h"
#include "arch/x86_64/tsc.h"
#include "arch/x86_64/vecsafe.h"
#else
#error "probekit supports x86-64 only"
#endif

#include "arch/poke.h"

#endif /* PK_ARCH_ARCH_H */
