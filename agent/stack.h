/* SPDX-License-Identifier: MIT */
/*
 * Backtraces through the .eh_frame call-frame information (elfutils
 * libdwfl), for code built without frame pointers, from a snapshot taken
 * in a signal handler and unwound later in a normal thread, the way perf
 * record --call-graph dwarf does: the handler copies the registers and the
 * top of the stack (agent_stack_snap_take(), async-signal-safe: no lock, no
 * allocation), and agent_stack_unwind() replays the CFI over that copy.
 */
#ifndef PK_AGENT_STACK_H
#define PK_AGENT_STACK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <ucontext.h>

#include "arch/arch.h"

#define AGENT_SNAP_STACK 8192u /* bytes of stack copied: a dozen ordinary frames */

struct agent_stack_snap {
	uint64_t regs[PKI_DWARF_NREGS];
	uint64_t sp;
	size_t len; /* bytes of stack[] copied (the stack may end sooner) */
	uint8_t stack[AGENT_SNAP_STACK];
};

/*
 * Copy @uc's registers and the stack above its stack pointer into @s.
 * Async-signal-safe (process_vm_readv of our own process, @pid: a stack
 * that ends sooner just copies less).
 */
void agent_stack_snap_take(struct agent_stack_snap *s, const ucontext_t *uc, pid_t pid);

struct agent_stack_unwinder;

/*
 * An unwinder for the objects this process (@pid: its pid) has loaded now;
 * NULL if it cannot.
 */
struct agent_stack_unwinder *agent_stack_unwinder_new(pid_t pid);
void agent_stack_unwinder_free(struct agent_stack_unwinder *u);

/*
 * The return addresses of the frames above the one of @s (innermost caller
 * first) into @ras, at most @max: the number found, 0 if none (no CFI
 * there).  Normal context; one thread at a time per unwinder.
 */
int agent_stack_unwind(struct agent_stack_unwinder *u, const struct agent_stack_snap *s,
		       uintptr_t *ras, int max);

#endif /* PK_AGENT_STACK_H */
