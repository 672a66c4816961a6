// SPDX-License-Identifier: MIT
/*
 * The trace writer: session state, per-thread buffer allocation, the drainer
 * thread (TD1, TD2), the file (TF1-TF3) under the writer word (TW1-TW3), the
 * flight recorder (TR1, TR2), and the three ways a trace file is completed
 * (close at exit, exec, fatal signal).  The hot path is inline in trace.h;
 * this file holds everything that runs outside it.
 * doc/design/trace-writer.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <linux/falloc.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/fd.h"
#include "base/futex.h"
#include "base/log.h"
#include "base/signals.h"
#include "trace/crc32.h"
#include "trace/hold.h"
#include "trace/info.h"
#include "trace/pack.h"
#include "trace/trace.h"

__thread struct pki_trace_buf *pki_trace_tls __attribute__((tls_model("initial-exec")));
__thread unsigned pki_trace_busy __attribute__((tls_model("initial-exec")));
bool pki_trace_use_tsc;
bool pki_trace_drop;
bool pki_trace_ring;
uint32_t pki_trace_session;

enum {
	ST_IDLE,   /* no session: threads without a buffer record nothing */
	ST_ACTIVE, /* recording and draining */
	ST_ENDING, /* someone is writing the END record */
	ST_EXEC,   /* END written for an exec that has not happened yet */
};

#define EVENTS_PER_REC 65536u
#define EVENTS_MIN_REC 16u /* records shrink down to this when the file system fills */
#define ALTSTACK_LEN   (64u << 10)
#define BUF_HDR_LEN    4096u
#define BUF_MIN_EVENTS 1024u	     /* a buffer shrunk to fit the budget: not below */
#define BUF_BUDGET     (64u << 20)   /* bytes of buffers before new ones shrink */
#define WAIT_SIGNAL_NS 2000000000ull /* a handler waits this long for the writer */
#define WAIT_ROOM_MS   2000u	     /* default opts.wait_ms */
#define SPIN_ROOM      512u	     /* pause loops before a full buffer sleeps */
#define NAP_ROOM_NS    10000000l     /* each futex sleep of a waiter, at most */
/* Kept allocated past the end of the file: the STATUS record and the trailer. */
#define RESERVE_LEN	(16u << 10)
#define END_REC_LEN	(sizeof(struct pki_trace_frame) + sizeof(struct pki_rec_end))
#define REOPEN_RETRY_NS 1000000000ull /* a lost descriptor: try the path again this often */

/*
 * Sentinel buffers: busy forever, so the inline path always falls to the slow
 * path, which tells them apart.  internal_buf marks our own drainer thread
 * (its events are not the program's); gone_buf a thread past its exit
 * destructor (its events are counted in late_lost).
 */
static struct pki_trace_buf internal_buf = {.busy = 1};
static struct pki_trace_buf gone_buf = {.busy = 1};
/*
 * initial-exec like pki_trace_tls: a dynamic TLS access could allocate.
 * tls_alloc_lost: events of this thread's signal handlers while buf_new()
 * made its buffer (pki_trace_record_slow()).
 */
static __thread int tls_allocating __attribute__((tls_model("initial-exec")));
static __thread unsigned int tls_alloc_lost __attribute__((tls_model("initial-exec")));

static struct {
	int state;  /* atomic, ST_* */
	int writer; /* atomic: tid holding the right to write the file, or 0 */
	/*
	 * The file, writer only.  f.fd < 0 while the session runs: the program
	 * closed or replaced our descriptor and the path could not be reopened
	 * yet (lost_err says why); events are then counted as lost.
	 */
	struct pki_fd f;
	char path[PATH_MAX];	 /* absolute: the program may chdir() */
	int stop_err;		 /* writing failed (-ENOSPC...): events are lost from here */
	uint32_t stop_cause;	 /* PKI_STOP_*: what stop_err means */
	int lost_err;		 /* the descriptor is lost and reopening failed with this */
	uint64_t lost_ticks;	 /* when the descriptor was found lost */
	uint64_t lost_try;	 /* mono ns of the last reopen attempt */
	uint64_t reserved_to;	 /* file blocks allocated up to here (fallocate) */
	bool no_falloc;		 /* the file cannot be preallocated: no reserve */
	bool in_trailer;	 /* writing the trailer or a STATUS: into the reserve */
	bool may_shrink;	 /* an EVENTS record that could be smaller: ENOSPC is not final */
	uint32_t events_per_rec; /* EVENTS_PER_REC, less once the file system is nearly full */
	uint8_t *pack;		 /* writer only: one PACKED record's bytes, or NULL (EVENTS) */
	void (*notice)(const char *line);
	uint64_t off;	  /* where the next record goes; writer only */
	uint64_t end_off; /* where the END record went (exec_failed truncates there) */
	int io_err;	  /* first write error, reported at close */
	struct pki_trace_clockinfo ci;
	uint32_t cap;
	size_t buf_mem;		    /* atomic: bytes of the buffers mapped (live and unreaped) */
	size_t buf_budget;	    /* see buf_new() */
	struct pki_trace_buf *bufs; /* atomic head; see buf_unlink() */
	uint32_t next_tsn;	    /* atomic */
	uint32_t nthreads;	    /* atomic: buffers made this session */
	uint32_t announced;	    /* writer only: THREAD records written */
	uint64_t late_lost;	    /* atomic */
	uint64_t held_late;	    /* held calls undecided at the trailer (hold.h H6) */
	uint64_t recorded;	    /* writer only: events in the file */
	uint64_t gone_lost;	    /* writer only: lost counts of freed buffers */
	uint64_t gone_kinds[4];	    /* writer only: the same by cause (LK_*) */

	uint32_t wake; /* atomic futex word: 1 = drainer armed to sleep; see drainer_main() */
	pthread_t drainer;
	bool drainer_running; /* atomic: read by waiters */
	/* waiting for room: see pki_trace_record_full() */
	uint32_t room;	  /* atomic futex word: bumped by every drain that freed slots */
	uint32_t waiters; /* atomic: threads asleep (or about to be) on room */
	int stalled;	  /* atomic: the drainer failed to write, or a wait timed out */
	uint64_t wait_ns; /* opts.wait_ms */
	bool stop;	  /* atomic */
	uint32_t drain_ms;
	pid_t pid;	      /* the session's process: a fork child, until its atfork
				 handler ran, must not write the parent's file */
	uint64_t max_size;    /* opts.max_size, or 0 */
	uint32_t exit_status; /* atomic: END.status (PKI_END_STATUS_KNOWN | status), or 0 */

	pthread_key_t key;
	bool key_made, atexit_done, at_quick_done, atfork_done;
	struct pki_fatal fatal; /* the fatal signals we flush on (signals_install) */
	sigset_t fatal_set;
} S = {.f = PKI_FD_INIT};

/* Signals whose default action ends the process: flushed when still SIG_DFL. */
static const int fatal_signals[] = {SIGSEGV, SIGBUS,  SIGILL,  SIGFPE,	SIGABRT,   SIGSYS,
				    SIGTERM, SIGINT,  SIGHUP,  SIGQUIT, SIGXCPU,   SIGXFSZ,
				    SIGPIPE, SIGALRM, SIGUSR1, SIGUSR2, SIGVTALRM, SIGPROF};

/*
 * Slots were freed, or the session is ending: wake the threads waiting for
 * room (TD1).  Async-signal-safe; errno may change.
 */
static void room_release(void)
{
	__atomic_add_fetch(&S.room, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&S.waiters, __ATOMIC_SEQ_CST))
		pki_futex_wake(&S.room, INT_MAX);
}

/* ---- the writer word (TW1-TW3 of doc/design/trace-writer.md) ----------- */
static bool writer_lock_timed(uint64_t timeout_ns)
{
	int self = gettid(), zero;
	uint64_t t0 = 0;

	for (;;) {
		zero = 0;
		if (__atomic_compare_exchange_n(&S.writer, &zero, self, false, __ATOMIC_ACQUIRE,
						__ATOMIC_RELAXED))
			return true;
		if (zero == self) /* TW2 */
			return false;
		if (timeout_ns != UINT64_MAX) {
			uint64_t now = pki_trace_mono_ns();

			if (!t0)
				t0 = now;
			else if (now - t0 > timeout_ns)
				return false;
		}
		sched_yield();
	}
}

static void writer_unlock(void)
{
	__atomic_store_n(&S.writer, 0, __ATOMIC_RELEASE);
}

/* Normal context: block the fatal signals (TW1), then take the word. */
static void writer_lock(sigset_t *saved)
{
	pthread_sigmask(SIG_BLOCK, &S.fatal_set, saved);
	writer_lock_timed(UINT64_MAX);
}

static void writer_unlock_restore(const sigset_t *saved)
{
	writer_unlock();
	pthread_sigmask(SIG_SETMASK, saved, NULL);
}

/* ---- records (async-signal-safe: pwritev, CRC, no allocation) ------------ */

