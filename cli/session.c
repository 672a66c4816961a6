// SPDX-License-Identifier: MIT
/*
 * The files of one trace session, read as one (report, replay,
 * export).  `probekit trace -o FILE` writes FILE for its first process,
 * FILE.<pid> for each child and FILE.<pid>.<n> for the n-th program process
 * <pid> exec'd, and every one of them carries the run's SESSION id
 * (format.h).  A session is FILE, named, plus the files beside it named
 * that way whose SESSION id is FILE's: a file an earlier run left under
 * such a name carries another id and is left alone (with a note).  A file
 * that is not its run's first (FILE.<pid>..., or one without a SESSION
 * record: written before version 1.8) is read alone.
 *
 * Timestamps of different files are not comparable as they are (each
 * process calibrated its clock on its own): every view converts them to
 * CLOCK_MONOTONIC through the file's HEADER pair (ref_ticks, ref_mono_ns),
 * and counts the session's time from its earliest event.
 */
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "traceread/reader.h"

bool cli_pids_add(struct cli_pids *p, const char *cmd, const char *list)
{
	const char *s = list;

	for (;;) {
		char *end;
		unsigned long v = strtoul(s, &end, 10);
		uint32_t *nv;

		if (end == s || *s == '-' || *s == '+' || v == 0 || v > INT32_MAX ||
		    (*end && *end != ',')) {
			cli_usage_error("%s: --pid: '%s' is not a process id (PID, or PID,PID...)",
					cmd, list);
			return false;
		}
		nv = realloc(p->v, (p->n + 1) * sizeof(*nv));
		if (!nv) {
			cli_error("out of memory");
			return false;
		}
		p->v = nv;
		p->v[p->n++] = (uint32_t)v;
		if (!*end)
			return true;
		s = end + 1;
	}
}

static bool pid_wanted(const struct cli_pids *p, uint32_t pid)
{
	for (size_t i = 0; i < p->n; i++)
		if (p->v[i] == pid)
			return true;
	return !p->n;
}

/* Is @name @base.<pid> or @base.<pid>.<n>, the numbers written as the agent does? */
static bool session_name(const char *name, const char *base)
{
	size_t bl = strlen(base), n;
	const char *p = name + bl;

	if (strncmp(name, base, bl) || *p++ != '.')
		return false;
	for (int part = 0; part < 2; part++) {
		n = strspn(p, "0123456789");
		if (!n || *p == '0')
			return false;
		p += n;
		if (!*p)
			return true;
		if (*p++ != '.')
			return false;
	}
	return false;
}

/* The HEADER and SESSION of @path, quietly; NULL if it is no readable trace. */
static struct pki_trace_file *peek(const char *path, char *err, size_t errlen)
{
	return pki_trace_file_open(path, PKI_TRACE_HEAD_ONLY, err, errlen);
}

static int path_add(char ***v, size_t *n, const char *path)
{
	char **nv = realloc(*v, (*n + 1) * sizeof(*nv));

	if (!nv)
		return -ENOMEM;
	*v = nv;
	if (!(nv[*n] = strdup(path)))
		return -ENOMEM;
	(*n)++;
	return 0;
}

/*
 * The files beside @path of the session @id, of the processes @pids keeps,
 * added to @v.  One of another run is left alone, and said.
 */
static int siblings_find(const char *path, uint64_t id, const struct cli_pids *pids, char ***v,
			 size_t *n)
{
	char dirbuf[PATH_MAX], basebuf[PATH_MAX], sib[2 * PATH_MAX + 2], err[256];
	const char *dir, *base;
	struct dirent *de;
	int ret = 0;
	DIR *d;

	snprintf(dirbuf, sizeof(dirbuf), "%s", path);
	snprintf(basebuf, sizeof(basebuf), "%s", path);
	dir = dirname(dirbuf);
	base = basename(basebuf);
	d = opendir(dir);
	if (!d)
		return 0; /* (FILE alone, then) */
	while (!ret && (de = readdir(d))) {
		struct pki_trace_file *f;

		if (!session_name(de->d_name, base))
			continue;
		/* (named as @path is: beside it, or in its directory) */
		snprintf(sib, sizeof(sib), "%s%s%s", strchr(path, '/') ? dir : "",
			 strchr(path, '/') ? "/" : "", de->d_name);
		f = peek(sib, err, sizeof(err));
		if (!f)
			fprintf(stderr, "probekit: note: %s: not read: %s\n", sib, err);
		else if (f->session != id || f->session_first)
			fprintf(stderr,
				"probekit: note: %s is not of %s's session (left by another "
				"run): not read\n",
				sib, path);
		else if (pid_wanted(pids, f->pid))
			ret = path_add(v, n, sib);
		pki_trace_file_free(f);
	}
	closedir(d);
	return ret;
}

