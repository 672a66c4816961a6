// SPDX-License-Identifier: MIT
/*
 * The functions whose return no hook may hijack, in one table for every
 * user of exit hooks: fprobes and their trampolines refuse the ones that
 * cannot have an exit (doc/design/exit-hooks.md, X6), and `probekit trace`
 * leaves all of them entries only in the libraries it relocates.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "hook/fprobe_int.h"

static const struct {
	const char *name;
	bool cannot; /* a hijacked return breaks it; else an exit there is only of no use */
} no_exit[] = {
    /* They return twice or on another stack. */
    {"setjmp", true},
    {"_setjmp", true},
    {"sigsetjmp", true},
    {"__sigsetjmp", true},
    {"vfork", true},
    {"__vfork", true},
    {"getcontext", true},
    {"setcontext", true},
    {"swapcontext", true},
    {"makecontext", true},
    {"savectx", true},
    /* They read their own return address (the caller's object). */
    {"dlopen", true},
    {"dlmopen", true},
    {"dlsym", true},
    {"dlvsym", true},
    {"dl_iterate_phdr", true},
    {"__libc_dlopen_mode", true},
    {"__libc_dlsym", true},
    {"__libc_dlvsym", true},
    /* They never return to their caller, or only after they walked or left its stack. */
    {"longjmp", false},
    {"_longjmp", false},
    {"siglongjmp", false},
    {"__longjmp_chk", false},
    {"__libc_longjmp", false},
    {"__libc_siglongjmp", false},
    {"pthread_exit", false},
    {"thrd_exit", false},
    {"__pthread_unwind", false},
    {"__pthread_unwind_next", false},
    {"start_thread", false},
    {"__libc_start_main", false},
    {"__libc_start_call_main", false},
    {"backtrace", false},
    {"__backtrace", false},
    /*
     * They end the program image when they succeed: no exit to record, and
     * a vfork child's frame would be closed by its parent's next return.
     */
    {"execve", false},
    {"execv", false},
    {"execvp", false},
    {"execvpe", false},
    {"execl", false},
    {"execlp", false},
    {"execle", false},
    {"fexecve", false},
    {"execveat", false},
    {"_exit", false},
    {"_Exit", false},
    /* Their children run where the parent's pending exits are. */
    {"fork", false},
    {"_Fork", false},
    {"__fork", false},
    {"clone", false},
    {"__clone", false},
    {"clone3", false},
    {"posix_spawn", false},
    {"posix_spawnp", false},
    /* Profiling entry points: not functions of the program. */
    {"mcount", false},
    {"_mcount", false},
    {"__fentry__", false},
};

#define N_NO_EXIT (sizeof(no_exit) / sizeof(no_exit[0]))

bool pki_no_exit_name(const char *name)
{
	for (size_t i = 0; name && i < N_NO_EXIT; i++)
		if (!strcmp(name, no_exit[i].name))
			return true;
	return false;
}

void pki_no_exit_resolve(struct pki_no_exit_set *set)
{
	set->n = 0;
	for (size_t i = 0; i < N_NO_EXIT && set->n < PKI_NO_EXIT_MAX; i++) {
		unsigned long a;

		if (!no_exit[i].cannot)
			continue;
		a = (unsigned long)dlsym(RTLD_DEFAULT, no_exit[i].name);
		if (a) {
			set->addr[set->n] = a;
			set->name[set->n++] = no_exit[i].name;
		}
	}
}

const char *pki_no_exit_in(const struct pki_no_exit_set *set, unsigned long ip)
{
	for (size_t i = 0; i < set->n; i++)
		if (ip == set->addr[i] || ip == set->addr[i] + 4) /* (behind an endbr64) */
			return set->name[i];
	return NULL;
}
