// SPDX-License-Identifier: MIT
/*
 * The SIGSEGV owner (base/sigown.c, doc/design/signals.md SO1-SO7): a
 * client claims the access faults on a PROT_NONE page (it makes the page
 * accessible and returns true), while the program's own SIGSEGV handler,
 * installed before the owner or given to it after (as the agent's
 * sigaction() wrapper does), still gets the faults at other addresses,
 * with their si_addr and si_code, its sa_mask and SA_RESETHAND honoured;
 * what the kernel would end the process for (SIG_DFL, SIG_IGN on a fault,
 * a fault inside the handler that blocks SIGSEGV) ends it by SIGSEGV, and
 * the fatal-signal catchers run first as the owner's fallback (SO5).
 * The deaths are a child's, judged by its wait status.
 */
#include <check.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/signals.h"
#include "base/sigown.h"
#include "harness.h"

static char *watched; /* one page the client claims faults on */
static atomic_int claims;

static bool claim(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	if (si->si_code != SEGV_ACCERR || (char *)si->si_addr < watched ||
	    (char *)si->si_addr >= watched + getpagesize())
		return false;
	mprotect(watched, getpagesize(), PROT_READ | PROT_WRITE);
	atomic_fetch_add(&claims, 1);
	return true;
}

static char *page(int prot)
{
	char *p = mmap(NULL, getpagesize(), prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	ck_assert_ptr_ne(p, MAP_FAILED);
	return p;
}

static void watch(void)
{
	ck_assert_int_eq(mprotect(watched, getpagesize(), PROT_NONE), 0);
}

static void setup(void)
{
	watched = page(PROT_NONE);
	atomic_store(&claims, 0);
}

/* What the program's handler saw. */
static struct {
	atomic_int runs;
	void *addr;
	int code;
	bool usr1_blocked, segv_blocked;
	int claims_inside; /* claims made by a watched access inside the handler */
} seen;
static char *other; /* the page the program's own faults are on */

static void app_handler(int sig, siginfo_t *si, void *uc)
{
	sigset_t cur;
	int before = atomic_load(&claims);

	(void)sig;
	(void)uc;
	seen.addr = si->si_addr;
	seen.code = si->si_code;
	pthread_sigmask(SIG_BLOCK, NULL, &cur);
	seen.usr1_blocked = sigismember(&cur, SIGUSR1);
	seen.segv_blocked = sigismember(&cur, SIGSEGV);
	/* a watched access in the program's handler still reaches the client */
	watch();
	*(volatile char *)watched = 2;
	seen.claims_inside = atomic_load(&claims) - before;
	mprotect(other, getpagesize(), PROT_READ | PROT_WRITE); /* the faulting access runs again */
	atomic_fetch_add(&seen.runs, 1);
}

static void plain_handler(int sig)
{
	(void)sig;
	mprotect(other, getpagesize(), PROT_READ | PROT_WRITE);
	atomic_fetch_add(&seen.runs, 1);
}

static void fault_other(void)
{
	mprotect(other, getpagesize(), PROT_NONE);
	*(volatile char *)(other + 8) = 1;
}

START_TEST(claims_and_chains_before_and_after)
{
	struct sigaction sa = {.sa_sigaction = app_handler, .sa_flags = SA_SIGINFO}, old;

	memset(&seen, 0, sizeof(seen));
	other = page(PROT_READ | PROT_WRITE);
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, SIGUSR1);
	/* before the owner: the kernel's action, which the owner then chains to */
	ck_assert_int_eq(sigaction(SIGSEGV, &sa, NULL), 0);
	ck_assert(!pki_sigsegv_installed());
	ck_assert_int_eq(pki_sigsegv_client_add(PKI_SIGSEGV_PAGEWATCH, claim), 0);
	ck_assert(pki_sigsegv_installed());
	ck_assert(pki_sigown_has_client(SIGSEGV));
	ck_assert_int_eq(pki_sigsegv_app_action(NULL, &old), 0);
	ck_assert_ptr_eq(old.sa_sigaction, app_handler);

	watch();
	*(volatile char *)(watched + 16) = 1; /* ours: claimed, not passed on */
	ck_assert_int_eq(atomic_load(&claims), 1);
	ck_assert_int_eq(atomic_load(&seen.runs), 0);

	fault_other(); /* the program's */
	ck_assert_int_eq(atomic_load(&seen.runs), 1);
	ck_assert_ptr_eq(seen.addr, other + 8);
	ck_assert_int_eq(seen.code, SEGV_ACCERR);
	ck_assert(seen.usr1_blocked);  /* its sa_mask */
	ck_assert(!seen.segv_blocked); /* for real: blocked in the owner's view only (SO7) */
	ck_assert_int_eq(seen.claims_inside, 1);

	/* after the owner, as the agent's sigaction() gives it: replaces, returns the old */
	sa.sa_handler = plain_handler;
	sa.sa_flags = 0;
	sigemptyset(&sa.sa_mask);
	ck_assert_int_eq(pki_sigsegv_app_action(&sa, &old), 0);
	ck_assert_ptr_eq(old.sa_sigaction, app_handler);
	ck_assert(old.sa_flags & SA_SIGINFO);
	ck_assert(sigismember(&old.sa_mask, SIGUSR1));
	fault_other();
	ck_assert_int_eq(atomic_load(&seen.runs), 2);
	/* the kernel still has ours */
	ck_assert_int_eq(sigaction(SIGSEGV, NULL, &old), 0);
	ck_assert_ptr_ne(old.sa_sigaction, app_handler);
	ck_assert((void *)old.sa_handler != (void *)plain_handler);
	watch();
	*(volatile char *)watched = 3;
	ck_assert_int_eq(atomic_load(&claims), 3);

	/* the client leaves: the program's action is the kernel's again */
	ck_assert(pki_sigsegv_client_drop(PKI_SIGSEGV_PAGEWATCH));
	ck_assert(!pki_sigsegv_installed());
	ck_assert_int_eq(sigaction(SIGSEGV, NULL, &old), 0);
	ck_assert_ptr_eq((void *)old.sa_handler, (void *)plain_handler);
}
END_TEST

