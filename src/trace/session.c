// SPDX-License-Identifier: MIT
/*
 * The session (one a process): open, close, flush, snapshot, exec and fork
 * (TX2), the calls naming things for the reader (TX3), and the three ways
 * a trace file is completed: close at exit (on_exit, at_quick_exit), exec,
 * fatal signal (TX4), each writing the trailer.  The state it starts and
 * resets is trace_int.h's pki_tw, defined here.  Calls every other file of
 * the recorder.  doc/design/trace-writer.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/fd.h"
#include "base/log.h"
#include "base/signals.h"
#include "trace/crc32.h"
#include "trace/hold.h"
#include "trace/info.h"
#include "trace/trace_int.h"

#define BUF_BUDGET     (64u << 20)   /* bytes of buffers before new ones shrink */
#define WAIT_SIGNAL_NS 2000000000ull /* a handler waits this long for the writer */
#define WAIT_ROOM_MS   2000u	     /* default opts.wait_ms */

bool pki_trace_use_tsc;
bool pki_trace_drop;
bool pki_trace_ring;
uint32_t pki_trace_session;

struct pki_tw_state pki_tw = {.f = PKI_FD_INIT};

/* Signals whose default action ends the process: flushed when still SIG_DFL. */
static const int fatal_signals[] = {SIGSEGV, SIGBUS,  SIGILL,  SIGFPE,	SIGABRT,   SIGSYS,
				    SIGTERM, SIGINT,  SIGHUP,  SIGQUIT, SIGXCPU,   SIGXFSZ,
				    SIGPIPE, SIGALRM, SIGUSR1, SIGUSR2, SIGVTALRM, SIGPROF};

/* ---- the trailer ------------------------------------------------------------ */

/* A ring session's end is a snapshot too: why, in TRIGGER's words. */
static uint32_t trigger_of(uint32_t end_reason)
{
	switch (end_reason) {
	case PKI_END_EXEC:
		return PKI_TRIGGER_EXEC;
	case PKI_END_SIGNAL:
		return PKI_TRIGGER_CRASH;
	default:
		return PKI_TRIGGER_EXIT;
	}
}

/* Write the trailer (a LOST record per thread, then END); caller holds the writer. */
static int emit_trailer(uint32_t reason, int signo)
{
	struct pki_rec_end end = {.reason = reason, .signo = (uint32_t)signo};
	struct iovec p = {&end, sizeof(end)};
	struct pki_trace_buf *b;
	uint64_t lost = pki_tw.gone_lost;
	int err;

	/*
	 * After writing stopped (ENOSPC...), the drain below counts what is
	 * left as lost and writes what fits of the per-thread LOST records
	 * into the reserve, then END, which always fits there.  Every record
	 * here is written as the trailer's (PKI_TW_TRAILER, writer.c).
	 */
	pki_tw.held_late = 0; /* counted below, after the drain (whose LOSSES, if any, lacks it) */
	if (pki_trace_ring)
		err = pki_tw_ring_snapshot(trigger_of(reason), signo, 0, true);
	else
		err = pki_tw_drain_or_count(true);
	if (err && !pki_tw.stop_err)
		goto out;
	pki_trace_clock_pair(pki_tw.ci.clock, &end.end_ticks, &end.end_mono_ns);
	/*
	 * Held calls still undecided: what they held comes too late (hold.h
	 * H6); counted afresh at each trailer (an exec that fails goes on).
	 */
	for (b = __atomic_load_n(&pki_tw.bufs, __ATOMIC_ACQUIRE); b; b = b->next) {
		lost += b->lost_reported - b->lost_base;
		pki_tw.held_late += pki_trace_hold_undecided(b);
	}
	end.late_lost = __atomic_load_n(&pki_tw.late_lost, __ATOMIC_RELAXED) + pki_tw.held_late;
	/* What the LOST records say, or all of it if some did not fit. */
	end.lost = pki_tw.stop_err ? pki_tw_lost_now() : lost + end.late_lost;
	end.recorded = pki_tw.recorded;
	end.nthreads = pki_tw.announced;
	if (reason == PKI_END_CLOSE)
		end.status = __atomic_load_n(&pki_tw.exit_status, __ATOMIC_ACQUIRE);
	pki_tw_emit_losses(true); /* the END record follows even if it did not fit */
	pki_tw.end_off = pki_tw.off;
	err = pki_tw_emit(PKI_REC_END, &p, 1, PKI_TW_TRAILER);
out:
	pki_tw_reserve_release();
	return err;
}