/* The first process's file first, then the others by when they started. */
static int proc_cmp(const void *pa, const void *pb)
{
	const struct cli_proc *a = pa, *b = pb;

	if (a->f->session_first != b->f->session_first)
		return a->f->session_first ? -1 : 1;
	if (a->f->ref_mono_ns != b->f->ref_mono_ns)
		return a->f->ref_mono_ns < b->f->ref_mono_ns ? -1 : 1;
	return strcmp(a->path, b->path);
}

/* Which paths make the session of @path (see the top); 0, 1 (said), or -ENOMEM. */
static int session_paths(const char *path, const struct cli_pids *pids, char ***v, size_t *n)
{
	char err[256];
	struct pki_trace_file *f = peek(path, err, sizeof(err));
	bool first = f && f->session && f->session_first;
	uint64_t id = f ? f->session : 0;
	uint32_t pid = f ? f->pid : 0;
	int ret = 0;

	pki_trace_file_free(f);
	if (!f || pid_wanted(pids, pid))
		ret = path_add(v, n, path); /* (its error, if any, is said when it is opened) */
	if (!ret && first)
		ret = siblings_find(path, id, pids, v, n);
	return ret;
}

/* Say which processes the session has, for a --pid that kept none. */
static void pids_none(const char *cmd, const char *path)
{
	cli_error("%s: %s: no process of the session has the pid given to --pid (probekit report "
		  "%s lists them)",
		  cmd, path, path);
}

static void origin_set(struct cli_session *s)
{
	bool any = false;

	for (size_t i = 0; i < s->n; i++) {
		const struct pki_trace_file *f = s->p[i].f;
		uint64_t o = cli_mono_ns(f, f->origin);

		if (f->nevents && (!any || o < s->origin_ns)) {
			s->origin_ns = o;
			any = true;
		}
	}
	if (!any)
		s->origin_ns = s->n ? cli_mono_ns(s->p[0].f, s->p[0].f->origin) : 0;
}

int cli_session_open(struct cli_session *s, const char *cmd, const char *path,
		     const struct cli_pids *pids)
{
	char **v = NULL;
	size_t n = 0, i;
	int ret;

	memset(s, 0, sizeof(*s));
	ret = session_paths(path, pids, &v, &n);
	if (!ret && !n) {
		pids_none(cmd, path);
		ret = 1;
	}
	if (!ret && !(s->p = calloc(n, sizeof(*s->p))))
		ret = -ENOMEM;
	for (i = 0; !ret && i < n; i++) {
		s->p[i].path = v[i];
		v[i] = NULL;
		s->p[i].f = cli_trace_open(s->p[i].path);
		s->n++;
		ret = s->p[i].f ? 0 : 1;
	}
	for (i = 0; i < n; i++)
		free(v[i]);
	free(v);
	if (ret == -ENOMEM)
		cli_error("%s: out of memory", cmd);
	if (ret) {
		cli_session_free(s);
		return 1;
	}
	qsort(s->p, s->n, sizeof(*s->p), proc_cmp);
	origin_set(s);
	return 0;
}

void cli_session_free(struct cli_session *s)
{
	for (size_t i = 0; i < s->n; i++) {
		pki_trace_file_free(s->p[i].f);
		free(s->p[i].path);
	}
	free(s->p);
	memset(s, 0, sizeof(*s));
}

uint64_t cli_mono_ns(const struct pki_trace_file *f, uint64_t ts)
{
	if (ts >= f->ref_ticks)
		return f->ref_mono_ns + pki_trace_file_dur_ns(f, ts - f->ref_ticks);
	uint64_t back = pki_trace_file_dur_ns(f, f->ref_ticks - ts);

	return back < f->ref_mono_ns ? f->ref_mono_ns - back : 0;
}

uint64_t cli_session_ts_ns(const struct cli_session *s, const struct pki_trace_file *f, uint64_t ts)
{
	uint64_t ns = cli_mono_ns(f, ts);

	return ns > s->origin_ns ? ns - s->origin_ns : 0;
}

bool cli_session_pid_named(const struct cli_session *s, size_t k)
{
	for (size_t i = 0; i < k; i++)
		if (s->p[i].f->pid == s->p[k].f->pid)
			return true;
	return false;
}