START_TEST(resethand_one_shot)
{
	struct sigaction sa = {.sa_handler = plain_handler, .sa_flags = SA_RESETHAND}, old;

	memset(&seen, 0, sizeof(seen));
	other = page(PROT_READ | PROT_WRITE);
	sigemptyset(&sa.sa_mask);
	ck_assert_int_eq(pki_sigsegv_client_add(PKI_SIGSEGV_PAGEWATCH, claim), 0);
	ck_assert_int_eq(pki_sigsegv_app_action(&sa, NULL), 0);
	fault_other();
	ck_assert_int_eq(atomic_load(&seen.runs), 1);
	ck_assert_int_eq(pki_sigsegv_app_action(NULL, &old), 0);
	ck_assert_ptr_eq((void *)old.sa_handler, (void *)SIG_DFL);
	watch();
	*(volatile char *)watched = 1; /* still ours */
	ck_assert_int_eq(atomic_load(&claims), 1);
}
END_TEST

/* How the child ends: @how runs after a claimed access. */
static int child_status(void (*how)(void))
{
	pid_t pid = fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct rlimit nocore = {0, 0};

		setrlimit(RLIMIT_CORE, &nocore);
		if (pki_sigsegv_client_add(PKI_SIGSEGV_PAGEWATCH, claim))
			_exit(10);
		watch();
		*(volatile char *)watched = 1;
		if (atomic_load(&claims) != 1)
			_exit(11);
		how();
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return st;
}

static char *volatile low = (char *)8; /* nothing mapped there */

static void null_store(void)
{
	*(volatile char *)low = 1;
}

static void die_default(void)
{
	struct sigaction dfl = {.sa_handler = SIG_DFL};

	sigemptyset(&dfl.sa_mask);
	pki_sigsegv_app_action(&dfl, NULL);
	null_store();
}

static void die_ignored(void)
{
	struct sigaction ign = {.sa_handler = SIG_IGN};

	sigemptyset(&ign.sa_mask);
	pki_sigsegv_app_action(&ign, NULL);
	raise(SIGSEGV); /* sent: ignored, as by the kernel */
	null_store();	/* a fault: forced, the process dies */
}