static int pwritev_all(int fd, struct iovec *iov, int n, uint64_t off)
{
	while (n) {
		ssize_t w = pwritev(fd, iov, n, (off_t)off);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (w == 0)
			return -EIO;
		off += (uint64_t)w;
		while (n && (size_t)w >= iov->iov_len) {
			w -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n) {
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
	return 0;
}

/* ---- the file (writer only; async-signal-safe: syscalls, no stdio) ------- */
/*
 * Whole records (TF1), a descriptor checked and reopened (TF2), failures
 * cut off (TF3): doc/design/trace-writer.md.
 */

static size_t cat(char *buf, size_t n, size_t cap, const char *s)
{
	while (*s && n + 1 < cap)
		buf[n++] = *s++;
	buf[n] = '\0';
	return n;
}

/*
 * "probekit: trace PATH: @what (strerror(@err))@rest" to the notice
 * callback.  strerrordesc_np() returns a constant string: no locale, no
 * allocation, unlike strerror().
 */
static void say(const char *what, int err, const char *rest)
{
	char buf[PATH_MAX + 512];
	size_t n = 0;

	if (!S.notice)
		return;
	n = cat(buf, n, sizeof(buf), "probekit: trace ");
	n = cat(buf, n, sizeof(buf), S.path);
	n = cat(buf, n, sizeof(buf), ": ");
	n = cat(buf, n, sizeof(buf), what);
	if (err) {
		const char *e = strerrordesc_np(err < 0 ? -err : err);

		n = cat(buf, n, sizeof(buf), " (");
		n = cat(buf, n, sizeof(buf), e ? e : "unknown error");
		n = cat(buf, n, sizeof(buf), ")");
	}
	n = cat(buf, n, sizeof(buf), rest);
	cat(buf, n, sizeof(buf), "\n");
	S.notice(buf);
}

static uint64_t buf_lost(struct pki_trace_buf *b);
static int emit_losses(void);
static int emit(uint32_t type, const struct iovec *parts, int n);

/* Every event lost so far: all threads, freed buffers, late_lost. */
static uint64_t lost_now(void)
{
	uint64_t lost = S.gone_lost + __atomic_load_n(&S.late_lost, __ATOMIC_RELAXED);
	struct pki_trace_buf *b;

	for (b = __atomic_load_n(&S.bufs, __ATOMIC_ACQUIRE); b; b = b->next)
		lost += buf_lost(b) - b->lost_base;
	return lost;
}

static int emit_status(uint32_t what, int err, uint64_t ticks)
{
	struct pki_rec_status st = {.what = what, .error = err < 0 ? -err : err, .ticks = ticks};
	struct iovec p = {&st, sizeof(st)};
	bool was = S.in_trailer;
	int ret;

	st.lost = lost_now();
	S.in_trailer = true; /* into the reserve, even after writing stopped */
	ret = emit(PKI_REC_STATUS, &p, 1);
	S.in_trailer = was;
	return ret;
}

/*
 * Is S.f still our file?  If the program closed or replaced the descriptor,
 * reopen S.path, but only if it still is the same file (device, inode) and
 * no shorter than what we wrote: never a file put in its place.  Say so in
 * the file (STATUS: STOPPED if events were lost meanwhile, RESUMED) and to
 * the notice callback.  0, or -errno: nothing may be written now.
 */
static int file_ready(void)
{
	struct stat st;
	uint64_t now;
	int fd, err;

	if (pki_fd_check(&S.f))
		return 0;
	now = pki_trace_mono_ns();
	if (!S.lost_ticks)
		S.lost_ticks = pki_trace_now() | 1;
	else if (S.lost_err && !S.in_trailer && now - S.lost_try < REOPEN_RETRY_NS)
		return S.lost_err;
	S.lost_try = now;
	fd = open(S.path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
	} else if (fstat(fd, &st) || !pki_fd_same(&S.f, st.st_dev, st.st_ino) ||
		   (uint64_t)st.st_size < S.off) {
		close(fd);
		err = -ESTALE;
	} else {
		err = pki_fd_own(&S.f, fd);
	}
	if (err) {
		if (!S.lost_err)
			say("PROG closed or replaced the trace's descriptor; cannot reopen the "
			    "file",
			    err, ": tracing stopped; later events are counted as lost");
		S.lost_err = err;
		return err;
	}
	S.reserved_to = 0;
	if (S.lost_err)
		emit_status(PKI_STATUS_STOPPED, S.lost_err, S.lost_ticks);
	emit_status(PKI_STATUS_RESUMED, EBADF, pki_trace_now());
	say(S.lost_err ? "PROG closed or replaced the trace's descriptor; reopened the file, "
			 "tracing resumed (events meanwhile counted as lost)"
		       : "PROG closed or replaced the trace's descriptor; reopened the file, "
			 "tracing goes on",
	    0, "");
	S.lost_err = 0;
	S.lost_ticks = 0;
	return 0;
}

/*
 * Keep RESERVE_LEN allocated past the record about to be written, so the
 * STATUS record and the trailer fit when the file system fills up.  Only a
 * full file system (or quota) is an error; a file that cannot be
 * preallocated (pipe, device, some file systems) goes without.  Not @keep
 * (the trailer's STATUS, LOST and END): written into the reserve.
 */
static int reserve(uint64_t len, bool keep)
{
	uint64_t want = S.off + len + RESERVE_LEN;

	if (!keep || S.no_falloc || want <= S.reserved_to)
		return 0;
	while (fallocate(S.f.fd, FALLOC_FL_KEEP_SIZE, (off_t)S.off, (off_t)(want - S.off))) {
		if (errno == EINTR)
			continue;
		if (errno == ENOSPC || errno == EDQUOT)
			return -errno;
		S.no_falloc = true;
		return 0;
	}
	S.reserved_to = want;
	return 0;
}

/* Give back the reserve past the end (the trace is complete). */
static void reserve_release(void)
{
	if (S.f.fd >= 0 && S.reserved_to > S.off)
		fallocate(S.f.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)S.off,
			  (off_t)(S.reserved_to - S.off));
	S.reserved_to = 0;
}

/*
 * Writing @err'd (@cause: PKI_STOP_*): cut the part of the record that was
 * written (a reader keeps every whole record before it), stop writing
 * events, say why.  Also in the trailer: what it writes next goes into the
 * reserve, and its drain counts the rest as lost (a record size that would
 * shrink without end spun here once).
 */
static void write_failed(int err, uint32_t cause)
{
	static const char stopped_rest[] = ": tracing stopped; the file keeps every event written "
					   "before, later ones are counted as lost";

	if (!S.io_err)
		S.io_err = err;
	if (S.f.fd >= 0 && ftruncate(S.f.fd, (off_t)S.off)) {
		/* nothing better to do: the reader stops at the cut record */
	}
	if (S.stop_err)
		return;
	S.stop_err = err;
	S.stop_cause = cause;
	emit_status(PKI_STATUS_STOPPED, err, pki_trace_now());
	emit_losses();
	if (cause == PKI_STOP_MAX_SIZE)
		say("the file reached its --max-size", 0, stopped_rest);
	else if (cause == PKI_STOP_FSIZE)
		say("the file reached the file size limit (ulimit -f, RLIMIT_FSIZE)", 0,
		    stopped_rest);
	else
		say("cannot write the file", err, stopped_rest);
}

/*
 * How large the file may grow: opts.max_size, or the process's file size
 * limit (RLIMIT_FSIZE, read afresh: the program or prlimit(1) may change
 * it), whichever is lower; *@cause says which (PKI_STOP_*).  A write that
 * reaches RLIMIT_FSIZE would raise SIGXFSZ, whose default action kills the
 * program: no record is written across it.
 */
static uint64_t size_limit(uint32_t *cause)
{
	uint64_t lim = S.max_size ? S.max_size : UINT64_MAX;
	struct rlimit rl;

	*cause = PKI_STOP_MAX_SIZE;
	if (!getrlimit(RLIMIT_FSIZE, &rl) && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < lim) {
		lim = rl.rlim_cur;
		*cause = PKI_STOP_FSIZE;
	}
	return lim;
}

/* The records that carry events: EVENTS, or PACKED. */
static bool events_rec(uint32_t type)
{
	return type == PKI_REC_EVENTS || type == PKI_REC_PACKED;
}

/*
 * Does a record of @len bytes (frame and padding included) of @type fit
 * under size_limit()?  EVENTS, and any record outside the trailer, leave
 * RESERVE_LEN for the STATUS record and the trailer; the trailer's records
 * leave room for END.  If not, writing stops (an EVENTS record that may
 * shrink only returns -EFBIG: its caller tries a smaller one).
 */
static int size_check(uint32_t type, uint64_t len)
{
	uint32_t cause;
	uint64_t lim = size_limit(&cause), keep;

	if (lim == UINT64_MAX)
		return 0;
	keep = !S.in_trailer || events_rec(type) ? RESERVE_LEN
	       : type == PKI_REC_END		 ? 0
						 : END_REC_LEN;
	if (S.off + len + keep <= lim)
		return 0;
	if (!S.may_shrink) {
		bool was = S.in_trailer;

		S.in_trailer = false;
		write_failed(-EFBIG, cause);
		S.in_trailer = was;
	}
	return -EFBIG;
}

/* While the trailer is written after writing stopped: does @len still fit? */
static bool trailer_room(uint64_t len)
{
	return !S.stop_err || S.no_falloc || S.off + len + END_REC_LEN <= S.reserved_to;
}

static int emit_iov(uint32_t type, struct iovec *iov, int n, size_t total);

/* Write one record made of @n payload parts at S.off.  Caller holds the writer. */
static int emit(uint32_t type, const struct iovec *parts, int n)
{
	static const uint8_t zeros[8];
	struct pki_trace_frame fr = {.type = type};
	struct iovec iov[8];
	size_t len = 0, pad;
	int i;

	iov[0].iov_base = &fr;
	iov[0].iov_len = sizeof(fr);
	for (i = 0; i < n; i++) {
		fr.crc = pki_crc32c(fr.crc, parts[i].iov_base, parts[i].iov_len);
		len += parts[i].iov_len;
		iov[i + 1] = parts[i];
	}
	fr.len = (uint32_t)len;
	pad = (8 - len % 8) % 8;
	iov[n + 1].iov_base = (void *)zeros;
	iov[n + 1].iov_len = pad;
	return emit_iov(type, iov, n + 2, sizeof(fr) + len + pad);
}

/*
 * Write @iov[0..n), @total bytes of whole records of @type (framed and
 * padded already), at S.off.  Caller holds the writer.
 */
static int emit_iov(uint32_t type, struct iovec *iov, int n, size_t total)
{
	struct iovec again[8];
	int err, tries;

	if (S.stop_err && !S.in_trailer)
		return S.stop_err;
	/*
	 * opts.max_size and ulimit -f: as a file system full at that size.
	 * Events are refused in the trailer too (the last drain, a ring's last
	 * snapshot); its STATUS, LOST and END records still go in.
	 */
	err = size_check(type, total);
	if (err)
		return err;
	memcpy(again, iov, sizeof(iov[0]) * (size_t)n);
	for (tries = 0;; tries++) {
		err = file_ready();
		if (err)
			return err; /* lost descriptor: file_ready() said so */
		err = reserve(total, !S.in_trailer || events_rec(type));
		if (err && S.may_shrink)
			return err; /* nothing written: the caller tries a smaller record */
		if (!err)
			err = pwritev_all(S.f.fd, iov, n, S.off);
		/* Closed between the check and the write: check (and reopen) again. */
		if (err != -EBADF || tries)
			break;
		memcpy(iov, again, sizeof(iov[0]) * (size_t)n);
	}
	if (err) {
		write_failed(err, PKI_STOP_ERROR);
		return err;
	}
	S.off += total;
	return 0;
}

/* A fixed part then @slen bytes of string (no NUL): OBJECT, SYMBOL, THREAD, HEADER. */
static int emit_string_rec(uint32_t type, const void *fixed, size_t flen, const char *s,
			   uint32_t slen)
{
	struct iovec p[2] = {{(void *)fixed, flen}, {(void *)s, slen}};

	return emit(type, p, 2);
}

/* Why a buffer's events were lost: indexes of kind_base and S.gone_kinds. */
enum { LK_FULL, LK_NESTED, LK_DEPTH, LK_UNWRITTEN, LK_N };

/* @b's losses by cause, since it was made. */
static void buf_kinds(const struct pki_trace_buf *b, uint64_t k[LK_N])
{
	k[LK_FULL] = __atomic_load_n(&b->lost, __ATOMIC_RELAXED) +
		     __atomic_load_n(&b->full_lost, __ATOMIC_RELAXED);
	k[LK_NESTED] = __atomic_load_n(&b->nested_lost, __ATOMIC_RELAXED);
	k[LK_DEPTH] = __atomic_load_n(&b->depth_lost, __ATOMIC_RELAXED);
	k[LK_UNWRITTEN] = b->dropped;
}

static uint64_t buf_lost(struct pki_trace_buf *b)
{
	uint64_t k[LK_N];

	buf_kinds(b, k);
	return k[LK_FULL] + k[LK_NESTED] + k[LK_DEPTH] + k[LK_UNWRITTEN];
}

/* @b is freed: its losses of this session stay counted, by cause. */
static void buf_kinds_keep(const struct pki_trace_buf *b)
{
	uint64_t k[LK_N];

	buf_kinds(b, k);
	for (int i = 0; i < LK_N; i++)
		S.gone_kinds[i] += k[i] - b->kind_base[i];
}

/*
 * The LOSSES record: what was lost so far, by cause, and why writing
 * stopped.  Into the reserve, as a STATUS record.
 */
static int emit_losses(void)
{
	struct pki_rec_losses r = {.stop_error = S.stop_err < 0 ? -S.stop_err : S.stop_err};
	struct iovec p = {&r, sizeof(r)};
	struct pki_trace_buf *b;
	uint64_t t[LK_N], k[LK_N];
	bool was = S.in_trailer;
	int i, ret;

	memcpy(t, S.gone_kinds, sizeof(t));
	for (b = __atomic_load_n(&S.bufs, __ATOMIC_ACQUIRE); b; b = b->next) {
		buf_kinds(b, k);
		for (i = 0; i < LK_N; i++)
			t[i] += k[i] - b->kind_base[i];
	}
	r.full = t[LK_FULL];
	r.nested = t[LK_NESTED];
	r.depth = t[LK_DEPTH];
	r.unwritten = t[LK_UNWRITTEN];
	r.late = __atomic_load_n(&S.late_lost, __ATOMIC_RELAXED) + (S.in_trailer ? S.held_late : 0);
	r.stop_cause = r.stop_error ? S.stop_cause : 0;
	if (!r.full && !r.nested && !r.depth && !r.unwritten && !r.late && !r.stop_error)
		return 0;
	S.in_trailer = true;
	ret = emit(PKI_REC_LOSSES, &p, 1);
	S.in_trailer = was;
	return ret;
}

/* The file cannot take events (stopped, or descriptor lost): no EVENTS record. */
static bool cannot_write(void)
{
	return S.stop_err || S.f.fd < 0;
}

/*
 * One record of thread @tsn's events: the @n1 at @ev1 then the @n2 at @ev2
 * (a ring's two halves).  PACKED, or EVENTS as they are when no packing
 * buffer could be mapped.
 */
/* The time of the first event of @ev1 then @ev2 that is no DATA (whose ts is a payload). */
static uint64_t first_time(const struct pki_trace_event *ev1, uint64_t n1,
			   const struct pki_trace_event *ev2, uint64_t n2)
{
	for (uint64_t i = 0; i < n1 + n2; i++) {
		const struct pki_trace_event *e = i < n1 ? &ev1[i] : &ev2[i - n1];

		if (!PKI_EV_IS_DATA(e->word))
			return e->ts;
	}
	return n1 ? ev1[0].ts : ev2[0].ts;
}

static int emit_span(uint32_t tsn, const struct pki_trace_event *ev1, uint64_t n1,
		     const struct pki_trace_event *ev2, uint64_t n2)
{
	struct iovec p[3];

	if (S.pack) {
		struct pki_rec_packed hdr = {.tsn = tsn, .count = (uint32_t)(n1 + n2)};
		struct pki_pack pk;
		size_t len;

		hdr.base_ts = first_time(ev1, n1, ev2, n2);
		pki_pack_begin(&pk, hdr.base_ts);
		len = pki_pack_events(&pk, S.pack, ev1, n1);
		len += pki_pack_events(&pk, S.pack + len, ev2, n2);
		p[0] = (struct iovec){&hdr, sizeof(hdr)};
		p[1] = (struct iovec){S.pack, len};
		return emit(PKI_REC_PACKED, p, 2);
	} else {
		struct pki_rec_events hdr = {.tsn = tsn, .count = (uint32_t)(n1 + n2)};

		p[0] = (struct iovec){&hdr, sizeof(hdr)};
		p[1] = (struct iovec){(void *)ev1, n1 * sizeof(*ev1)};
		p[2] = (struct iovec){(void *)ev2, n2 * sizeof(*ev2)};
		return emit(PKI_REC_EVENTS, p, 3);
	}
}

/*
 * Write events @first..@first + @n of @ev (slot = index & @mask) as EVENTS
 * or PACKED records of @b's thread; *@done counts those written (they are in the file
 * once counted).  After each record @landed (if set) is told the index past
 * it.  A nearly full file system makes the records smaller, so that every
 * event that fits is kept (emit() then fails without stopping).
 */
static int emit_events(struct pki_trace_buf *b, const struct pki_trace_event *ev, uint64_t mask,
		       uint64_t first, uint64_t n, uint64_t *done,
		       void (*landed)(struct pki_trace_buf *, uint64_t))
{
	uint64_t t = first, h = first + n;
	bool shrink;
	int err;

	while (t != h) {
		uint64_t k = h - t, i = t & mask, k1;

		if (k > S.events_per_rec)
			k = S.events_per_rec;
		k1 = mask + 1 - i;
		if (k1 > k || !k1) /* !k1: mask is ~0, a flat array */
			k1 = k;
		shrink = S.events_per_rec > EVENTS_MIN_REC;
		S.may_shrink = shrink;
		err = emit_span(b->tsn, &ev[i], k1, ev, k - k1);
		S.may_shrink = false;
		if (shrink && (err == -ENOSPC || err == -EDQUOT || err == -EFBIG) && !S.stop_err) {
			S.events_per_rec /= 4;
			if (S.events_per_rec < EVENTS_MIN_REC)
				S.events_per_rec = EVENTS_MIN_REC;
			continue;
		}
		if (err)
			return err;
		t += k;
		*done += k;
		if (landed)
			landed(b, t);
	}
	return 0;
}

/* A queue's slots below @t are in the file: free them for the owner. */
static void queue_landed(struct pki_trace_buf *b, uint64_t t)
{
	__atomic_store_n(&b->tail, t, __ATOMIC_RELEASE);
	room_release();
}

static int ring_events(struct pki_trace_buf *b);

/* The flight recorder's state (TR1, TR2). */
#define RING_DEAD_KEEP 256u /* exited threads whose rings wait for the next snapshot, at most */

static struct {
	struct pki_trace_event *scratch; /* writer only: one ring + the GAP event */
	size_t scratch_len;
	uint64_t overwritten; /* writer only: GAPs written + exited threads' rings freed */
	uint64_t snapshots;   /* writer only: TRIGGER records */
	uint64_t missed;      /* atomic: triggers that could not take the writer */
} R;

/*
 * Copy @b's published events to the file and free their slots.  The acquire
 * load of head pairs with the owner's release store: slots below head are
 * fully written.  tail is released only after pwritev() has copied them.
 * A flight recorder's ring is copied out another way (ring_events()).
 */
static int drain_buf(struct pki_trace_buf *b, bool trailer, bool dead)
{
	uint64_t h, l, n = 0;
	int err;

	if (cannot_write()) {
		/*
		 * Events the file cannot take are counted as lost and their
		 * slots freed (a thread never waits for a file that is gone).
		 * Only the trailer then writes, into the reserve, while it fits.
		 */
		h = __atomic_load_n(&b->head, __ATOMIC_ACQUIRE);
		l = b->tail;
		if (pki_trace_ring &&
		    h - l > b->mask + 1) { /* the older ones were overwritten, not lost */
			R.overwritten += h - l - (b->mask + 1);
			l = h - b->mask - 1;
		}
		b->dropped += h - l;
		__atomic_store_n(&b->tail, h, __ATOMIC_RELEASE);
		if (!trailer || S.f.fd < 0 || !trailer_room(2 * sizeof(struct pki_rec_lost) + 64))
			return 0;
	}
	if (!b->announced) {
		struct pki_rec_thread th = {.tsn = b->tsn, .tid = b->tid};

		/* A thread that has done nothing in this session is not in the file. */
		if (__atomic_load_n(&b->head, __ATOMIC_ACQUIRE) == b->tail &&
		    buf_lost(b) == b->lost_base)
			return 0;

		th.name_len = (uint32_t)strnlen(b->name, sizeof(b->name));
		err = emit_string_rec(PKI_REC_THREAD, &th, sizeof(th), b->name, th.name_len);
		if (err)
			return err;
		b->announced = 1;
		S.announced++;
	}
	if (pki_trace_ring) {
		err = ring_events(b);
	} else {
		h = __atomic_load_n(&b->head, __ATOMIC_ACQUIRE);
		err = emit_events(b, b->ev, b->mask, b->tail, h - b->tail, &n, queue_landed);
		b->recorded += n;
		S.recorded += n;
	}
	if (err)
		return err;
	l = buf_lost(b);
	/* An exited thread's record says so: readers then know its trace ended early. */
	if (l != b->lost_reported || trailer || dead) {
		struct pki_rec_lost lr = {
		    .tsn = b->tsn, .flags = dead ? PKI_LOST_EXITED : 0, .recorded = b->recorded};
		struct iovec p = {&lr, sizeof(lr)};

		lr.lost = l - b->lost_base;
		err = emit(PKI_REC_LOST, &p, 1);
		if (err)
			return err;
		b->lost_reported = l;
	}
	return 0;
}

static void buf_free(struct pki_trace_buf *b)
{
	if (!b->budget_out)
		__atomic_sub_fetch(&S.buf_mem, b->map_len, __ATOMIC_RELAXED);
	pki_trace_hold_free(b);
	munmap(b, b->map_len);
}

/*
 * Remove @b from the list.  Only the writer-word holder unlinks, and other
 * threads only ever push at the head (CAS), so every ->next we follow or
 * change here is ours; only the head needs a CAS.
 */
static void buf_unlink(struct pki_trace_buf *b)
{
	struct pki_trace_buf *head = __atomic_load_n(&S.bufs, __ATOMIC_ACQUIRE), *p;

	if (head == b && __atomic_compare_exchange_n(&S.bufs, &head, b->next, false,
						     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return;
	for (p = head; p && p->next != b; p = p->next)
		;
	if (p)
		p->next = b->next;
}

/*
 * Drain every buffer.  @reap (normal context only): free the buffers of
 * exited threads once empty.  Freeing is safe: the owner stored dead (release)
 * as its last access to the buffer and then pointed its TLS to gone_buf, and
 * no one else but the writer-word holder (us) touches buffers.
 */
static int drain_all(bool reap, bool trailer, bool *busy)
{
	struct pki_trace_buf *b = __atomic_load_n(&S.bufs, __ATOMIC_ACQUIRE), *next;
	int err = 0;

	/* Once per pass: a descriptor the program closed is noticed (and reopened) here. */
	if (!S.stop_err)
		file_ready();

	for (; b; b = next) {
		bool dead = __atomic_load_n(&b->dead, __ATOMIC_ACQUIRE);
		uint64_t used = __atomic_load_n(&b->head, __ATOMIC_ACQUIRE) - b->tail;

		next = b->next;
		if (busy && used > (b->mask + 1) / 2)
			*busy = true;
		/*
		 * A buffer about to be freed gets its final LOST record now: the
		 * trailer will not see it, and its last one may predate events just
		 * written (readers take recorded from the last LOST record).
		 */
		err = drain_buf(b, trailer || (reap && dead), dead);
		if (err && cannot_write()) /* count them, free the slots */
			err = drain_buf(b, trailer || (reap && dead), dead);
		if (err)
			break;
		if (reap && dead) {
			S.gone_lost += b->lost_reported - b->lost_base;
			buf_kinds_keep(b);
			buf_unlink(b);
			buf_free(b);
		}
	}
	return err;
}

/*
 * drain_all() without reaping; if the file turned out unable to take the
 * events (writing stopped meanwhile), once more, which counts the rest as
 * lost and frees their slots (drain_buf()).
 */
static int drain_or_count(bool trailer)
{
	int err = drain_all(false, trailer, NULL);

	if (err && cannot_write())
		err = drain_all(false, trailer, NULL);
	return err;
}

/* ---- the flight recorder ----------------------------------------------------- */

/*
 * With opts.ring every buffer is a ring, written out only at a snapshot
 * (TR1); ring_copy() reads it as a seqlock is read (TR2).
 * doc/design/trace-writer.md.
 */

/* Copy @b's unwritten events to R.scratch + 1; how many, from event *@from. */
static uint64_t ring_copy(struct pki_trace_buf *b, uint64_t *from)
{
	uint64_t cap = b->mask + 1, h1, h2, start, i, n;

	h1 = __atomic_load_n(&b->head, __ATOMIC_ACQUIRE);
	start = h1 - b->tail > cap ? h1 - cap : b->tail;
	for (i = start; i != h1; i++) {
		const struct pki_trace_event *e = &b->ev[i & b->mask];
		struct pki_trace_event *d = &R.scratch[1 + (i - start)];

		d->ts = __atomic_load_n(&e->ts, __ATOMIC_RELAXED);
		d->word = __atomic_load_n(&e->word, __ATOMIC_RELAXED);
	}
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	h2 = __atomic_load_n(&b->head, __ATOMIC_RELAXED);
	n = h1 - start;
	/*
	 * Events below h2 - cap + 1 may be torn, and below h2 - cap + 1 +
	 * PKI_DATA_MAX when the owner is inside a record: event h2 may come
	 * with DATA, whose slots are those of the events after h2 - cap.
	 */
	if (h2 + 1 + PKI_DATA_MAX > cap + start) {
		uint64_t torn = h2 + 1 + PKI_DATA_MAX - cap - start;

		if (!__atomic_load_n(&b->busy, __ATOMIC_ACQUIRE) &&
		    __atomic_load_n(&b->head, __ATOMIC_RELAXED) == h2)
			/* event h2 had not begun: h2 - cap and above are whole (see above) */
			torn = h2 > cap + start ? h2 - cap - start : 0;
		if (torn > n)
			torn = n;
		if (torn) {
			memmove(&R.scratch[1], &R.scratch[1 + torn],
				(n - torn) * sizeof(R.scratch[0]));
			start += torn;
			n -= torn;
		}
	}
	*from = start;
	return n;
}

/* Write @b's ring: what is not in the file yet, after a GAP if some was overwritten. */
static int ring_events(struct pki_trace_buf *b)
{
	uint64_t start, n = ring_copy(b, &start), gap = start - b->tail, done = 0;
	const struct pki_trace_event *first = &R.scratch[1];
	int err;

	if (gap) {
		uint64_t k = 1;

		while (k <= n && PKI_EV_IS_DATA(R.scratch[k].word)) /* (a payload is no time) */
			k++;
		R.scratch[0].ts = k <= n ? R.scratch[k].ts : pki_trace_now();
		R.scratch[0].word = PKI_EV_WORD(gap, PKI_EV_GAP);
		first = R.scratch;
		n++;
	}
	err = emit_events(b, first, ~0ull, 0, n, &done, NULL);
	if (gap && !done)
		return err; /* nothing landed, the GAP neither: all of it waits */
	if (gap) {	    /* the GAP is a marker, not an event of the program */
		R.overwritten += gap;
		done--;
	}
	b->recorded += done;
	S.recorded += done;
	/*
	 * What landed is behind us, even if the write then failed (the rest
	 * waits, or the next drain counts it lost).  Release: the owner's look
	 * at tail (pki_trace_put()) is an acquire load.
	 */
	__atomic_store_n(&b->tail, start + done, __ATOMIC_RELEASE);
	return err;
}

/* The TRIGGER record of a snapshot whose events were just written. */
static int emit_trigger(uint32_t why, int signo, uint64_t fn, uint64_t ticks)
{
	struct pki_rec_trigger tr = {.why = why,
				     .signo = (uint32_t)signo,
				     .ticks = ticks,
				     .fn = fn,
				     .overwritten = R.overwritten,
				     .missed = __atomic_load_n(&R.missed, __ATOMIC_RELAXED)};
	struct iovec p = {&tr, sizeof(tr)};
	int err = emit(PKI_REC_TRIGGER, &p, 1);

	if (!err)
		R.snapshots++;
	return err;
}

/*
 * The drainer's job in a ring session: free the rings of exited threads
 * once a snapshot has taken them, and, past RING_DEAD_KEEP of them waiting
 * or past S.buf_budget bytes of them, the oldest ones anyway (their events
 * counted as overwritten), so that a program that makes threads without end
 * has bounded memory.  Exited threads' rings are out of the budget that
 * makes new threads' rings smaller (buf_release()): a pool of their own.  The list has
 * the newest buffers first.  Freeing is safe as in drain_all().
 */
static void ring_reap(void)
{
	struct pki_trace_buf *b = __atomic_load_n(&S.bufs, __ATOMIC_ACQUIRE), *next;
	uint32_t waiting = 0;
	size_t bytes = 0;

	for (; b; b = next) {
		uint64_t unwritten;

		next = b->next;
		if (!__atomic_load_n(&b->dead, __ATOMIC_ACQUIRE))
			continue;
		unwritten = __atomic_load_n(&b->head, __ATOMIC_ACQUIRE) - b->tail;
		if (unwritten && ++waiting <= RING_DEAD_KEEP &&
		    (bytes += b->map_len) <= S.buf_budget)
			continue;
		if (b->announced) { /* its LOST records are in the file: END must count them */
			S.gone_lost += b->lost_reported - b->lost_base;
			buf_kinds_keep(b);
		}
		R.overwritten += unwritten;
		buf_unlink(b);
		buf_free(b);
	}
}

/*
 * One scratch ring, as large as any buffer and a GAP: the session's new
 * buffers have @cap events at most, but the threads of an earlier session
 * keep theirs (session_reset_bufs()), which may be larger.
 */
static int ring_setup(uint32_t cap)
{
	const struct pki_trace_buf *b;
	size_t len, most = cap;

	for (b = __atomic_load_n(&S.bufs, __ATOMIC_ACQUIRE); b; b = b->next)
		if (b->mask + 1 > most)
			most = b->mask + 1;
	len = (most + 1) * sizeof(struct pki_trace_event);
	if (R.scratch_len >= len)
		return 0;
	if (R.scratch)
		munmap(R.scratch, R.scratch_len);
	R.scratch_len = 0;
	R.scratch = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (R.scratch == MAP_FAILED) {
		R.scratch = NULL;
		return -ENOMEM;
	}
	R.scratch_len = len;
	return 0;
}

/* Caller holds the writer word: write every ring out, then the TRIGGER record. */
static int ring_snapshot(uint32_t why, int signo, uint64_t fn, bool trailer)
{
	uint64_t ticks = pki_trace_now();
	int err = drain_or_count(trailer);

	if (!err || S.stop_err)
		err = emit_trigger(why, signo, fn, ticks);
	return err;
}

int pki_trace_snapshot(uint32_t why, int signo, uint64_t fn)
{
	int saved_errno = errno, err = -EBUSY;
	sigset_t saved;

	if (!pki_trace_ring)
		return -EINVAL;
	if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) != ST_ACTIVE || getpid() != S.pid)
		return -EALREADY; /* (a fork child before pki_trace_fork_child(): not its file) */
	pki_trace_hold_flush();	  /* the calling thread's held calls are in it (hold.h H6) */
	pki_trace_busy++;
	sigprocmask(SIG_BLOCK, &S.fatal_set, &saved); /* TW1 */
	if (writer_lock_timed(WAIT_SIGNAL_NS)) {
		err = -EALREADY;
		if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) == ST_ACTIVE)
			err = ring_snapshot(why, signo, fn, false);
		writer_unlock();
	} else {
		__atomic_fetch_add(&R.missed, 1, __ATOMIC_RELAXED); /* said in the next TRIGGER */
	}
	sigprocmask(SIG_SETMASK, &saved, NULL);
	pki_trace_busy--;
	errno = saved_errno;
	return err;
}

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
	uint64_t lost = S.gone_lost;
	int err;

	/*
	 * After writing stopped (ENOSPC...), the drain below counts what is
	 * left as lost and writes what fits of the per-thread LOST records
	 * into the reserve, then END, which always fits there.
	 */
	S.in_trailer = true;
	if (pki_trace_ring)
		err = ring_snapshot(trigger_of(reason), signo, 0, true);
	else
		err = drain_or_count(true);
	if (err && !S.stop_err)
		goto out;
	pki_trace_clock_pair(S.ci.clock, &end.end_ticks, &end.end_mono_ns);
	/*
	 * Held calls still undecided: what they held comes too late (hold.h
	 * H6); counted afresh at each trailer (an exec that fails goes on).
	 */
	S.held_late = 0;
	for (b = __atomic_load_n(&S.bufs, __ATOMIC_ACQUIRE); b; b = b->next) {
		lost += b->lost_reported - b->lost_base;
		S.held_late += pki_trace_hold_undecided(b);
	}
	end.late_lost = __atomic_load_n(&S.late_lost, __ATOMIC_RELAXED) + S.held_late;
	/* What the LOST records say, or all of it if some did not fit. */
	end.lost = S.stop_err ? lost_now() : lost + end.late_lost;
	end.recorded = S.recorded;
	end.nthreads = S.announced;
	if (reason == PKI_END_CLOSE)
		end.status = __atomic_load_n(&S.exit_status, __ATOMIC_ACQUIRE);
	emit_losses(); /* the END record follows even if it did not fit */
	S.end_off = S.off;
	err = emit(PKI_REC_END, &p, 1);
