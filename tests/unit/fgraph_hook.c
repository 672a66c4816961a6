// SPDX-License-Identifier: MIT
/*
 * test_fgraph's hook, built like the agent's (agent/trace_hook.c): with
 * -mgeneral-regs-only -DPKI_NOVEC, for a PK_OPS_F_NOVEC ops.
 */
#include <probekit/hook.h>

#include "fgraph_hook.h"
#include "trace/fgraph.h"
#include "trace/trace.h"

void fgraph_test_hook(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		      struct pk_regs *regs)
{
	(void)parent_ip;
	(void)ops;
	pki_trace_enter(ip);
	pki_fgraph_enter(ip, (unsigned long *)regs->sp);
}
