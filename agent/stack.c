// SPDX-License-Identifier: MIT
/*
 * .eh_frame backtraces over a stack snapshot (stack.h), with libdwfl's
 * unwinder: its modules are the process's objects, reported once from
 * /proc/PID/maps; its thread state is the snapshot being unwound, which
 * the callbacks below hand it (the registers at the trap, memory from the
 * copy where it has it, from the live process elsewhere).
 */
#include <elfutils/libdwfl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/peek.h"
#include "stack.h"

struct agent_stack_unwinder {
	Dwfl *dwfl;
	pid_t pid;
	const struct agent_stack_snap *cur; /* the snapshot agent_stack_unwind() is on */
};

void agent_stack_snap_take(struct agent_stack_snap *s, const ucontext_t *uc, pid_t pid)
{
	struct iovec local = {s->stack, sizeof(s->stack)}, remote;
	ssize_t n;

	pki_uc_dwarf_regs(uc, s->regs);
	s->sp = pki_uc_sp(uc);
	remote = (struct iovec){(void *)(uintptr_t)s->sp, sizeof(s->stack)};
	n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
	s->len = n > 0 ? (size_t)n : 0;
}

/* One word of the process: from the snapshot's copy if there, else live. */
static bool mem_read(Dwfl *dwfl, Dwarf_Addr addr, Dwarf_Word *out, void *arg)
{
	const struct agent_stack_snap *s = ((struct agent_stack_unwinder *)arg)->cur;

	(void)dwfl;
	if (addr >= s->sp && addr - s->sp + sizeof(*out) <= s->len) {
		memcpy(out, s->stack + (addr - s->sp), sizeof(*out));
		return true;
	}
	return !pki_peek((const void *)(uintptr_t)addr, out, sizeof(*out));
}

static pid_t next_thread(Dwfl *dwfl, void *arg, void **thread_argp)
{
	struct agent_stack_unwinder *u = arg;

	(void)dwfl;
	if (*thread_argp)
		return 0;
	*thread_argp = u;
	return u->pid;
}

static bool get_thread(Dwfl *dwfl, pid_t tid, void *arg, void **thread_argp)
{
	(void)dwfl;
	(void)tid;
	*thread_argp = arg; /* whichever thread: the snapshot is the state */
	return true;
}

static bool initial_regs(Dwfl_Thread *thread, void *arg)
{
	const struct agent_stack_unwinder *u = arg;
	Dwarf_Word regs[PKI_DWARF_NREGS];

	for (int i = 0; i < PKI_DWARF_NREGS; i++)
		regs[i] = u->cur->regs[i];
	return dwfl_thread_state_registers(thread, 0, PKI_DWARF_NREGS, regs);
}

static const Dwfl_Thread_Callbacks thread_cbs = {
    .next_thread = next_thread,
    .get_thread = get_thread,
    .memory_read = mem_read,
    .set_initial_registers = initial_regs,
};

static const Dwfl_Callbacks proc_cbs = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
};

struct agent_stack_unwinder *agent_stack_unwinder_new(pid_t pid)
{
	struct agent_stack_unwinder *u = calloc(1, sizeof(*u));

	if (!u)
		return NULL;
	u->pid = pid;
	u->dwfl = dwfl_begin(&proc_cbs);
	if (!u->dwfl || dwfl_linux_proc_report(u->dwfl, pid) ||
	    dwfl_report_end(u->dwfl, NULL, NULL) ||
	    !dwfl_attach_state(u->dwfl, NULL, pid, &thread_cbs, u)) {
		agent_stack_unwinder_free(u);
		return NULL;
	}
	return u;
}

void agent_stack_unwinder_free(struct agent_stack_unwinder *u)
{
	if (!u)
		return;
	if (u->dwfl)
		dwfl_end(u->dwfl);
	free(u);
}

struct collect {
	uintptr_t *ras;
	int n, max;
	bool first;
};

static int on_frame(Dwfl_Frame *state, void *arg)
{
	struct collect *c = arg;
	Dwarf_Addr pc;
	bool activation;

	if (!dwfl_frame_pc(state, &pc, &activation) || !pc)
		return DWARF_CB_ABORT;
	if (c->first) { /* the frame of the trap itself */
		c->first = false;
		return DWARF_CB_OK;
	}
	c->ras[c->n++] = (uintptr_t)pc;
	return c->n < c->max ? DWARF_CB_OK : DWARF_CB_ABORT;
}

int agent_stack_unwind(struct agent_stack_unwinder *u, const struct agent_stack_snap *s,
		       uintptr_t *ras, int max)
{
	struct collect c = {.ras = ras, .max = max, .first = true};

	if (!u || max <= 0)
		return 0;
	u->cur = s;
	dwfl_getthread_frames(u->dwfl, u->pid, on_frame, &c); /* an error ends it: what was found */
	return c.n;
}
