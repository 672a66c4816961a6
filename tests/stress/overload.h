/* SPDX-License-Identifier: MIT */
/*
 * The overload mode of the stress tests: a second process (stress_load, next
 * to the test's own executable, or $PKS_LOAD) with hundreds of runnable
 * threads beside the test, started and killed by PID.
 */
#ifndef PKS_OVERLOAD_H
#define PKS_OVERLOAD_H

/*
 * Start stress_load with @threads threads for at most @seconds (it also
 * dies with this process).  0, or -1 with a message on stderr.
 */
int pks_overload_start(int threads, double seconds);

/* Kill it (SIGKILL to its PID) and reap it; nothing if none runs. */
void pks_overload_stop(void);

#endif