out:
	S.in_trailer = false;
	reserve_release();
	return err;
}

/* ---- per-thread buffers ---------------------------------------------------- */

/* pthread key destructor: the thread is exiting and will not record again. */
static void buf_release(void *arg)
{
	struct pki_trace_buf *b = arg;
	stack_t ss;

	pki_trace_hold_release(b);
	pki_trace_tls = &gone_buf;
	if (!sigaltstack(NULL, &ss) && ss.ss_sp == (char *)b + b->map_len - ALTSTACK_LEN) {
		ss.ss_flags = SS_DISABLE;
		sigaltstack(&ss, NULL);
	}
	/*
	 * A ring waits for the next snapshot (ring_reap()), in a pool of its
	 * own: the rings of threads that exited must not shrink new threads'.
	 */
	if (pki_trace_ring) {
		b->budget_out = 1;
		__atomic_sub_fetch(&S.buf_mem, b->map_len, __ATOMIC_RELAXED);
	}
	/* Last access: from here the writer may free @b. */
	__atomic_store_n(&b->dead, 1, __ATOMIC_RELEASE);
}

/*
 * Make the calling thread's buffer: header page, events, and (when fatal
 * signals are caught) an alternate signal stack so a stack overflow still
 * gets flushed.  Syscalls only (mmap, prctl, sigaltstack): async-signal-safe.
 *
 * Memory: the pages are not populated; a page costs RAM once the thread has
 * recorded into it (256 events a page; the header page at once; the signal
 * stack only if a signal uses it).  A thread that records little costs a few
 * pages whatever the capacity, a busy one its capacity in full (16 bytes an
 * event) until it exits, when the drainer unmaps it (buf_release()).  The
 * first-lap page faults cost ~8 ns an event over the first capacity's worth
 * of events of each thread, none after.  So that many busy threads cannot
 * grow the total without bound, a buffer that would take the buffers mapped
 * past S.buf_budget (64 MiB, or twice the asked-for capacity if more) is
 * made smaller, halving down to BUF_MIN_EVENTS (16 KiB): a small buffer
 * only makes its thread wait for the drainer more often.
 */
