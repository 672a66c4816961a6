/* SPDX-License-Identifier: MIT */
/*
 * The thread-creation gate (gate.c): while it is closed, no thread is being
 * created with pthread_create(), so a list of the threads and the
 * inheritable events opened on them cover every thread there will be.
 */
#ifndef PK_WATCH_GATE_H
#define PK_WATCH_GATE_H

#include <stdint.h>

/* Wait for threads being created, hold new ones back until the gate opens. */
void pki_gate_close(void);
void pki_gate_open(void);

/*
 * From now on, every thread pthread_create() makes runs @load(v) before
 * its start routine, v being what @save() returned in its creator (the
 * agent's per-thread view of a signal mask, agent/trigger.c).  Set once,
 * before other threads may create any.  A creation that cannot allocate
 * the hand-over (a few bytes) fails with EAGAIN, as pthread_create may.
 */
void pki_gate_inherit(uint64_t (*save)(void), void (*load)(uint64_t));

#endif /* PK_WATCH_GATE_H */