/* ---- fatal signals --------------------------------------------------------- */

/* The async-signal-safe end of a session: fatal signal, _exit(). */
static int flush_final(uint32_t reason, int signo)
{
	int st = ST_ACTIVE, err;

	if (getpid() != pki_tw.pid)
		return -EALREADY; /* a fork child before pki_trace_fork_child(): not its file */
	if (!__atomic_compare_exchange_n(&pki_tw.state, &st, ST_ENDING, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return -EALREADY;
	pki_tw_room_release(); /* waiters drop their events: they come after END */
	if (!pki_tw_lock_timed(WAIT_SIGNAL_NS))
		return -EBUSY; /* state stays ENDING: no one writes after us */
	err = emit_trailer(reason, signo);
	pki_tw_unlock();
	return err;
}

int pki_trace_flush_signal(int signo)
{
	int err;

	pki_trace_busy++; /* the flush's own calls are not events (trace.h) */
	pki_trace_hold_flush();
	err = flush_final(PKI_END_SIGNAL, signo);
	pki_trace_busy--;
	return err;
}

/*
 * Called by a process about to end in _exit(), perhaps from a signal
 * handler: blocks the fatal signals while it holds the writer word (TW1,
 * as for any normal-context writer; sigprocmask is async-signal-safe).
 */
int pki_trace_flush_exit(void)
{
	sigset_t saved;
	int err;

	pki_trace_busy++;
	pki_trace_hold_flush();
	sigprocmask(SIG_BLOCK, &pki_tw.fatal_set, &saved);
	err = flush_final(PKI_END_CLOSE, 0);
	sigprocmask(SIG_SETMASK, &saved, NULL);
	pki_trace_busy--;
	return err;
}

/*
 * Installed only for signals whose disposition was SIG_DFL, so the program
 * is about to die: flush, then let the signal kill it the way it would have.
 * For SIGSEGV while the library's SIGSEGV owner is installed (page
 * watchpoints), this is the owner's fallback instead of a handler of its
 * own (base/sigown.c, doc/design/signals.md SO5): the owner runs it before
 * the default action, whoever installed what first.
 * Async-signal-safe throughout.
 */
static void on_fatal(int signo, siginfo_t *si, void *uc)
{
	(void)uc;
	if (pki_trace_ring && signo == SIGUSR2 &&
	    getpid() == pki_tw.pid) { /* the trigger: not fatal then */
		pki_trace_snapshot(PKI_TRIGGER_SIGNAL, signo, 0);
		return;
	}
	pki_trace_flush_signal(signo);
	pki_fatal_die(&pki_tw.fatal, signo, si);
}

static void signals_install(void)
{
	pki_tw.fatal.handler = on_fatal;
	pki_fatal_catch(&pki_tw.fatal, fatal_signals,
			sizeof(fatal_signals) / sizeof(fatal_signals[0]));
}

static void signals_restore(void)
{
	pki_fatal_release(&pki_tw.fatal);
}

/* ---- session ---------------------------------------------------------------- */

void pki_trace_exit_status(int status)
{
	if (getpid() == pki_tw.pid) /* (a vfork child shares pki_tw: its exit is not ours) */
		__atomic_store_n(&pki_tw.exit_status, PKI_END_STATUS_KNOWN | PKI_END_STATUS(status),
				 __ATOMIC_RELEASE);
}

/* on_exit(), not atexit(): the END record says the status exit() was given. */
static void at_exit(int status, void *arg)
{
	(void)arg;
	pki_trace_exit_status(status);
	pki_trace_close();
}

/*
 * quick_exit() runs the at_quick_exit() handlers, then glibc's own _exit(),
 * out of an interposer's reach: the end of a session is written here, as
 * for _exit() (async-signal-safe: quick_exit() may be called from a
 * handler).  Registered before main(), so it runs after the program's own
 * handlers, whose events it keeps.
 */
static void at_quick_exit_flush(void)
{
	pki_trace_flush_exit();
}

/* Buffers left from an earlier session (same threads) start empty and clean. */
static void session_reset_bufs(void)
{
	struct pki_trace_buf *b;

	for (b = __atomic_load_n(&pki_tw.bufs, __ATOMIC_ACQUIRE); b; b = b->next) {
		__atomic_store_n(&b->tail, __atomic_load_n(&b->head, __ATOMIC_ACQUIRE),
				 __ATOMIC_RELEASE);
		b->lost_base = b->lost_reported = pki_tw_buf_lost(b);
		pki_tw_buf_kinds(b, b->kind_base);
		b->recorded = 0;
		b->announced = 0;
		b->tsn = __atomic_add_fetch(&pki_tw.next_tsn, 1, __ATOMIC_RELAXED);
	}
}

static int write_header(const char *program)
{
	struct pki_trace_prefix pre = {.magic = PKI_TRACE_MAGIC,
				       .version_major = PKI_TRACE_VERSION_MAJOR,
				       .version_minor = PKI_TRACE_VERSION_MINOR};
	struct pki_rec_header h = {
	    .clock = pki_tw.ci.clock,
	    .pid = (uint32_t)getpid(),
	    .ticks_per_sec = pki_tw.ci.ticks_per_sec,
	    .ref_ticks = pki_tw.ci.ref_ticks,
	    .ref_mono_ns = pki_tw.ci.ref_mono_ns,
	    .ref_real_ns = pki_tw.ci.ref_real_ns,
	    .buf_events = pki_tw.cap,
	};
	struct iovec p = {&pre, sizeof(pre)};
	int err;

	pre.crc = pki_crc32c(0, &pre, offsetof(struct pki_trace_prefix, crc));
	err = pki_tw_pwritev_all(pki_tw.f.fd, &p, 1, 0);
	if (err)
		return err;
	pki_tw.off = sizeof(pre);
	h.program_len = (uint32_t)strnlen(program, PKI_TRACE_MAX_STRING);
	return pki_tw_emit_string(PKI_REC_HEADER, &h, sizeof(h), program, h.program_len, 0);
}

/* The SESSION record, if @opts has one (right after HEADER: a reader may stop there). */
static int write_session(const struct pki_trace_opts *opts)
{
	struct pki_rec_session rec = {.id = opts->session, .flags = opts->session_flags};
	struct iovec v = {&rec, sizeof(rec)};

	return opts->session ? pki_tw_emit(PKI_REC_SESSION, &v, 1, 0) : 0;
}

/* The INFO records (after HEADER and SESSION): what was traced, where, by what. */
static int write_info(const struct pki_trace_info *in)
{
	int err = 0;

	for (size_t i = 0; i < in->n && !err; i++) {
		const struct pki_trace_info_item *it = &in->item[i];
		struct pki_rec_info r = {
		    .key_len = (uint32_t)strlen(it->key), .value_len = it->len, .flags = it->flags};
		struct iovec p[3] = {
		    {&r, sizeof(r)}, {(void *)it->key, r.key_len}, {(void *)it->value, it->len}};

		err = pki_tw_emit(PKI_REC_INFO, p, 3, 0);
	}
	return err;
}

/*
 * Create (or truncate) the trace file pki_tw.path, mode 0600 (it holds what the
 * program did).  In a directory others may write to (sticky /tmp, or one of
 * another user), whoever can write there may have planted the name we are
 * about to open: a symbolic link to another file, which O_TRUNC would
 * truncate, or a file of theirs.  There a link is never followed
 * (O_NOFOLLOW), a new file is created exclusively (O_EXCL), and an existing
 * one is used only if it is a regular file of ours with no other link,
 * checked before it is truncated.  Elsewhere, as a user expects: links
 * followed, an existing file overwritten.  A descriptor or -errno.
 */
static int file_create(void)
{
	char dir[PATH_MAX], *slash;
	struct stat st;
	int fd, err;

	snprintf(dir, sizeof(dir), "%s", pki_tw.path);
	slash = strrchr(dir, '/');
	if (slash)
		slash[slash == dir] = '\0'; /* "/x" -> "/" */
	if (stat(dir, &st))
		return -errno;
	if (!(st.st_mode & (S_IWGRP | S_IWOTH)) && (st.st_uid == geteuid() || st.st_uid == 0)) {
		fd = open(pki_tw.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		return fd < 0 ? -errno : fd;
	}
	fd = open(pki_tw.path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0 || errno != EEXIST)
		return fd < 0 ? -errno : fd;
	/* O_NONBLOCK: a planted FIFO must not block us here (refused below). */
	fd = open(pki_tw.path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		if (err == -ELOOP)
			pki_warn(
			    "trace %s: a symbolic link in a directory other users can write to: "
			    "not followed, refusing to write the trace there\n",
			    pki_tw.path);
		return err;
	}
	if (fstat(fd, &st)) {
		err = -errno;
		goto fail;
	}
	if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || st.st_nlink != 1) {
		pki_warn("trace %s: exists in a directory other users can write to and is not a "
			 "regular file of ours with a single link (owner uid %u): refusing to "
			 "truncate it\n",
			 pki_tw.path, (unsigned)st.st_uid);
		err = -EPERM;
		goto fail;
	}
	if (fcntl(fd, F_SETFL, 0) || ftruncate(fd, 0)) {
		err = -errno;
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return err;
}

/* pki_tw.path := @path, absolute (the program may chdir() before a reopen). */
static int set_path(const char *path)
{
	char cwd[PATH_MAX];
	int n;

	if (path[0] == '/') {
		n = snprintf(pki_tw.path, sizeof(pki_tw.path), "%s", path);
	} else {
		if (!getcwd(cwd, sizeof(cwd)))
			return -errno;
		n = snprintf(pki_tw.path, sizeof(pki_tw.path), "%s/%s", strcmp(cwd, "/") ? cwd : "",
			     path);
	}
	return n < 0 || (size_t)n >= sizeof(pki_tw.path) ? -ENAMETOOLONG : 0;
}

const char *pki_trace_open_hint(int err)
{
	switch (err) {
	case -ELOOP:
		return "a symbolic link in a directory other users can write to: not followed";
	case -EPERM:
		return "in a directory other users can write to, and not a regular file of "
		       "ours with a single link: not truncated";
	default:
		return NULL;
	}
}

/* Events per thread buffer: @opts' (default 64 Ki), rounded up to a power of two. */
static int buf_cap_get(const struct pki_trace_opts *opts, uint32_t *cap)
{
	uint32_t n = opts->buf_events ? opts->buf_events : 64u << 10;

	if (n < 16 || n > (1u << 28))
		return -EINVAL;
	*cap = 1u << (32 - __builtin_clz(n - 1));
	return 0;
}

/* This program's path into @exe ("" if unknown), for the HEADER. */
static const char *exe_path(char *exe, size_t size)
{
	ssize_t n = readlink("/proc/self/exe", exe, size - 1);

	exe[n > 0 ? n : 0] = '\0';
	return exe;
}

/* Create the trace file @path (or take @opts' descriptor) and own it in pki_tw.f; 0 or -errno. */
static int session_file_open(const char *path, const struct pki_trace_opts *opts)
{
	int err;

	err = set_path(path);
	if (err && opts->use_fd)
		close(opts->fd);
	if (!err)
		err = opts->use_fd ? opts->fd : file_create();
	if (err >= 0)
		err = pki_fd_own(&pki_tw.f, err);
	if (err)
		pki_warn("trace %s: open: %s\n", path, pki_errstr(err));
	return err;
}

/* Zero what a session counts and set what @opts decides: nothing of the last one is left. */
static void session_state_reset(const struct pki_trace_opts *opts, uint32_t cap)
{
	pki_tw.stop_err = pki_tw.lost_err = 0;
	pki_tw.stop_cause = PKI_STOP_ERROR;
	pki_tw.lost_ticks = pki_tw.reserved_to = 0;
	pki_tw.no_falloc = false;
	pki_tw.events_per_rec = EVENTS_PER_REC;
	pki_tw.notice = opts->notice;
	pki_tw.cap = cap;
	pki_tw.buf_budget = (size_t)cap * sizeof(struct pki_trace_event) * 2;
	if (pki_tw.buf_budget < BUF_BUDGET)
		pki_tw.buf_budget = BUF_BUDGET;
	pki_tw.io_err = 0;
	pki_tw.recorded = pki_tw.gone_lost = 0;
	memset(pki_tw.gone_kinds, 0, sizeof(pki_tw.gone_kinds));
	pki_tw.late_lost = pki_tw.held_late = 0;
	__atomic_add_fetch(&pki_trace_session, 1, __ATOMIC_RELEASE); /* (hold buffers: hold.h) */
	pki_tw.next_tsn = 0;
	pki_tw.nthreads = 0;
	pki_tw.announced = 0;
	pki_tw.drain_ms = opts->drain_ms ? opts->drain_ms : 5;
	pki_tw.wait_ns = (uint64_t)(opts->wait_ms ? opts->wait_ms : WAIT_ROOM_MS) * 1000000u;
	pki_tw.stalled = 0;
	pki_tw.waiters = 0;
	pki_trace_drop = opts->drop;
	pki_trace_ring = opts->ring; /* TR1 */
	pki_tw.pid = getpid();
	pki_tw.overwritten = pki_tw.snapshots = pki_tw.missed = 0;
	pki_tw.max_size = opts->max_size;
	pki_tw.exit_status = 0;
	session_reset_bufs();
	pki_trace_use_tsc = pki_tw.ci.clock == PKI_CLOCK_TSC;
}

/*
 * What ends the session: a fatal signal (@opts->catch_signals), exit()
 * (@opts->at_exit), and, in the child, fork().
 */
static void exit_hooks_install(const struct pki_trace_opts *opts)
{
	sigemptyset(&pki_tw.fatal_set);
	if (opts->catch_signals) {
		size_t i;

		signals_install();
		for (i = 0; i < sizeof(fatal_signals) / sizeof(fatal_signals[0]); i++)
			sigaddset(&pki_tw.fatal_set, fatal_signals[i]);
	}
	if (opts->at_exit && !pki_tw.atexit_done && !on_exit(at_exit, NULL))
		pki_tw.atexit_done = true;
	if (opts->at_exit && !pki_tw.at_quick_done && !at_quick_exit(at_quick_exit_flush))
		pki_tw.at_quick_done = true;
	if (!pki_tw.atfork_done && !pthread_atfork(NULL, NULL, pki_trace_fork_child))
		pki_tw.atfork_done = true;
}

int pki_trace_open(const char *path, const struct pki_trace_opts *opts)
{
	static const struct pki_trace_opts defaults = {.sz = sizeof(defaults)};
	struct pki_trace_info info;
	char exe[PATH_MAX];
	const char *program;
	uint32_t cap;
	int err;

	if (!opts)
		opts = &defaults;
	pki_crc32c_init();
	if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) != ST_IDLE)
		return -EBUSY;
	err = buf_cap_get(opts, &cap);
	if (err)
		return err;
	program = opts->program ? opts->program : exe_path(exe, sizeof(exe));
	err = pki_trace_clock_setup(opts->clock, &pki_tw.ci);
	if (err) {
		pki_warn("trace %s: clock %d: %s\n", path, opts->clock, pki_errstr(err));
		return err;
	}
	if (!pki_tw.key_made) {
		err = -pthread_key_create(&pki_tw.key, pki_tw_buf_release);
		if (err)
			return err;
		pki_tw.key_made = true;
	}
	if (opts->ring && (err = pki_tw_ring_setup(cap)))
		return err;
	pki_tw_pack_setup(opts->unpacked);
	err = session_file_open(path, opts);
	if (err)
		return err;
	session_state_reset(opts, cap);
	pki_trace_info_gather(&info, opts->command);
	err = write_header(program);
	if (!err)
		err = write_session(opts);
	if (!err)
		err = write_info(&info);
	if (err) {
		pki_warn("trace %s: write header: %s\n", path, pki_errstr(err));
		goto err_close;
	}
	exit_hooks_install(opts);
	/* Before ACTIVE: a buffer that fills before the thread starts may wait for it. */
	__atomic_store_n(&pki_tw.drainer_running, !opts->no_drainer, __ATOMIC_RELEASE);
	__atomic_store_n(&pki_tw.state, ST_ACTIVE, __ATOMIC_RELEASE);
	if (!opts->no_drainer) {
		err = pki_tw_drainer_start();
		if (err) {
			pki_warn("trace %s: drainer thread: %s\n", path, pki_errstr(err));
			goto err_active;
		}
	}
	return 0;

err_active:
	__atomic_store_n(&pki_tw.state, ST_IDLE, __ATOMIC_RELEASE);
	pki_tw_room_release();
	signals_restore();
err_close:
	pki_fd_close(&pki_tw.f);
	return err;
}

static int __trace_close(uint32_t reason);

int pki_trace_close(void)
{
	int err;

	pki_trace_busy++; /* the drain's and the trailer's calls are not events */
	err = __trace_close(PKI_END_CLOSE);
	pki_trace_busy--;
	return err;
}

int pki_trace_detach(void)
{
	int err;

	pki_trace_busy++;
	err = __trace_close(PKI_END_DETACH);
	pki_trace_busy--;
	return err;
}

static int __trace_close(uint32_t reason)
{
	int st = ST_ACTIVE, err;
	sigset_t saved;

	pki_trace_hold_flush(); /* (what this thread holds: the others' count as late) */
	if (!__atomic_compare_exchange_n(&pki_tw.state, &st, ST_ENDING, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE)) {
		/* ended by a fatal signal or exec_prepare: only tidy up */
		if (st == ST_IDLE)
			return 0;
		err = 0;
		pki_tw_drainer_stop();
		goto out;
	}
	pki_tw_drainer_stop();
	pki_tw_lock(&saved);
	err = emit_trailer(reason, 0);
	pki_tw_unlock_restore(&saved);
	if (pki_tw.io_err && !err)
		err = pki_tw.io_err;
	if (err)
		pki_warn("trace: writing the trace file: %s\n", pki_errstr(err));
out:
	signals_restore();
	pki_fd_close(&pki_tw.f);
	__atomic_store_n(&pki_tw.state, ST_IDLE, __ATOMIC_RELEASE);
	return err;
}

int pki_trace_flush(void)
{
	sigset_t saved;
	int err = -EBADF;

	pki_trace_busy++;
	pki_tw_lock(&saved);
	if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) != ST_ACTIVE)
		;
	else if (pki_trace_ring) /* a ring's events are written by snapshots only */
		err = pki_tw_ring_snapshot(PKI_TRIGGER_CALL, 0, 0, false);
	else
		err = pki_tw_drain_all(true, false, NULL);
	pki_tw_unlock_restore(&saved);
	pki_trace_busy--;
	return err;
}

