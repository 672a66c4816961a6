// SPDX-License-Identifier: MIT
/*
 * What the x86-64 patching protocols (poke.h) share: their set-up before
 * the first batch, their counters and the tests' fault-injection hook
 * (TP1 of doc/design/text-patching.md).
 */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

#include "arch/x86_64/poke_int.h"
#include "base/signals.h"
#include "base/threads.h"

int (*pki_text_poke_hook)(enum pki_poke_stage stage);

bool pki_have_cas16;

atomic_ulong pki_stat_emulated, pki_stat_restarted, pki_stat_sled_moves, pki_stat_fast,
    pki_stat_kicks, pki_stat_relayed, pki_stat_trap_calls;

bool pki_arch_poke_release(void)
{
	return pki_trap_release();
}

bool pki_arch_poke_pending(void)
{
	return pki_threads_pending(1ull << (SIGTRAP - 1) | 1ull << (PKI_SIG_KICK - 1), 1000);
}

int pki_arch_poke_install(void)
{
	/* CPUID is costly in a VM: asked once, before any store needs it. */
	pki_have_cas16 = pki_arch_have_cas16();
	return pki_trap_install();
}

void pki_arch_poke_counts(struct pki_poke_counts *c)
{
	c->emulated = atomic_load(&pki_stat_emulated);
	c->restarted = atomic_load(&pki_stat_restarted);
	c->sled_moves = atomic_load(&pki_stat_sled_moves);
	c->fast = atomic_load(&pki_stat_fast);
	c->kicks = atomic_load(&pki_stat_kicks);
	c->relayed = atomic_load(&pki_stat_relayed);
	c->trap_calls = atomic_load(&pki_stat_trap_calls);
}
