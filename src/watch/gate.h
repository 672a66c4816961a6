/* SPDX-License-Identifier: MIT */
/*
 * The thread-creation gate (gate.c): while it is closed, no thread is being
 * created with pthread_create(), so a list of the threads and the
 * inheritable events opened on them cover every thread there will be.
 */
#ifndef PK_WATCH_GATE_H
#define PK_WATCH_GATE_H

/* Wait for threads being created, hold new ones back until the gate opens. */
void pki_gate_close(void);
void pki_gate_open(void);

#endif /* PK_WATCH_GATE_H */