int pki_trace_snapshot(uint32_t why, int signo, uint64_t fn)
{
	int saved_errno = errno, err = -EBUSY;
	sigset_t saved;

	if (!pki_trace_ring)
		return -EINVAL;
	if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) != ST_ACTIVE || getpid() != pki_tw.pid)
		return -EALREADY; /* (a fork child before pki_trace_fork_child(): not its file) */
	pki_trace_hold_flush();	  /* the calling thread's held calls are in it (hold.h H6) */
	pki_trace_busy++;
	sigprocmask(SIG_BLOCK, &pki_tw.fatal_set, &saved); /* TW1 */
	if (pki_tw_lock_timed(WAIT_SIGNAL_NS)) {
		err = -EALREADY;
		if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) == ST_ACTIVE)
			err = pki_tw_ring_snapshot(why, signo, fn, false);
		pki_tw_unlock();
	} else {
		/* said in the next TRIGGER */
		__atomic_fetch_add(&pki_tw.missed, 1, __ATOMIC_RELAXED);
	}
	sigprocmask(SIG_SETMASK, &saved, NULL);
	pki_trace_busy--;
	errno = saved_errno;
	return err;
}

int pki_trace_object_add(uint32_t id, uint64_t base, const char *path)
{
	struct pki_rec_object o = {.id = id, .base = base};
	sigset_t saved;
	int err = -EBADF;

	if (!id || !path)
		return -EINVAL;
	o.path_len = (uint32_t)strnlen(path, PKI_TRACE_MAX_STRING);
	pki_tw_lock(&saved);
	if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) == ST_ACTIVE)
		err = pki_tw_emit_string(PKI_REC_OBJECT, &o, sizeof(o), path, o.path_len, 0);
	pki_tw_unlock_restore(&saved);
	return err;
}