static struct pki_trace_buf *buf_new(void)
{
	uint32_t cap = S.cap;
	size_t ev_len = (size_t)cap * sizeof(struct pki_trace_event), len;
	struct pki_trace_buf *b;
	struct pki_trace_buf *head;
	stack_t ss;

	/* Reserve first, so that threads starting together cannot all pass. */
	for (;;) {
		len = BUF_HDR_LEN + ev_len + ALTSTACK_LEN;
		if (__atomic_add_fetch(&S.buf_mem, len, __ATOMIC_RELAXED) <= S.buf_budget ||
		    cap <= BUF_MIN_EVENTS)
			break;
		__atomic_sub_fetch(&S.buf_mem, len, __ATOMIC_RELAXED);
		cap /= 2;
		ev_len /= 2;
	}
	b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (b == MAP_FAILED) {
		__atomic_sub_fetch(&S.buf_mem, len, __ATOMIC_RELAXED);
		return NULL;
	}
	b->map_len = len;
	b->mask = cap - 1;
	b->ev = (struct pki_trace_event *)((char *)b + BUF_HDR_LEN);
	b->tid = (uint32_t)gettid();
	b->tsn = __atomic_add_fetch(&S.next_tsn, 1, __ATOMIC_RELAXED);
	prctl(PR_GET_NAME, b->name);
	if (S.fatal.caught[SIGSEGV] && !sigaltstack(NULL, &ss) && (ss.ss_flags & SS_DISABLE)) {
		ss.ss_sp = (char *)b + len - ALTSTACK_LEN;
		ss.ss_size = ALTSTACK_LEN;
		ss.ss_flags = 0;
		sigaltstack(&ss, NULL);
	}
	/*
	 * pthread_setspecific() for a key below PTHREAD_KEY_2NDLEVEL_SIZE (ours is
	 * made first thing) stores into the thread descriptor: no allocation.
	 */
	pthread_setspecific(S.key, b);
	head = __atomic_load_n(&S.bufs, __ATOMIC_RELAXED);
	do
		b->next = head;
	while (!__atomic_compare_exchange_n(&S.bufs, &head, b, true, __ATOMIC_RELEASE,
					    __ATOMIC_RELAXED));
	__atomic_add_fetch(&S.nthreads, 1, __ATOMIC_RELAXED);
	return b;
}