static void fault_inside(int sig)
{
	(void)sig;
	null_store(); /* SIGSEGV blocked in the handler (no SA_NODEFER): the kernel kills */
}

static void die_nested(void)
{
	struct sigaction sa = {.sa_handler = fault_inside};

	sigemptyset(&sa.sa_mask);
	pki_sigsegv_app_action(&sa, NULL);
	null_store();
}

START_TEST(default_action_dies_of_sigsegv)
{
	int st = child_status(die_default);

	ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "status %#x", st);
	st = child_status(die_ignored);
	ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "status %#x", st);
	st = child_status(die_nested);
	ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "status %#x", st);
}
END_TEST

/* SO5: a catcher's last flush runs before the default action, whoever came first. */
static int flush_fd;
static struct pki_fatal fatal;

static void on_fatal(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	if (write(flush_fd, "F", 1) != 1)
		_exit(12);
	pki_fatal_die(&fatal, sig, si);
}

static void catch_segv(void)
{
	static const int sigs[] = {SIGSEGV};

	fatal.handler = on_fatal;
	pki_fatal_catch(&fatal, sigs, 1);
}

static void catch_then_fault(void)
{
	catch_segv();
	null_store();
}

static int fallback_status(bool catcher_first, char *got)
{
	int fds[2], st;
	pid_t pid;

	ck_assert_int_eq(pipe(fds), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct rlimit nocore = {0, 0};

		setrlimit(RLIMIT_CORE, &nocore);
		close(fds[0]);
		flush_fd = fds[1];
		signal(SIGSEGV, SIG_DFL);
		if (catcher_first) {
			catch_segv();
			if (!fatal.caught[SIGSEGV])
				_exit(13);
		}
		if (pki_sigsegv_client_add(PKI_SIGSEGV_PAGEWATCH, claim))
			_exit(10);
		watch();
		*(volatile char *)watched = 1;
		if (atomic_load(&claims) != 1)
			_exit(11);
		if (catcher_first)
			null_store();
		catch_then_fault();
		_exit(0);
	}
	close(fds[1]);
	*got = 0;
	if (read(fds[0], got, 1) != 1)
		*got = 0;
	close(fds[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return st;
}

START_TEST(catcher_is_fallback)
{
	char got;
	int st = fallback_status(false, &got);

	ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "status %#x", st);
	ck_assert_int_eq(got, 'F');
	st = fallback_status(true, &got);
	ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "status %#x", st);
	ck_assert_int_eq(got, 'F');
}
END_TEST

/* SO5: the owner that leaves gives the catcher its handler back; the app's view is SIG_DFL. */
START_TEST(owner_leaves_catcher_stays)
{
	struct sigaction old;

	signal(SIGSEGV, SIG_DFL);
	catch_segv();
	ck_assert(fatal.caught[SIGSEGV]);
	ck_assert_int_eq(pki_sigsegv_client_add(PKI_SIGSEGV_PAGEWATCH, claim), 0);
	ck_assert_int_eq(pki_sigsegv_app_action(NULL, &old), 0);
	ck_assert_ptr_eq((void *)old.sa_handler, (void *)SIG_DFL);
	ck_assert(!(old.sa_flags & SA_SIGINFO));
	ck_assert(pki_sigsegv_client_drop(PKI_SIGSEGV_PAGEWATCH));
	ck_assert_int_eq(sigaction(SIGSEGV, NULL, &old), 0);
	ck_assert(old.sa_flags & SA_SIGINFO);
	ck_assert_ptr_eq(old.sa_sigaction, on_fatal);
	pki_fatal_release(&fatal);
	ck_assert_int_eq(sigaction(SIGSEGV, NULL, &old), 0);
	ck_assert_ptr_eq((void *)old.sa_handler, (void *)SIG_DFL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sigown");
	TCase *tc = tcase_create("sigsegv");

	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, claims_and_chains_before_and_after);
	tcase_add_test(tc, resethand_one_shot);
	tcase_add_test(tc, default_action_dies_of_sigsegv);
	tcase_add_test(tc, catcher_is_fallback);
	tcase_add_test(tc, owner_leaves_catcher_stays);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