int pki_trace_symbol_add(uint64_t fn, uint32_t object_id, const char *name)
{
	struct pki_rec_symbol s = {.fn = fn, .object_id = object_id};
	sigset_t saved;
	int err = -EBADF;

	if (!name || fn > PKI_EV_FN_MAX)
		return -EINVAL;
	s.name_len = (uint32_t)strnlen(name, PKI_TRACE_MAX_STRING);
	pki_tw_lock(&saved);
	if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) == ST_ACTIVE)
		err = pki_tw_emit_string(PKI_REC_SYMBOL, &s, sizeof(s), name, s.name_len, 0);
	pki_tw_unlock_restore(&saved);
	return err;
}

int pki_trace_args_add(uint64_t fn, const char *spec)
{
	struct pki_rec_args a = {.fn = fn};
	sigset_t saved;
	int err = -EBADF;

	if (!spec || fn > PKI_EV_FN_MAX)
		return -EINVAL;
	a.spec_len = (uint32_t)strnlen(spec, PKI_TRACE_MAX_STRING);
	pki_tw_lock(&saved);
	if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) == ST_ACTIVE)
		err = pki_tw_emit_string(PKI_REC_ARGS, &a, sizeof(a), spec, a.spec_len, 0);
	pki_tw_unlock_restore(&saved);
	return err;
}