/*
 * Everything the inline path does not handle: first event of a thread,
 * nested record, sentinel buffers.  Async-signal-safe.
 *
 * A signal handler that records while buf_new() runs for its thread finds
 * no buffer and tls_allocating set: its event is counted in tls_alloc_lost
 * (one instruction's increment, as nested_lost's).  Once tls_allocating is
 * clear no handler adds to it (with the buffer published in pki_trace_tls
 * they record into it or count in its nested_lost; without one they make
 * their own), so one exchange after that takes the whole count: it goes
 * to the buffer's nested_lost, the thread's own losses (to late_lost if no
 * buffer could be made).  Every such event is counted once, against its
 * thread.  A handler that ran after the caller found no buffer but before
 * tls_allocating was set made the buffer itself: buf_make() takes it.
 */
/* The calling thread's first buffer (record_slow() says how), or NULL. */
static struct pki_trace_buf *buf_make(void)
{
	struct pki_trace_buf *b;

	tls_allocating = 1;
	pki_trace_busy++; /* buf_new's libc calls are not events */
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	/* A handler that ran since the caller found none made it: one buffer a thread. */
	b = pki_trace_tls;
	if (!b) {
		b = buf_new();
		if (b)
			pki_trace_tls = b;
	}
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	tls_allocating = 0;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	__atomic_fetch_add(b ? &b->nested_lost : &S.late_lost,
			   __atomic_exchange_n(&tls_alloc_lost, 0, __ATOMIC_RELAXED),
			   __ATOMIC_RELAXED);
	pki_trace_busy--;
	return b;
}

