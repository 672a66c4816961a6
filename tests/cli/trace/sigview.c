// SPDX-License-Identifier: MIT
/*
 * What a program sees of its signal dispositions must not change under
 * probekit trace (agent/signal.c, base/signals.h pki_fatal_hides): the
 * fatal signals the agent catches for a last flush read as SIG_DFL through
 * sigaction() and signal(), and the program's own handler, installed over
 * one of them, is the one that runs.  Prints what it sees; the test
 * compares a traced run's output with a plain run's.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

/* sigset() and sigignore() are deprecated, and programs still use them. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

static volatile sig_atomic_t got;

static void on_usr1(int sig)
{
	got = sig;
}

__attribute__((noinline, patchable_function_entry(5))) static int show(int sig)
{
	struct sigaction sa;

	if (sigaction(sig, NULL, &sa))
		return printf("%d: sigaction failed\n", sig) < 0;
	return printf("%d: %s flags %#x\n", sig,
		      sa.sa_handler == SIG_DFL	 ? "SIG_DFL"
		      : sa.sa_handler == SIG_IGN ? "SIG_IGN"
						 : "a handler",
		      (unsigned)(sa.sa_flags & (SA_SIGINFO | SA_ONSTACK | SA_RESTART))) < 0;
}

static const char *name(sighandler_t h)
{
	return h == SIG_DFL    ? "SIG_DFL"
	       : h == SIG_IGN  ? "SIG_IGN"
	       : h == SIG_HOLD ? "SIG_HOLD"
			       : "a handler";
}

/*
 * Set back to SIG_DFL (no change without probekit), then die of it: the
 * trace must still end by the signal.  SIGTERM, which no sanitizer runtime
 * handles (ASan owns SIGSEGV), raised (a null load would be UBSan's).
 */
__attribute__((noinline, patchable_function_entry(5))) static int die(void)
{
	signal(SIGTERM, SIG_DFL);
	fflush(stdout);
	raise(SIGTERM);
	return 0;
}

int main(int argc, char **argv)
{
	static const int sigs[] = {SIGSEGV, SIGBUS, SIGABRT, SIGTERM,
				   SIGINT,  SIGHUP, SIGUSR1, SIGUSR2};
	sighandler_t old;

	if (argc > 1 && !strcmp(argv[1], "--crash"))
		return die();

	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		show(sigs[i]);
	old = signal(SIGUSR1, on_usr1);
	printf("signal(SIGUSR1) returned %s\n", old == SIG_DFL ? "SIG_DFL" : "something else");
	raise(SIGUSR1);
	printf("handler ran: %s\n", got == SIGUSR1 ? "yes" : "no");
	show(SIGUSR1);
	old = signal(SIGUSR1, SIG_DFL);
	printf("signal(SIGUSR1, SIG_DFL) returned %s\n",
	       old == on_usr1 ? "the handler" : "something else");
	/* sigset's hold and restore, and libc changing an action behind the interposer */
	old = sigset(SIGINT, SIG_HOLD);
	printf("sigset(SIGINT, SIG_HOLD) returned %s\n", name(old));
	old = sigset(SIGINT, old);
	printf("sigset(SIGINT, old) returned %s\n", name(old));
	show(SIGINT);
	sigignore(SIGPIPE);
	show(SIGPIPE);
	old = signal(SIGTERM, SIG_DFL);
	printf("signal(SIGTERM, SIG_DFL) returned %s\n", name(old));
	show(SIGTERM);
	return 0;
}