/* One SYMBOL record, framed and padded, into @out (room for it checked); its length. */
static size_t symbol_rec(uint8_t *out, uint64_t fn, uint32_t object_id, const char *name)
{
	struct pki_rec_symbol s = {.fn = fn, .object_id = object_id};
	struct pki_trace_frame fr = {.type = PKI_REC_SYMBOL};
	size_t len, pad;

	s.name_len = (uint32_t)strnlen(name, PKI_TRACE_MAX_STRING);
	len = sizeof(s) + s.name_len;
	pad = (8 - len % 8) % 8;
	fr.len = (uint32_t)len;
	fr.crc = pki_crc32c(pki_crc32c(0, &s, sizeof(s)), name, s.name_len);
	memcpy(out, &fr, sizeof(fr));
	memcpy(out + sizeof(fr), &s, sizeof(s));
	memcpy(out + sizeof(fr) + sizeof(s), name, s.name_len);
	memset(out + sizeof(fr) + len, 0, pad);
	return sizeof(fr) + len + pad;
}

int pki_trace_symbols_add(const struct pki_trace_symdef *v, size_t n)
{
	enum {
		CHUNK = 64u << 10,
		MAX_REC = sizeof(struct pki_trace_frame) + sizeof(struct pki_rec_symbol) +
			  PKI_TRACE_MAX_STRING + 8
	};
	uint8_t *buf = malloc(CHUNK);
	sigset_t saved;
	size_t i = 0;
	int err = 0;

	if (!buf)
		return -ENOMEM;
	pki_tw_lock(&saved);
	if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) != ST_ACTIVE)
		err = -EBADF;
	while (!err && i < n) {
		size_t len = 0;

		/*
		 * Records in the chunk, one write; CRC of a record is over its
		 * payload only (format.h), so a chunk is the records as
		 * pki_tw_emit() would write them one by one.
		 */
		for (; i < n && len + MAX_REC <= CHUNK; i++) {
			if (!v[i].name || v[i].fn > PKI_EV_FN_MAX)
				continue;
			len += symbol_rec(buf + len, v[i].fn, v[i].object_id, v[i].name);
		}
		if (len) {
			struct iovec io = {buf, len};

			err = pki_tw_emit_iov(PKI_REC_SYMBOL, &io, 1, len, 0);
		}
	}
	pki_tw_unlock_restore(&saved);
	free(buf);
	return err;
}