static void record_slow(const struct pki_trace_group *g)
{
	struct pki_trace_buf *b = pki_trace_tls;

	if (b == &internal_buf)
		return;
	if (b == &gone_buf) {
		__atomic_fetch_add(&S.late_lost, 1 + g->n, __ATOMIC_RELAXED);
		return;
	}
	if (b) { /* busy: a signal handler interrupted a record of this thread */
		__atomic_fetch_add(&b->nested_lost, 1 + g->n, __ATOMIC_RELAXED);
		return;
	}
	if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) != ST_ACTIVE)
		return;		       /* outside any trace: not an event of a trace */
	if (pki_worker_is(gettid())) { /* a thread of ours: its calls are never events */
		pki_trace_tls = &internal_buf;
		return;
	}
	if (tls_allocating) { /* a handler interrupted buf_new() of this thread */
		__atomic_fetch_add(&tls_alloc_lost, 1 + g->n, __ATOMIC_RELAXED);
		return;
	}
	b = buf_make();
	if (!b) {
		__atomic_fetch_add(&S.late_lost, 1 + g->n, __ATOMIC_RELAXED);
		return;
	}
	pki_trace_record_n(g->fn, g->kind, g->ts, g->data, g->n);
}

struct pki_trace_buf *pki_trace_buf_self(void)
{
	struct pki_trace_buf *b = pki_trace_tls;

	if (b == &internal_buf || b == &gone_buf)
		return NULL;
	if (b)
		return b->hold_of ? b->hold_of : b;
	if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) != ST_ACTIVE || tls_allocating)
		return NULL;
	if (pki_worker_is(gettid())) {
		pki_trace_tls = &internal_buf;
		return NULL;
	}
	return buf_make();
}

__attribute__((noinline)) void pki_trace_record_slow(uint64_t fn, unsigned kind, uint64_t ts)
{
	struct pki_trace_group g = {fn, ts, kind, 0, NULL};

	record_slow(&g);
}

__attribute__((noinline)) void pki_trace_record_slow_n(const struct pki_trace_group *g)
{
	record_slow(g);
}

void pki_trace_count_lost(void)
{
	struct pki_trace_buf *b = pki_trace_tls;

	if (b == &internal_buf)
		return;
	if (b && b != &gone_buf)
		__atomic_fetch_add(&b->depth_lost, 1, __ATOMIC_RELAXED);
	else if (!b && tls_allocating) /* the thread's, once its buffer is made */
		__atomic_fetch_add(&tls_alloc_lost, 1, __ATOMIC_RELAXED);
	else if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) == ST_ACTIVE)
		__atomic_fetch_add(&S.late_lost, 1, __ATOMIC_RELAXED);
}

/* ---- waiting for room (TD1 of doc/design/trace-writer.md) ---------------- */
/* Room for @n more events after the next one. */
static bool room_free(const struct pki_trace_buf *b, unsigned n)
{
	return b->head + n - __atomic_load_n(&b->tail, __ATOMIC_ACQUIRE) <= b->mask;
}

static bool room_may_wait(const struct pki_trace_buf *b)
{
	return __atomic_load_n(&S.state, __ATOMIC_ACQUIRE) == ST_ACTIVE &&
	       __atomic_load_n(&S.drainer_running, __ATOMIC_ACQUIRE) &&
	       !__atomic_load_n(&S.stalled, __ATOMIC_ACQUIRE) &&
	       __atomic_load_n(&S.writer, __ATOMIC_RELAXED) != (int)b->tid;
}

/* True once @b has room for 1 + @n events; false if waiting cannot end (see above). */
static bool room_wait(const struct pki_trace_buf *b, unsigned n)
{
	uint32_t seen = 0, r;
	uint64_t t0 = 0, now;
	unsigned i;

	for (i = 0; i < SPIN_ROOM; i++) {
		if (room_free(b, n))
			return true;
		if (!room_may_wait(b))
			return false;
		__builtin_ia32_pause();
	}
	for (;;) {
		struct timespec nap = {.tv_nsec = NAP_ROOM_NS};

		r = __atomic_load_n(&S.room, __ATOMIC_SEQ_CST);
		if (room_free(b, n))
			return true;
		if (!room_may_wait(b))
			return false;
		now = pki_trace_mono_ns();
		if (!t0 || r != seen) {
			seen = r;
			t0 = now;
		} else if (now - t0 > S.wait_ns) {
			__atomic_store_n(&S.stalled, 1, __ATOMIC_RELEASE);
			return false;
		}
		__atomic_add_fetch(&S.waiters, 1, __ATOMIC_SEQ_CST);
		pki_trace_kick();
		pki_futex_wait(&S.room, r, &nap);
		__atomic_sub_fetch(&S.waiters, 1, __ATOMIC_SEQ_CST);
	}
}

/* @g into @b, the calling thread's (its TLS buffer, or the one its hold buffer commits to). */
static void put_wait(struct pki_trace_buf *b, const struct pki_trace_group *g)
{
	int saved, r = PKI_TRACE_PUT_FULL;

	pki_trace_busy++; /* before errno: __errno_location may be traced */
	saved = errno;

	/* Full again after room was seen only if a signal handler refilled it. */
	while (r == PKI_TRACE_PUT_FULL && room_wait(b, g->n))
		r = pki_trace_put_n(b, g->fn, g->kind, g->ts, g->data, g->n);
	if (r == PKI_TRACE_PUT_FULL)
		__atomic_fetch_add(&b->full_lost, 1 + g->n, __ATOMIC_RELAXED);
	else if (r == PKI_TRACE_PUT_SLOW && b == pki_trace_tls)
		record_slow(g);		  /* the buffer went meanwhile */
	else if (r == PKI_TRACE_PUT_SLOW) /* a handler's record, interrupted by a commit */
		__atomic_fetch_add(&b->nested_lost, 1 + g->n, __ATOMIC_RELAXED);
	errno = saved;
	pki_trace_busy--;
}

void pki_trace_put_wait(struct pki_trace_buf *b, const struct pki_trace_group *g)
{
	put_wait(b, g);
}

static void record_full(const struct pki_trace_group *g)
{
	struct pki_trace_buf *b = pki_trace_tls;

	if (b->hold_of) { /* a hold buffer is full: its events go on to the thread's (hold.h H5) */
		if (pki_trace_hold_overflow(b) &&
		    pki_trace_put_n(b, g->fn, g->kind, g->ts, g->data, g->n) == PKI_TRACE_PUT_OK)
			return;
		/* a handler's, during a commit (H4): counted */
		__atomic_fetch_add(&b->nested_lost, 1 + g->n, __ATOMIC_RELAXED);
		return;
	}
	put_wait(b, g);
}

__attribute__((noinline)) void pki_trace_record_full(uint64_t fn, unsigned kind, uint64_t ts)
{
	struct pki_trace_group g = {fn, ts, kind, 0, NULL};

	record_full(&g);
}

__attribute__((noinline)) void pki_trace_record_full_n(const struct pki_trace_group *g)
{
	record_full(g);
}

/* ---- the drainer thread (TD2 of doc/design/trace-writer.md) -------------- */
void pki_trace_kick(void)
{
	int saved;

	if (pki_trace_ring) /* nothing to drain: rings wait for a snapshot */
		return;
	pki_trace_busy++; /* before errno: __errno_location may be traced */
	saved = errno;	  /* may run in a signal handler */
	if (__atomic_exchange_n(&S.wake, 0, __ATOMIC_SEQ_CST) == 1)
		pki_futex_wake(&S.wake, 1);
	errno = saved;
	pki_trace_busy--;
}

