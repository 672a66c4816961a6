// SPDX-License-Identifier: MIT
/*
 * Library functions whose hooks depend on a jump relay's place
 * (doc/design/reloc-sites.md RS2, RS5a): the relay's slot is at the
 * function's first byte + 5 + its bytes 1..4, here a `mov $IMM, %eax`'s
 * immediate.
 *  - relay_taken: an indirect jump (relocation refuses it: an INT3 site),
 *    its slot 1 MiB above it, a page this library's constructor maps
 *    first: the relay cannot go there, only a breakpoint could;
 *  - relay_free: the same, its slot 256 MiB above, left free: on its relay;
 *  - relay_short: relocates, but its slot lies inside this library: its
 *    attach takes the INT3 protocol (a signal to the threads);
 *  - relay_none: as relay_taken, its slot 2 GiB below it, below 0: no
 *    relay can stand for its breakpoint, it has no site without --int3
 *    (its callers' PLT slots are hooked instead: library-calls.md LC5).
 * Each returns its immediate.
 */
#include <stdint.h>
#include <sys/mman.h>

#define FN(name, imm, body)                                                                        \
	__asm__(".text\n.globl " #name "\n.type " #name ",@function\n.p2align 4\n" #name           \
		":\n\tmov $" #imm ", %eax\n" body "\n.size " #name ", .-" #name "\n")

FN(relay_taken, 0x100000, "\tlea 1f(%rip), %rcx\n\tjmp *%rcx\n1:\tret");
FN(relay_free, 0x10000000, "\tlea 1f(%rip), %rcx\n\tjmp *%rcx\n1:\tret");
FN(relay_short, 0x27, "\tret");
FN(relay_none, 0x80000003, "\tlea 1f(%rip), %rcx\n\tjmp *%rcx\n1:\tret");

int relay_taken(void);

/* Mapped before any hook: the page relay_taken's slot is in. */
__attribute__((constructor)) static void take_slot(void)
{
	uintptr_t slot = (uintptr_t)relay_taken + 5 + 0x100000;

	mmap((void *)(slot & ~(uintptr_t)0xfff), 0x2000, PROT_READ,
	     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
}
