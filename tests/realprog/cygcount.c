// SPDX-License-Identifier: MIT
/*
 * The reference counter for scripts/realprog.sh: linked into a program built
 * with -finstrument-functions, it counts the calls of every function by the
 * address gcc passes to __cyg_profile_func_enter, from every thread, and at
 * exit writes one line per function, "OFFSET COUNT OBJECT", OFFSET being the
 * address minus the load base of the object holding it, to the file named by
 * $CYGCOUNT_OUT (nothing when unset).  The script turns offsets into names
 * with nm.  Nothing here is instrumented (the file is compiled without
 * -finstrument-functions, and the hooks are marked so anyway).
 *
 * The table is open addressing with a lock-free insert (a CAS on the empty
 * key) and an atomic add per call, so threads need no lock; it is sized for
 * far more functions than the programs have (sqlite has about 2,600).  A
 * full table counts the overflow in one counter that the dump reports, so
 * nothing is dropped silently.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define NOINST __attribute__((no_instrument_function))
#define SLOTS  (1u << 16) /* a power of two */

static struct {
	uintptr_t fn;
	unsigned long n;
} tab[SLOTS];
static unsigned long overflow;

NOINST void __cyg_profile_func_enter(void *fn, void *site)
{
	uintptr_t key = (uintptr_t)fn;
	unsigned i = (unsigned)((key >> 4) * 0x9e3779b1u) & (SLOTS - 1);

	(void)site;
	for (unsigned probe = 0; probe < SLOTS; probe++, i = (i + 1) & (SLOTS - 1)) {
		uintptr_t cur = __atomic_load_n(&tab[i].fn, __ATOMIC_ACQUIRE);

		if (cur == 0) {
			uintptr_t zero = 0;

			if (__atomic_compare_exchange_n(&tab[i].fn, &zero, key, 0, __ATOMIC_ACQ_REL,
							__ATOMIC_ACQUIRE))
				cur = key;
			else
				cur = zero; /* another thread took the slot */
		}
		if (cur == key) {
			__atomic_fetch_add(&tab[i].n, 1, __ATOMIC_RELAXED);
			return;
		}
	}
	__atomic_fetch_add(&overflow, 1, __ATOMIC_RELAXED);
}

NOINST void __cyg_profile_func_exit(void *fn, void *site)
{
	(void)fn;
	(void)site;
}

/*
 * Run last among the destructors (priority 101), and after the program's own
 * atexit handlers (glibc runs the executable's destructors from _dl_fini,
 * registered before main): calls made after this point are not counted.
 */
NOINST __attribute__((destructor(101))) static void cygcount_dump(void)
{
	const char *path = getenv("CYGCOUNT_OUT");
	FILE *f;

	if (!path || !*path || !(f = fopen(path, "w")))
		return;
	for (unsigned i = 0; i < SLOTS; i++) {
		Dl_info di;
		uintptr_t fn = __atomic_load_n(&tab[i].fn, __ATOMIC_ACQUIRE);

		if (!fn)
			continue;
		if (dladdr((void *)fn, &di) && di.dli_fbase)
			fprintf(f, "%lx %lu %s\n", (unsigned long)(fn - (uintptr_t)di.dli_fbase),
				__atomic_load_n(&tab[i].n, __ATOMIC_RELAXED), di.dli_fname);
		else
			fprintf(f, "%lx %lu ?\n", (unsigned long)fn,
				__atomic_load_n(&tab[i].n, __ATOMIC_RELAXED));
	}
	if (overflow)
		fprintf(f, "overflow %lu ?\n", overflow);
	fclose(f);
}