/*
 * The drainer runs with every signal blocked but the patch layer's
 * (pki_worker_start): TW1 of the writer word, and the program's signals
 * (and their handlers' records) stay off it.  The sled kick it takes only
 * looks at the interrupted context and acknowledges, never takes the writer
 * word nor records, so TW1 still holds; blocked, it would stall a patch
 * batch while we drain (hooks added or removed as PROG runs, agent dlopen.c).
 */
static void *drainer_main(void *arg)
{
	uint32_t wait_ms = S.drain_ms;

	(void)arg;
	pki_trace_tls = &internal_buf;
	pki_trace_busy = 1; /* its calls are probekit's, never recorded */
	for (;;) {
		struct timespec ts = {.tv_sec = wait_ms / 1000,
				      .tv_nsec = (long)(wait_ms % 1000) * 1000000};
		bool busy = false;

		/* Relative timeout on CLOCK_MONOTONIC; EAGAIN if kicked since arming. */
		pki_futex_wait(&S.wake, 1, &ts);
		__atomic_store_n(&S.wake, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&S.stop, __ATOMIC_SEQ_CST))
			break;
		if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) == ST_ACTIVE) {
			int err = 0;

			writer_lock_timed(UINT64_MAX);
			/* re-check: a fatal signal or exec may have ended the trace meanwhile */
			if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) != ST_ACTIVE)
				;
			else if (pki_trace_ring)
				ring_reap();
			else
				err = drain_all(true, false, &busy);
			writer_unlock();
			/* A failed write: threads with a full buffer stop waiting (drop, count). */
			__atomic_store_n(&S.stalled, err != 0, __ATOMIC_RELEASE);
			if (err)
				room_release();
		}
		/* A buffer over half full: come back sooner (down to 1 ms). */
		wait_ms = busy ? (wait_ms / 2 ? wait_ms / 2 : 1) : S.drain_ms;
	}
	return NULL;
}

static int drainer_start(void)
{
	int err;

	S.stop = false;
	S.wake = 1;
	err = pki_worker_start(&S.drainer, false, "probekit-drain", drainer_main, NULL);
	if (err)
		__atomic_store_n(&S.drainer_running, false, __ATOMIC_RELEASE);
	return err;
}

static void drainer_stop(void)
{
	if (!S.drainer_running)
		return;
	/* Nobody waits for room from here on (they see it, or the state, and drop). */
	__atomic_store_n(&S.drainer_running, false, __ATOMIC_RELEASE);
	room_release();
	__atomic_store_n(&S.stop, true, __ATOMIC_SEQ_CST);
	__atomic_exchange_n(&S.wake, 0, __ATOMIC_SEQ_CST);
	pki_futex_wake(&S.wake, 1);
	pthread_join(S.drainer, NULL);
	S.wake = 0; /* it re-armed before it saw stop: no kick need wake anyone now */
}

/* ---- fatal signals --------------------------------------------------------- */

