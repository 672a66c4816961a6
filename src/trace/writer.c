// SPDX-License-Identifier: MIT
/*
 * The trace file and the right to write it: the writer word (TW1-TW3), and
 * every record written whole at pki_tw.off (TF1), through a descriptor
 * checked and reopened (TF2), with room kept for the trailer, the size
 * limits met as a full file system and failures cut off (TF3), the losses
 * counted by cause.  How a record is written is an argument of
 * pki_tw_emit() (enum pki_tw_how).  Calls no other file of the recorder
 * (trace_int.h).
 * doc/design/trace-writer.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <linux/falloc.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/fd.h"
#include "trace/crc32.h"
#include "trace/pack.h"
#include "trace/trace_int.h"

#define EVENTS_MIN_REC 16u /* records shrink down to this when the file system fills */
/* Kept allocated past the end of the file: the STATUS record and the trailer. */
#define RESERVE_LEN	(16u << 10)
#define END_REC_LEN	(sizeof(struct pki_trace_frame) + sizeof(struct pki_rec_end))
#define LOSSES_REC_LEN	(sizeof(struct pki_trace_frame) + sizeof(struct pki_rec_losses))
#define REOPEN_RETRY_NS 1000000000ull /* a lost descriptor: try the path again this often */

/* ---- the writer word (TW1-TW3 of doc/design/trace-writer.md) ----------- */
bool pki_tw_lock_timed(uint64_t timeout_ns)
{
	int self = gettid(), zero;
	uint64_t t0 = 0;

	for (;;) {
		zero = 0;
		if (__atomic_compare_exchange_n(&pki_tw.writer, &zero, self, false,
						__ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
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

void pki_tw_unlock(void)
{
	__atomic_store_n(&pki_tw.writer, 0, __ATOMIC_RELEASE);
}

/* Normal context: block the fatal signals (TW1), then take the word. */
void pki_tw_lock(sigset_t *saved)
{
	pthread_sigmask(SIG_BLOCK, &pki_tw.fatal_set, saved);
	pki_tw_lock_timed(UINT64_MAX);
}

void pki_tw_unlock_restore(const sigset_t *saved)
{
	pki_tw_unlock();
	pthread_sigmask(SIG_SETMASK, saved, NULL);
}

/* ---- records (async-signal-safe: pwritev, CRC, no allocation) ------------ */

int pki_tw_pwritev_all(int fd, struct iovec *iov, int n, uint64_t off)
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

	if (!pki_tw.notice)
		return;
	n = cat(buf, n, sizeof(buf), "probekit: trace ");
	n = cat(buf, n, sizeof(buf), pki_tw.path);
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
	pki_tw.notice(buf);
}

uint64_t pki_tw_lost_now(void)
{
	uint64_t lost = pki_tw.gone_lost + __atomic_load_n(&pki_tw.late_lost, __ATOMIC_RELAXED);
	struct pki_trace_buf *b;

	for (b = __atomic_load_n(&pki_tw.bufs, __ATOMIC_ACQUIRE); b; b = b->next)
		lost += pki_tw_buf_lost(b) - b->lost_base;
	return lost;
}

/* A STATUS record: into the reserve, even after writing stopped. */
static int emit_status(uint32_t what, int err, uint64_t ticks)
{
	struct pki_rec_status st = {.what = what, .error = err < 0 ? -err : err, .ticks = ticks};
	struct iovec p = {&st, sizeof(st)};

	st.lost = pki_tw_lost_now();
	return pki_tw_emit(PKI_REC_STATUS, &p, 1, PKI_TW_TRAILER);
}

/*
 * Is pki_tw.f still our file?  If the program closed or replaced the
 * descriptor, reopen pki_tw.path, but only if it still is the same file
 * (device, inode) and no shorter than what we wrote: never a file put in
 * its place.  Say so in the file (STATUS: STOPPED if events were lost
 * meanwhile, RESUMED) and to the notice callback.  0, or -errno: nothing
 * may be written now.  A reopen that failed is tried again after
 * REOPEN_RETRY_NS, or at once for a record of the trailer (@how
 * PKI_TW_TRAILER).
 */
int pki_tw_file_ready(unsigned how)
{
	struct stat st;
	uint64_t now;
	int fd, err;

	if (pki_fd_check(&pki_tw.f))
		return 0;
	now = pki_trace_mono_ns();
	if (!pki_tw.lost_ticks)
		pki_tw.lost_ticks = pki_trace_now() | 1;
	else if (pki_tw.lost_err && !(how & PKI_TW_TRAILER) &&
		 now - pki_tw.lost_try < REOPEN_RETRY_NS)
		return pki_tw.lost_err;
	pki_tw.lost_try = now;
	fd = open(pki_tw.path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
	} else if (fstat(fd, &st) || !pki_fd_same(&pki_tw.f, st.st_dev, st.st_ino) ||
		   (uint64_t)st.st_size < pki_tw.off) {
		close(fd);
		err = -ESTALE;
	} else {
		err = pki_fd_own(&pki_tw.f, fd);
	}
	if (err) {
		if (!pki_tw.lost_err)
			say("PROG closed or replaced the trace's descriptor; cannot reopen the "
			    "file",
			    err, ": tracing stopped; later events are counted as lost");
		pki_tw.lost_err = err;
		return err;
	}
	pki_tw.reserved_to = 0;
	if (pki_tw.lost_err)
		emit_status(PKI_STATUS_STOPPED, pki_tw.lost_err, pki_tw.lost_ticks);
	emit_status(PKI_STATUS_RESUMED, EBADF, pki_trace_now());
	say(pki_tw.lost_err ? "PROG closed or replaced the trace's descriptor; reopened the file, "
			      "tracing resumed (events meanwhile counted as lost)"
			    : "PROG closed or replaced the trace's descriptor; reopened the file, "
			      "tracing goes on",
	    0, "");
	pki_tw.lost_err = 0;
	pki_tw.lost_ticks = 0;
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
	uint64_t want = pki_tw.off + len + RESERVE_LEN;

	if (!keep || pki_tw.no_falloc || want <= pki_tw.reserved_to)
		return 0;
	while (fallocate(pki_tw.f.fd, FALLOC_FL_KEEP_SIZE, (off_t)pki_tw.off,
			 (off_t)(want - pki_tw.off))) {
		if (errno == EINTR)
			continue;
		if (errno == ENOSPC || errno == EDQUOT)
			return -errno;
		pki_tw.no_falloc = true;
		return 0;
	}
	pki_tw.reserved_to = want;
	return 0;
}

/* Give back the reserve past the end (the trace is complete). */
void pki_tw_reserve_release(void)
{
	if (pki_tw.f.fd >= 0 && pki_tw.reserved_to > pki_tw.off)
		fallocate(pki_tw.f.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			  (off_t)pki_tw.off, (off_t)(pki_tw.reserved_to - pki_tw.off));
	pki_tw.reserved_to = 0;
}

/*
 * Writing @err'd (@cause: PKI_STOP_*): cut the part of the record that was
 * written (a reader keeps every whole record before it), stop writing
 * events, say why.  Also in the trailer: what it writes next goes into the
 * reserve, and its drain counts the rest as lost (a record size that would
 * shrink without end spun here once).  @trailer: the trailer's LOSSES
 * record's (pki_tw_emit_losses()).
 */
static void write_failed(int err, uint32_t cause, bool trailer)
{
	static const char stopped_rest[] = ": tracing stopped; the file keeps every event written "
					   "before, later ones are counted as lost";

	if (!pki_tw.io_err)
		pki_tw.io_err = err;
	if (pki_tw.f.fd >= 0 && ftruncate(pki_tw.f.fd, (off_t)pki_tw.off)) {
		/* nothing better to do: the reader stops at the cut record */
	}
	if (pki_tw.stop_err)
		return;
	pki_tw.stop_err = err;
	pki_tw.stop_cause = cause;
	emit_status(PKI_STATUS_STOPPED, err, pki_trace_now());
	pki_tw_emit_losses(trailer);
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
	uint64_t lim = pki_tw.max_size ? pki_tw.max_size : UINT64_MAX;
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
 * The room a trailer's record of @type leaves after it for the ones that
 * must follow it: the trailer's LOSSES record, then END (the per-thread
 * LOST records before them take what is left).
 */
static uint64_t trailer_keep(uint32_t type)
{
	return type == PKI_REC_END	? 0
	       : type == PKI_REC_LOSSES ? END_REC_LEN
					: END_REC_LEN + LOSSES_REC_LEN;
}

/*
 * Does a record of @len bytes (frame and padding included) of @type fit
 * under size_limit()?  EVENTS, and any record outside the trailer, leave
 * RESERVE_LEN for the STATUS record and the trailer; the trailer's records
 * leave trailer_keep().  If not, writing stops (an EVENTS record that may
 * shrink, PKI_TW_SHRINK, only returns -EFBIG: its caller tries a smaller
 * one); the LOSSES record that says so counts no held call, even in the
 * trailer (the trailer's own LOSSES, written after it, does).
 */
static int size_check(uint32_t type, uint64_t len, unsigned how)
{
	uint32_t cause;
	uint64_t lim = size_limit(&cause), keep;

	if (lim == UINT64_MAX)
		return 0;
	keep = !(how & PKI_TW_TRAILER) || events_rec(type) ? RESERVE_LEN : trailer_keep(type);
	if (pki_tw.off + len + keep <= lim)
		return 0;
	if (!(how & PKI_TW_SHRINK))
		write_failed(-EFBIG, cause, false);
	return -EFBIG;
}

bool pki_tw_trailer_room(uint64_t len)
{
	uint32_t cause;

	if (!pki_tw.stop_err)
		return true;
	len += trailer_keep(PKI_REC_LOST);
	return pki_tw.off + len <= size_limit(&cause) &&
	       (pki_tw.no_falloc || pki_tw.off + len <= pki_tw.reserved_to);
}

int pki_tw_emit(uint32_t type, const struct iovec *parts, int n, unsigned how)
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
	return pki_tw_emit_iov(type, iov, n + 2, sizeof(fr) + len + pad, how);
}

/*
 * Write @iov[0..n), @total bytes of whole records of @type (framed and
 * padded already), at pki_tw.off, as @how.  Caller holds the writer.
 */
int pki_tw_emit_iov(uint32_t type, struct iovec *iov, int n, size_t total, unsigned how)
{
	struct iovec again[8];
	int err, tries;

	if (pki_tw.stop_err && !(how & PKI_TW_TRAILER))
		return pki_tw.stop_err;
	/*
	 * opts.max_size and ulimit -f: as a file system full at that size.
	 * Events are refused in the trailer too (the last drain, a ring's last
	 * snapshot); its STATUS, LOST and END records still go in.
	 */
	err = size_check(type, total, how);
	if (err)
		return err;
	memcpy(again, iov, sizeof(iov[0]) * (size_t)n);
	for (tries = 0;; tries++) {
		err = pki_tw_file_ready(how);
		if (err)
			return err; /* lost descriptor: pki_tw_file_ready() said so */
		err = reserve(total, !(how & PKI_TW_TRAILER) || events_rec(type));
		if (err && (how & PKI_TW_SHRINK))
			return err; /* nothing written: the caller tries a smaller record */
		if (!err)
			err = pki_tw_pwritev_all(pki_tw.f.fd, iov, n, pki_tw.off);
		/* Closed between the check and the write: check (and reopen) again. */
		if (err != -EBADF || tries)
			break;
		memcpy(iov, again, sizeof(iov[0]) * (size_t)n);
	}
	if (err) {
		write_failed(err, PKI_STOP_ERROR, how & PKI_TW_TRAILER);
		return err;
	}
	pki_tw.off += total;
	return 0;
}

int pki_tw_emit_string(uint32_t type, const void *fixed, size_t flen, const char *s, uint32_t slen,
		       unsigned how)
{
	struct iovec p[2] = {{(void *)fixed, flen}, {(void *)s, slen}};

	return pki_tw_emit(type, p, 2, how);
}

/*
 * The LOSSES record: what was lost so far, by cause, and why writing
 * stopped.  Into the reserve, as a STATUS record.  @trailer: the
 * trailer's, whose late count takes the held calls still undecided
 * (pki_tw.held_late).
 */
int pki_tw_emit_losses(bool trailer)
{
	struct pki_rec_losses r = {.stop_error =
				       pki_tw.stop_err < 0 ? -pki_tw.stop_err : pki_tw.stop_err};
	struct iovec p = {&r, sizeof(r)};
	struct pki_trace_buf *b;
	uint64_t t[LK_N], k[LK_N];
	int i;

	memcpy(t, pki_tw.gone_kinds, sizeof(t));
	for (b = __atomic_load_n(&pki_tw.bufs, __ATOMIC_ACQUIRE); b; b = b->next) {
		pki_tw_buf_kinds(b, k);
		for (i = 0; i < LK_N; i++)
			t[i] += k[i] - b->kind_base[i];
	}
	r.full = t[LK_FULL];
	r.nested = t[LK_NESTED];
	r.depth = t[LK_DEPTH];
	r.unwritten = t[LK_UNWRITTEN];
	r.late =
	    __atomic_load_n(&pki_tw.late_lost, __ATOMIC_RELAXED) + (trailer ? pki_tw.held_late : 0);
	r.stop_cause = r.stop_error ? pki_tw.stop_cause : 0;
	if (!r.full && !r.nested && !r.depth && !r.unwritten && !r.late && !r.stop_error)
		return 0;
	return pki_tw_emit(PKI_REC_LOSSES, &p, 1, PKI_TW_TRAILER);
}

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

/*
 * One record of thread @tsn's events: the @n1 at @ev1 then the @n2 at @ev2
 * (a ring's two halves).  PACKED, or EVENTS as they are when no packing
 * buffer could be mapped.
 */
static int emit_span(uint32_t tsn, const struct pki_trace_event *ev1, uint64_t n1,
		     const struct pki_trace_event *ev2, uint64_t n2, unsigned how)
{
	struct iovec p[3];

	if (pki_tw.pack) {
		struct pki_rec_packed hdr = {.tsn = tsn, .count = (uint32_t)(n1 + n2)};
		struct pki_pack pk;
		size_t len;

		hdr.base_ts = first_time(ev1, n1, ev2, n2);
		pki_pack_begin(&pk, hdr.base_ts);
		len = pki_pack_events(&pk, pki_tw.pack, ev1, n1);
		len += pki_pack_events(&pk, pki_tw.pack + len, ev2, n2);
		p[0] = (struct iovec){&hdr, sizeof(hdr)};
		p[1] = (struct iovec){pki_tw.pack, len};
		return pki_tw_emit(PKI_REC_PACKED, p, 2, how);
	} else {
		struct pki_rec_events hdr = {.tsn = tsn, .count = (uint32_t)(n1 + n2)};

		p[0] = (struct iovec){&hdr, sizeof(hdr)};
		p[1] = (struct iovec){(void *)ev1, n1 * sizeof(*ev1)};
		p[2] = (struct iovec){(void *)ev2, n2 * sizeof(*ev2)};
		return pki_tw_emit(PKI_REC_EVENTS, p, 3, how);
	}
}

/*
 * Write events @first..@first + @n of @ev (slot = index & @mask) as EVENTS
 * or PACKED records of @b's thread; *@done counts those written (they are in the file
 * once counted).  After each record @landed (if set) is told the index past
 * it.  A nearly full file system makes the records smaller, so that every
 * event that fits is kept (written PKI_TW_SHRINK, pki_tw_emit() then fails
 * without stopping).  @how: as the other records of the caller.
 */
int pki_tw_emit_events(struct pki_trace_buf *b, const struct pki_trace_event *ev, uint64_t mask,
		       uint64_t first, uint64_t n, uint64_t *done,
		       void (*landed)(struct pki_trace_buf *, uint64_t), unsigned how)
{
	uint64_t t = first, h = first + n;
	bool shrink;
	int err;

	while (t != h) {
		uint64_t k = h - t, i = t & mask, k1;

		if (k > pki_tw.events_per_rec)
			k = pki_tw.events_per_rec;
		k1 = mask + 1 - i;
		if (k1 > k || !k1) /* !k1: mask is ~0, a flat array */
			k1 = k;
		shrink = pki_tw.events_per_rec > EVENTS_MIN_REC;
		err = emit_span(b->tsn, &ev[i], k1, ev, k - k1, how | (shrink ? PKI_TW_SHRINK : 0));
		if (shrink && (err == -ENOSPC || err == -EDQUOT || err == -EFBIG) &&
		    !pki_tw.stop_err) {
			pki_tw.events_per_rec /= 4;
			if (pki_tw.events_per_rec < EVENTS_MIN_REC)
				pki_tw.events_per_rec = EVENTS_MIN_REC;
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

/*
 * The writer's PACKED record buffer, mapped once for every session (its
 * pages are touched as records need them); without it, or @unpacked, the
 * events go out as EVENTS records.
 */
void pki_tw_pack_setup(bool unpacked)
{
	static uint8_t *buf;

	if (!buf && !unpacked) {
		void *m =
		    mmap(NULL, (size_t)EVENTS_PER_REC * PKI_PACK_MAX_EVENT, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		buf = m == MAP_FAILED ? NULL : m;
	}
	pki_tw.pack = unpacked ? NULL : buf;
}
