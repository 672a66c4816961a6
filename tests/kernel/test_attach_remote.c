// SPDX-License-Identifier: MIT
/*
 * The x86-64 remote primitives (src/arch/x86_64/remote.h) on a forked
 * child, which shares this binary's addresses: a remote system call and a
 * remote call return their results, and the child, its registers restored
 * verbatim (A6 of doc/design/attach.md), goes on as if nothing happened:
 * a nanosleep interrupted by the stop restarts with its remaining time
 * (-ERESTART_RESTARTBLOCK) and a read of a pipe restarts (-ERESTARTSYS).
 * Needs ptrace of one's own child (skips where Yama 3 or a seccomp
 * filter forbids it).
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "arch/arch.h"
#include "harness.h"

static int pipefd[2];

__attribute__((noinline)) uint64_t pkt_remote_add3(uint64_t a, uint64_t b, uint64_t c)
{
	return a * 100 + b * 10 + c;
}

/* The child: 0 if its call ran its full length/returned its byte, else 1. */
static void child_sleep(void)
{
	struct timespec ts = {0, 300000000}, t0, t1;
	long ns;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (nanosleep(&ts, NULL))
		_exit(2);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ns = (t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec);
	_exit(ns >= 300000000L ? 0 : 1);
}

static void child_read(void)
{
	char c;

	_exit(read(pipefd[0], &c, 1) == 1 && c == 'x' ? 0 : 3);
}

/* Seize @pid, stop it, save its state. */
static void seize(pid_t pid, struct pki_remote_regs *saved)
{
	int st;

	ck_assert_int_eq(ptrace(PTRACE_SEIZE, pid, NULL, NULL), 0);
	ck_assert_int_eq(ptrace(PTRACE_INTERRUPT, pid, NULL, NULL), 0);
	ck_assert_int_eq(waitpid(pid, &st, __WALL), pid);
	ck_assert(WIFSTOPPED(st) && st >> 16 == PTRACE_EVENT_STOP);
	ck_assert_int_eq(pki_remote_regs_save(pid, saved), 0);
}

/* A `syscall` instruction the child can execute: in libc's syscall(3). */
static uint64_t syscall_insn(void)
{
	const uint8_t *fn = (const uint8_t *)(uintptr_t)syscall;
	long off = pki_remote_find_syscall(fn, 128);

	ck_assert(off >= 0);
	return (uint64_t)(uintptr_t)fn + (uint64_t)off;
}

static int run(void (*body)(void), bool write_after, long want_ret)
{
	struct pki_remote_regs saved;
	const uint64_t margs[6] = {
	    0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, (uint64_t)-1,
	    0};
	uint64_t args[6] = {0}, ret = 0;
	long sret = 0, area = 0;
	void *stack;
	pid_t pid;
	int st, sig = 0;

	ck_assert_int_eq(pipe(pipefd), 0);
	stack = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(stack, MAP_FAILED);
	pid = fork();
	if (pid == 0)
		body();
	usleep(50000); /* into its call */
	seize(pid, &saved);
	ck_assert_int_eq(pki_remote_syscall_nr(&saved) >= 0, 1);
	ck_assert_int_eq(pki_remote_syscall_ret(&saved), want_ret);

	/* A remote getpid. */
	ck_assert_int_eq(
	    pki_remote_syscall(pid, &saved, syscall_insn(), SYS_getpid, args, &sret, &sig),
	    PKI_REMOTE_DONE);
	ck_assert_int_eq(sret, pid);
	/* A remote mmap for the int3 the call returns into. */
	ck_assert_int_eq(
	    pki_remote_syscall(pid, &saved, syscall_insn(), SYS_mmap, margs, &area, &sig),
	    PKI_REMOTE_DONE);
	ck_assert(area > 0);
	ck_assert_int_eq(ptrace(PTRACE_POKEDATA, pid, (void *)area, (void *)0xccccccccccccccccull),
			 0);
	/* A remote call, on the stack mapped before the fork (the child has it too). */
	args[0] = 7;
	args[1] = 8;
	args[2] = 9;
	ck_assert_int_eq(pki_remote_call(pid, &saved, (uint64_t)(uintptr_t)pkt_remote_add3, args,
					 (uint64_t)(uintptr_t)stack + 65536, (uint64_t)area, &ret,
					 &sig),
			 PKI_REMOTE_DONE);
	ck_assert_uint_eq(ret, 789);
	/* A6: everything back as it was, then released. */
	ck_assert_int_eq(pki_remote_regs_restore(pid, &saved), 0);
	ck_assert_int_eq(ptrace(PTRACE_DETACH, pid, NULL, NULL), 0);
	pki_remote_regs_free(&saved);
	if (write_after) {
		usleep(20000);
		ck_assert_int_eq(write(pipefd[1], "x", 1), 1);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st));
	return WEXITSTATUS(st);
}

START_TEST(restart_nanosleep)
{
	/* nanosleep interrupted: -ERESTART_RESTARTBLOCK (516), resumed with its remaining time */
	ck_assert_int_eq(run(child_sleep, false, -516), 0);
}
END_TEST

START_TEST(restart_read)
{
	/* read of an empty pipe interrupted: -ERESTARTSYS (512), restarted, gets the byte */
	ck_assert_int_eq(run(child_read, true, -512), 0);
}
END_TEST

START_TEST(find_syscall)
{
	static const uint8_t none[] = {0x90, 0x0f, 0x90, 0x05};
	static const uint8_t one[] = {0x90, 0x48, 0x0f, 0x05, 0xc3};

	ck_assert_int_eq(pki_remote_find_syscall(none, sizeof(none)), -1);
	ck_assert_int_eq(pki_remote_find_syscall(one, sizeof(one)), 2);
	ck_assert_int_eq(pki_remote_find_syscall(one, 3), -1);
}
END_TEST

static void require_ptrace(void)
{
	pid_t pid = fork();
	int st, ok;

	if (pid == 0) {
		pause();
		_exit(0);
	}
	ok = ptrace(PTRACE_SEIZE, pid, NULL, NULL) == 0;
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	if (!ok) {
		printf("SKIP: cannot ptrace a child here: %s\n", strerror(errno));
		exit(77);
	}
}

int main(void)
{
	Suite *s = suite_create("attach_remote");
	TCase *tc = tcase_create("remote");

	require_ptrace();
	tcase_add_test(tc, find_syscall);
	tcase_add_test(tc, restart_nanosleep);
	tcase_add_test(tc, restart_read);
	suite_add_tcase(s, tc);
	return pk_test_run(s);
}