/*
 * The drainer keeps running across exec_prepare (it idles unless ACTIVE): if
 * exec succeeds it vanishes with the image; if it fails, nothing to restart.
 */
int pki_trace_exec_prepare(void)
{
	int st = ST_ACTIVE, err;
	sigset_t saved;

	pki_trace_hold_flush();
	if (!__atomic_compare_exchange_n(&pki_tw.state, &st, ST_ENDING, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return -EBADF;
	pki_tw_room_release(); /* waiters drop their events: they come after END */
	pki_tw_lock(&saved);
	err = emit_trailer(PKI_END_EXEC, 0);
	__atomic_store_n(&pki_tw.state, ST_EXEC, __ATOMIC_RELEASE);
	pki_tw_unlock_restore(&saved);
	return err;
}

int pki_trace_exec_failed(void)
{
	int st = ST_EXEC, err = 0;
	sigset_t saved;

	pki_tw_lock(&saved);
	if (!__atomic_compare_exchange_n(&pki_tw.state, &st, ST_ACTIVE, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE)) {
		err = -EBADF;
	} else if (pki_tw_file_ready(0) || ftruncate(pki_tw.f.fd, (off_t)pki_tw.end_off)) {
		err = pki_tw.f.fd < 0 ? -EBADF : -errno;
	} else {
		pki_tw.off = pki_tw.end_off;
	}
	pki_tw_unlock_restore(&saved);
	return err;
}

/*
 * Fork child: only the forking thread exists here, and everything below is a
 * private copy.  The parent's other buffers belong to threads that do not
 * exist in the child (their events are the parent's to write): unmap them.
 * The file description is shared with the parent: close our fd unwritten.
 */
void pki_trace_fork_child(void)
{
	struct pki_trace_buf *self = pki_trace_tls, *b, *next;

	if (__atomic_load_n(&pki_tw.state, __ATOMIC_ACQUIRE) == ST_IDLE)
		return;
	if (self && self != &pki_tw_internal_buf && self != &pki_tw_gone_buf)
		pki_trace_tls = self = pki_trace_hold_fork_child(self);
	for (b = pki_tw.bufs; b; b = next) {
		next = b->next;
		if (b != self)
			pki_tw_buf_free(b);
	}
	pki_tw.bufs = NULL;
	pki_tw.buf_mem = 0;
	if (self && self != &pki_tw_internal_buf && self != &pki_tw_gone_buf) {
		pki_tw.buf_mem = self->map_len;
		self->next = NULL;
		self->tid = (uint32_t)gettid();
		pki_tw.bufs = self;
	}
	signals_restore();
	pki_fd_close(&pki_tw.f);
	pki_tw.writer = 0;
	pki_tw.drainer_running = false; /* it does not exist here: nobody waits for room */
	pki_tw.wake = 0;
	pki_tw.waiters = 0; /* the threads that were waiting are the parent's */
	pki_tw.stalled = 0;
	__atomic_store_n(&pki_tw.state, ST_IDLE, __ATOMIC_RELEASE);
}

void pki_trace_counts(struct pki_trace_counts *c)
{
	struct pki_trace_buf *b;
	sigset_t saved;

	memset(c, 0, sizeof(*c));
	pki_tw_lock(&saved);
	c->recorded = pki_tw.recorded;
	c->late_lost = __atomic_load_n(&pki_tw.late_lost, __ATOMIC_RELAXED);
	c->lost = pki_tw.gone_lost + c->late_lost;
	for (b = __atomic_load_n(&pki_tw.bufs, __ATOMIC_ACQUIRE); b; b = b->next)
		c->lost += pki_tw_buf_lost(b) - b->lost_base;
	c->threads = __atomic_load_n(&pki_tw.nthreads, __ATOMIC_RELAXED);
	c->overwritten = pki_tw.overwritten;
	c->snapshots = pki_tw.snapshots;
	pki_tw_unlock_restore(&saved);
}