/* The async-signal-safe end of a session: fatal signal, _exit(). */
static int flush_final(uint32_t reason, int signo)
{
	int st = ST_ACTIVE, err;

	if (getpid() != S.pid)
		return -EALREADY; /* a fork child before pki_trace_fork_child(): not its file */
	if (!__atomic_compare_exchange_n(&S.state, &st, ST_ENDING, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return -EALREADY;
	room_release(); /* waiters drop their events: they come after END */
	if (!writer_lock_timed(WAIT_SIGNAL_NS))
		return -EBUSY; /* state stays ENDING: no one writes after us */
	err = emit_trailer(reason, signo);
	writer_unlock();
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
	sigprocmask(SIG_BLOCK, &S.fatal_set, &saved);
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
	    getpid() == S.pid) { /* the trigger: not fatal then */
		pki_trace_snapshot(PKI_TRIGGER_SIGNAL, signo, 0);
		return;
	}
	pki_trace_flush_signal(signo);
	pki_fatal_die(&S.fatal, signo, si);
}

static void signals_install(void)
{
	S.fatal.handler = on_fatal;
	pki_fatal_catch(&S.fatal, fatal_signals, sizeof(fatal_signals) / sizeof(fatal_signals[0]));
}

static void signals_restore(void)
{
	pki_fatal_release(&S.fatal);
}

/* ---- session ---------------------------------------------------------------- */

void pki_trace_exit_status(int status)
{
	if (getpid() == S.pid) /* (a vfork child shares S: its exit is not ours) */
		__atomic_store_n(&S.exit_status, PKI_END_STATUS_KNOWN | PKI_END_STATUS(status),
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

	for (b = __atomic_load_n(&S.bufs, __ATOMIC_ACQUIRE); b; b = b->next) {
		__atomic_store_n(&b->tail, __atomic_load_n(&b->head, __ATOMIC_ACQUIRE),
				 __ATOMIC_RELEASE);
		b->lost_base = b->lost_reported = buf_lost(b);
		buf_kinds(b, b->kind_base);
		b->recorded = 0;
		b->announced = 0;
		b->tsn = __atomic_add_fetch(&S.next_tsn, 1, __ATOMIC_RELAXED);
	}
}

static int write_header(const char *program)
{
	struct pki_trace_prefix pre = {.magic = PKI_TRACE_MAGIC,
				       .version_major = PKI_TRACE_VERSION_MAJOR,
				       .version_minor = PKI_TRACE_VERSION_MINOR};
	struct pki_rec_header h = {
	    .clock = S.ci.clock,
	    .pid = (uint32_t)getpid(),
	    .ticks_per_sec = S.ci.ticks_per_sec,
	    .ref_ticks = S.ci.ref_ticks,
	    .ref_mono_ns = S.ci.ref_mono_ns,
	    .ref_real_ns = S.ci.ref_real_ns,
	    .buf_events = S.cap,
	};
	struct iovec p = {&pre, sizeof(pre)};
	int err;

	pre.crc = pki_crc32c(0, &pre, offsetof(struct pki_trace_prefix, crc));
	err = pwritev_all(S.f.fd, &p, 1, 0);
	if (err)
		return err;
	S.off = sizeof(pre);
	h.program_len = (uint32_t)strnlen(program, PKI_TRACE_MAX_STRING);
	return emit_string_rec(PKI_REC_HEADER, &h, sizeof(h), program, h.program_len);
}

/* The SESSION record, if @opts has one (right after HEADER: a reader may stop there). */
static int write_session(const struct pki_trace_opts *opts)
{
	struct pki_rec_session rec = {.id = opts->session, .flags = opts->session_flags};
	struct iovec v = {&rec, sizeof(rec)};

	return opts->session ? emit(PKI_REC_SESSION, &v, 1) : 0;
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

		err = emit(PKI_REC_INFO, p, 3);
	}
	return err;
}

/*
 * Create (or truncate) the trace file S.path, mode 0600 (it holds what the
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

	snprintf(dir, sizeof(dir), "%s", S.path);
	slash = strrchr(dir, '/');
	if (slash)
		slash[slash == dir] = '\0'; /* "/x" -> "/" */
	if (stat(dir, &st))
		return -errno;
	if (!(st.st_mode & (S_IWGRP | S_IWOTH)) && (st.st_uid == geteuid() || st.st_uid == 0)) {
		fd = open(S.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		return fd < 0 ? -errno : fd;
	}
	fd = open(S.path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0 || errno != EEXIST)
		return fd < 0 ? -errno : fd;
	/* O_NONBLOCK: a planted FIFO must not block us here (refused below). */
	fd = open(S.path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		if (err == -ELOOP)
			pki_warn(
			    "trace %s: a symbolic link in a directory other users can write to: "
			    "not followed, refusing to write the trace there\n",
			    S.path);
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
			 S.path, (unsigned)st.st_uid);
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

/* S.path := @path, absolute (the program may chdir() before a reopen). */
static int set_path(const char *path)
{
	char cwd[PATH_MAX];
	int n;

	if (path[0] == '/') {
		n = snprintf(S.path, sizeof(S.path), "%s", path);
	} else {
		if (!getcwd(cwd, sizeof(cwd)))
			return -errno;
		n = snprintf(S.path, sizeof(S.path), "%s/%s", strcmp(cwd, "/") ? cwd : "", path);
	}
	return n < 0 || (size_t)n >= sizeof(S.path) ? -ENAMETOOLONG : 0;
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

/* Create the trace file @path (or take @opts' descriptor) and own it in S.f; 0 or -errno. */
static int session_file_open(const char *path, const struct pki_trace_opts *opts)
{
	int err;

	err = set_path(path);
	if (err && opts->use_fd)
		close(opts->fd);
	if (!err)
		err = opts->use_fd ? opts->fd : file_create();
	if (err >= 0)
		err = pki_fd_own(&S.f, err);
	if (err)
		pki_warn("trace %s: open: %s\n", path, pki_errstr(err));
	return err;
}

/* Zero what a session counts and set what @opts decides: nothing of the last one is left. */
static void session_state_reset(const struct pki_trace_opts *opts, uint32_t cap)
{
	S.stop_err = S.lost_err = 0;
	S.stop_cause = PKI_STOP_ERROR;
	S.lost_ticks = S.reserved_to = 0;
	S.no_falloc = S.in_trailer = S.may_shrink = false;
	S.events_per_rec = EVENTS_PER_REC;
	S.notice = opts->notice;
	S.cap = cap;
	S.buf_budget = (size_t)cap * sizeof(struct pki_trace_event) * 2;
	if (S.buf_budget < BUF_BUDGET)
		S.buf_budget = BUF_BUDGET;
	S.io_err = 0;
	S.recorded = S.gone_lost = 0;
	memset(S.gone_kinds, 0, sizeof(S.gone_kinds));
	S.late_lost = 0;
	__atomic_add_fetch(&pki_trace_session, 1, __ATOMIC_RELEASE); /* (hold buffers: hold.h) */
	S.next_tsn = 0;
	S.nthreads = 0;
	S.announced = 0;
	S.drain_ms = opts->drain_ms ? opts->drain_ms : 5;
	S.wait_ns = (uint64_t)(opts->wait_ms ? opts->wait_ms : WAIT_ROOM_MS) * 1000000u;
	S.stalled = 0;
	S.waiters = 0;
	pki_trace_drop = opts->drop;
	pki_trace_ring = opts->ring; /* TR1 */
	S.pid = getpid();
	R.overwritten = R.snapshots = R.missed = 0;
	S.max_size = opts->max_size;
	S.exit_status = 0;
	session_reset_bufs();
	pki_trace_use_tsc = S.ci.clock == PKI_CLOCK_TSC;
}

/*
 * What ends the session: a fatal signal (@opts->catch_signals), exit()
 * (@opts->at_exit), and, in the child, fork().
 */
static void exit_hooks_install(const struct pki_trace_opts *opts)
{
	sigemptyset(&S.fatal_set);
	if (opts->catch_signals) {
		size_t i;

		signals_install();
		for (i = 0; i < sizeof(fatal_signals) / sizeof(fatal_signals[0]); i++)
			sigaddset(&S.fatal_set, fatal_signals[i]);
	}
	if (opts->at_exit && !S.atexit_done && !on_exit(at_exit, NULL))
		S.atexit_done = true;
	if (opts->at_exit && !S.at_quick_done && !at_quick_exit(at_quick_exit_flush))
		S.at_quick_done = true;
	if (!S.atfork_done && !pthread_atfork(NULL, NULL, pki_trace_fork_child))
		S.atfork_done = true;
}

/*
 * The writer's PACKED record buffer, mapped once for every session (its
 * pages are touched as records need them); without it, or @unpacked, the
 * events go out as EVENTS records.
 */
static void pack_setup(bool unpacked)
{
	static uint8_t *buf;

	if (!buf && !unpacked) {
		void *m =
		    mmap(NULL, (size_t)EVENTS_PER_REC * PKI_PACK_MAX_EVENT, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		buf = m == MAP_FAILED ? NULL : m;
	}
	S.pack = unpacked ? NULL : buf;
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
	if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) != ST_IDLE)
		return -EBUSY;
	err = buf_cap_get(opts, &cap);
	if (err)
		return err;
	program = opts->program ? opts->program : exe_path(exe, sizeof(exe));
	err = pki_trace_clock_setup(opts->clock, &S.ci);
	if (err) {
		pki_warn("trace %s: clock %d: %s\n", path, opts->clock, pki_errstr(err));
		return err;
	}
	if (!S.key_made) {
		err = -pthread_key_create(&S.key, buf_release);
		if (err)
			return err;
		S.key_made = true;
	}
	if (opts->ring && (err = ring_setup(cap)))
		return err;
	pack_setup(opts->unpacked);
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
	__atomic_store_n(&S.drainer_running, !opts->no_drainer, __ATOMIC_RELEASE);
	__atomic_store_n(&S.state, ST_ACTIVE, __ATOMIC_RELEASE);
	if (!opts->no_drainer) {
		err = drainer_start();
		if (err) {
			pki_warn("trace %s: drainer thread: %s\n", path, pki_errstr(err));
			goto err_active;
		}
	}
	return 0;

err_active:
	__atomic_store_n(&S.state, ST_IDLE, __ATOMIC_RELEASE);
	room_release();
	signals_restore();
err_close:
	pki_fd_close(&S.f);
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
	if (!__atomic_compare_exchange_n(&S.state, &st, ST_ENDING, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE)) {
		/* ended by a fatal signal or exec_prepare: only tidy up */
		if (st == ST_IDLE)
			return 0;
		err = 0;
		drainer_stop();
		goto out;
	}
	drainer_stop();
	writer_lock(&saved);
	err = emit_trailer(reason, 0);
	writer_unlock_restore(&saved);
	if (S.io_err && !err)
		err = S.io_err;
	if (err)
		pki_warn("trace: writing the trace file: %s\n", pki_errstr(err));
out:
	signals_restore();
	pki_fd_close(&S.f);
	__atomic_store_n(&S.state, ST_IDLE, __ATOMIC_RELEASE);
	return err;
}

int pki_trace_flush(void)
{
	sigset_t saved;
	int err = -EBADF;

	pki_trace_busy++;
	writer_lock(&saved);
	if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) != ST_ACTIVE)
		;
	else if (pki_trace_ring) /* a ring's events are written by snapshots only */
		err = ring_snapshot(PKI_TRIGGER_CALL, 0, 0, false);
	else
		err = drain_all(true, false, NULL);
	writer_unlock_restore(&saved);
	pki_trace_busy--;
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
	writer_lock(&saved);
	if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) == ST_ACTIVE)
		err = emit_string_rec(PKI_REC_OBJECT, &o, sizeof(o), path, o.path_len);
	writer_unlock_restore(&saved);
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
	writer_lock(&saved);
	if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) == ST_ACTIVE)
		err = emit_string_rec(PKI_REC_SYMBOL, &s, sizeof(s), name, s.name_len);
	writer_unlock_restore(&saved);
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
	writer_lock(&saved);
	if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) == ST_ACTIVE)
		err = emit_string_rec(PKI_REC_ARGS, &a, sizeof(a), spec, a.spec_len);
	writer_unlock_restore(&saved);
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
	writer_lock(&saved);
	if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) != ST_ACTIVE)
		err = -EBADF;
	while (!err && i < n) {
		size_t len = 0;

		/*
		 * Records in the chunk, one write; CRC of a record is over its
		 * payload only (format.h), so a chunk is the records as emit()
		 * would write them one by one.
		 */
		for (; i < n && len + MAX_REC <= CHUNK; i++) {
			if (!v[i].name || v[i].fn > PKI_EV_FN_MAX)
				continue;
			len += symbol_rec(buf + len, v[i].fn, v[i].object_id, v[i].name);
		}
		if (len) {
			struct iovec io = {buf, len};

			err = emit_iov(PKI_REC_SYMBOL, &io, 1, len);
		}
	}
	writer_unlock_restore(&saved);
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
	if (!__atomic_compare_exchange_n(&S.state, &st, ST_ENDING, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return -EBADF;
	room_release(); /* waiters drop their events: they come after END */
	writer_lock(&saved);
	err = emit_trailer(PKI_END_EXEC, 0);
	__atomic_store_n(&S.state, ST_EXEC, __ATOMIC_RELEASE);
	writer_unlock_restore(&saved);
	return err;
}

int pki_trace_exec_failed(void)
{
	int st = ST_EXEC, err = 0;
	sigset_t saved;

	writer_lock(&saved);
	if (!__atomic_compare_exchange_n(&S.state, &st, ST_ACTIVE, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE)) {
		err = -EBADF;
	} else if (file_ready() || ftruncate(S.f.fd, (off_t)S.end_off)) {
		err = S.f.fd < 0 ? -EBADF : -errno;
	} else {
		S.off = S.end_off;
	}
	writer_unlock_restore(&saved);
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

	if (__atomic_load_n(&S.state, __ATOMIC_ACQUIRE) == ST_IDLE)
		return;
	if (self && self != &internal_buf && self != &gone_buf)
		pki_trace_tls = self = pki_trace_hold_fork_child(self);
	for (b = S.bufs; b; b = next) {
		next = b->next;
		if (b != self)
			buf_free(b);
	}
	S.bufs = NULL;
	S.buf_mem = 0;
	if (self && self != &internal_buf && self != &gone_buf) {
		S.buf_mem = self->map_len;
		self->next = NULL;
		self->tid = (uint32_t)gettid();
		S.bufs = self;
	}
	signals_restore();
	pki_fd_close(&S.f);
	S.writer = 0;
	S.drainer_running = false; /* it does not exist here: nobody waits for room */
	S.wake = 0;
	S.waiters = 0; /* the threads that were waiting are the parent's */
	S.stalled = 0;
	__atomic_store_n(&S.state, ST_IDLE, __ATOMIC_RELEASE);
}

void pki_trace_counts(struct pki_trace_counts *c)
{
	struct pki_trace_buf *b;
	sigset_t saved;

	memset(c, 0, sizeof(*c));
	writer_lock(&saved);
	c->recorded = S.recorded;
	c->late_lost = __atomic_load_n(&S.late_lost, __ATOMIC_RELAXED);
	c->lost = S.gone_lost + c->late_lost;
	for (b = __atomic_load_n(&S.bufs, __ATOMIC_ACQUIRE); b; b = b->next)
		c->lost += buf_lost(b) - b->lost_base;
	c->threads = __atomic_load_n(&S.nthreads, __ATOMIC_RELAXED);
	c->overwritten = R.overwritten;
	c->snapshots = R.snapshots;
	writer_unlock_restore(&saved);
}
