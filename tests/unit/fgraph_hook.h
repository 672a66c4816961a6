/* SPDX-License-Identifier: MIT */
/* The exit-tracing hook test_fgraph registers (fgraph_hook.c, vector-free). */
#ifndef PK_TESTS_FGRAPH_HOOK_H
#define PK_TESTS_FGRAPH_HOOK_H

struct pk_ops;
struct pk_regs;

void fgraph_test_hook(unsigned long ip, unsigned long parent_ip, struct pk_ops *ops,
		      struct pk_regs *regs);

#endif /* PK_TESTS_FGRAPH_HOOK_H */
