// SPDX-License-Identifier: MIT
/*
 * libprobekit-agent.so, preloaded into PROG by `probekit trace` and
 * `probekit watch`: the plumbing its modes and interposers share
 * (agent_int.h).  The constructor reads the settings the command put in the
 * environment (agent.h), removes them from it, sets up the interposers and
 * starts the mode asked for (trace.c, watch.c), all before main() runs.
 * Also here: the command's two descriptors (the control pipe, answered
 * once, and the report), the lookup of the real functions the agent's
 * wrappers hide, trace mode's -f/-N selection (trace.c, dlopen.c), and the
 * environment that passes trace mode's settings on to the programs PROG
 * starts (trace.c's exec and spawn wrappers, shell.c).
 *
 * What runs where: the constructor and the settings' readers alone in the
 * process, before main(); agent_out_write(), agent_notice() and
 * agent_next() in any context, signal handlers included;
 * agent_env_for_next() and agent_child_env() in any thread and in vfork
 * children (they write only the caller's buffer).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <probekit/probekit.h>

#include "agent.h"
#include "agent_int.h"
#include "sym/sites.h"
#include "base/fd.h"
#include "base/sigown.h"
#include "sym/demangle.h"
#include "trace/trace.h"

#define BUF_EVENTS (1u << 16) /* per thread: 1 MiB, ~1 ms of a busy thread (it waits when full) */

struct agent_watch_conf agent_watch_conf;
struct agent_trace_conf agent_trace_conf;
struct agent_lineage agent_lineage;
bool agent_attached;
bool agent_injected;

/* The command's descriptors. */
static struct {
	/*
	 * The report descriptor: the command's pipe (owned, moved to a high
	 * number) or fd 2 when run by hand (noted).  Checked before each write:
	 * PROG may close it and open a file of its own at its number (fd.h).
	 */
	struct pki_fd out;
	int ctl_fd;
} cmd = {.out = PKI_FD_INIT, .ctl_fd = -1};

/* ---- output ---- */

/*
 * Write to the report descriptor if it still is the one we were given;
 * else stay quiet (never into a file of PROG's).  The command may be gone
 * (a daemon outlives it): SIGPIPE is blocked around the write and, if our
 * write raised it (it was not pending before), taken back, so PROG never
 * sees a signal of ours.  Async-signal-safe (the trace writer's notices
 * come from its fatal-signal flush too); errno preserved.
 */
void agent_out_write(const char *buf, size_t n)
{
	struct timespec zero = {0, 0};
	sigset_t pipe_set, old, pend;
	bool had, epipe = false;
	int saved = errno;

	if (!pki_fd_check(&cmd.out))
		return;
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
	had = !sigpending(&pend) && sigismember(&pend, SIGPIPE);
	while (n) {
		ssize_t w = write(cmd.out.fd, buf, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EPIPE)
			epipe = true;
		if (w <= 0)
			break;
		buf += w;
		n -= (size_t)w;
	}
	if (epipe && !had)
		sigtimedwait(&pipe_set, NULL, &zero);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	errno = saved;
}

void agent_notice(const char *line)
{
	agent_out_write(line, strlen(line));
}

void agent_out_printf(const char *fmt, ...)
{
	char buf[4096];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	agent_out_write(buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

static int print_lib(enum pk_print_level level, const char *fmt, va_list ap)
{
	char buf[1024];
	int n = vsnprintf(buf, sizeof(buf), fmt, ap);

	(void)level;
	if (n > 0) {
		agent_out_write("# probekit: ", 12);
		agent_out_write(buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
	}
	return n;
}

/* Status line to the command (once), then close the control pipe. */
void ctl_send(const char *msg)
{
	if (cmd.ctl_fd < 0)
		return;
	pki_trace_busy++; /* the agent's calls, not the program's: never events */
	if (write(cmd.ctl_fd, msg, strlen(msg)) < 0) {
		/* the command is gone; nothing to tell */
	}
	close(cmd.ctl_fd);
	cmd.ctl_fd = -1;
	pki_trace_busy--;
}

/* Refuse to run PROG: tell the command (or stderr if run by hand) and end PROG before main. */
void refuse(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;

	n = snprintf(buf, sizeof(buf), "%s", PK_CTL_ERROR);
	va_start(ap, fmt);
	vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	strcat(buf, "\n");
	if (cmd.ctl_fd >= 0)
		ctl_send(buf);
	else if (write(2, "probekit-agent: ", 16) < 0 || write(2, buf, strlen(buf)) < 0) {
		/* nowhere to say it */
	}
	_exit(PK_AGENT_EXIT_REFUSED);
}

void *agent_next(void **cache, const char *name)
{
	void *fn = __atomic_load_n(cache, __ATOMIC_ACQUIRE);

	if (!fn) {
		fn = dlsym(RTLD_NEXT, name);
		__atomic_store_n(cache, fn, __ATOMIC_RELEASE);
	}
	return fn;
}

/* ---- configuration ---- */

static int env_fd(const char *name, int dflt)
{
	const char *v = getenv(name);
	char *end;
	long fd;

	if (!v)
		return dflt;
	fd = strtol(v, &end, 10);
	if (*end || fd < 0 || fd > INT_MAX || fcntl((int)fd, F_GETFD) < 0)
		return -1;
	return (int)fd;
}

static char *dup_setting(const char *(*get)(const char *), const char *name)
{
	const char *v = get(name);

	return v && *v ? strdup(v) : NULL;
}

static const char *env_get(const char *name)
{
	return getenv(name);
}

void agent_out_use(int fd)
{
	pki_fd_close(&cmd.out);
	if (fd >= 0)
		pki_fd_own(&cmd.out, fd);
}

/* The command's descriptors and PROBEKIT_DEBUG: every mode's. */
static void read_cmd_config(void)
{
	int fd;

	cmd.ctl_fd = env_fd(PK_ENV_CTL_FD, -1);
	if (cmd.ctl_fd >= 0)
		fcntl(cmd.ctl_fd, F_SETFD, FD_CLOEXEC);
	fd = env_fd(PK_ENV_OUT_FD, 2);
	if (fd < 0 || (fd > 2 ? pki_fd_own(&cmd.out, fd) : pki_fd_note(&cmd.out, fd)))
		refuse("%s is not an open file descriptor", PK_ENV_OUT_FD);
	if (getenv(PK_ENV_DEBUG))
		pk_set_print(print_lib);
}

/* The unsigned number @name of @get, 0 if unset. */
static unsigned long setting_ulong(const char *(*get)(const char *), const char *name)
{
	const char *v = get(name);

	return v ? strtoul(v, NULL, 0) : 0;
}

bool agent_watch_config(const char *(*get)(const char *), char *why, size_t n)
{
	const char *spec = get(PK_ENV_WATCH), *type = get(PK_ENV_WATCH_TYPE), *mode, *cond, *in,
		   *path;
	struct agent_watch_conf *w = &agent_watch_conf;

	memset(w, 0, sizeof(*w));
	if (!spec)
		return true;
	if (!*spec)
		return snprintf(why, n, "watch: empty SYMBOL: give a symbol or an address"), false;
	if (strlen(spec) >= sizeof(w->spec))
		return snprintf(why, n, "watch: '%.40s...' is too long", spec), false;
	if (!type || !strcmp(type, "w"))
		w->type = PK_WATCH_W;
	else if (!strcmp(type, "rw"))
		w->type = PK_WATCH_RW;
	else if (!strcmp(type, "x"))
		w->type = PK_WATCH_X;
	else
		return snprintf(why, n, "unknown watch type '%s' (w, rw or x)", type), false;
	strcpy(w->spec, spec);
	w->len = setting_ulong(get, PK_ENV_WATCH_LEN);
	w->limit = setting_ulong(get, PK_ENV_WATCH_COUNT);
	w->stack = setting_ulong(get, PK_ENV_WATCH_STACK) != 0;
	w->follow = setting_ulong(get, PK_ENV_WATCH_FOLLOW) != 0;
	mode = get(PK_ENV_WATCH_MODE);
	if (!mode || !strcmp(mode, "auto"))
		w->mode = PK_WATCH_MODE_AUTO;
	else if (!strcmp(mode, "hw"))
		w->mode = PK_WATCH_MODE_HW;
	else if (!strcmp(mode, "page"))
		w->mode = PK_WATCH_MODE_PAGE;
	else
		return snprintf(why, n, "unknown watch mode '%s' (auto, hw or page)", mode), false;
	cond = get(PK_ENV_WATCH_IF);
	if (cond && pk_watch_cond_parse(cond, &w->cond, why, n))
		return false;
	in = get(PK_ENV_WATCH_IN);
	if (!in && (in = get(PK_ENV_WATCH_UNDER)))
		w->under = true;
	if (in && strlen(in) >= sizeof(w->in_func))
		return snprintf(why, n, "watch: --%s '%.40s...' is too long",
				w->under ? "under" : "in", in),
		       false;
	if (in)
		strcpy(w->in_func, in);
	path = get(PK_ENV_WATCH_PATH);
	if (!path || !strcmp(path, "auto"))
		w->path = AGENT_PATH_AUTO;
	else if (!strcmp(path, "ring"))
		w->path = AGENT_PATH_RING;
	else if (!strcmp(path, "signal"))
		w->path = AGENT_PATH_SIGNAL;
	else
		return snprintf(why, n, "unknown watch path '%s' (auto, ring or signal)", path),
		       false;
	return true;
}

static void read_watch_config(void)
{
	char why[256];

	if (!agent_watch_config(env_get, why, sizeof(why)))
		refuse("%s", why);
}

void agent_trace_config(const char *(*get)(const char *))
{
	const char *file = get(PK_ENV_TRACE), *v;
	struct agent_trace_conf *t = &agent_trace_conf;
	Dl_info di;

	if (!file || !*file || strlen(file) >= sizeof(t->base))
		return;
	free(t->funcs);
	free(t->notrace);
	free(t->args);
	free(t->trigger);
	free(t->command);
	memset(t, 0, sizeof(*t));
	t->on = true;
	strcpy(t->base, file);
	t->funcs = dup_setting(get, PK_ENV_TRACE_FUNCS);
	t->notrace = dup_setting(get, PK_ENV_TRACE_NOTRACE);
	t->args = dup_setting(get, PK_ENV_TRACE_ARGS);
	v = get(PK_ENV_TRACE_AUTO_ARGS);
	t->auto_args = v && !strcmp(v, "1");
	v = get(PK_ENV_TRACE_CHILDREN);
	t->children = !v || strcmp(v, "0");
	v = get(PK_ENV_TRACE_ENTRY_ONLY);
	t->exits = !v || strcmp(v, "1");
	t->shstk_test = get(PK_ENV_TRACE_ASSUME_SHSTK) != NULL;
	v = get(PK_ENV_TRACE_DROP);
	t->drop = v && !strcmp(v, "1");
	v = get(PK_ENV_TRACE_RING);
	t->ring = v && !strcmp(v, "1");
	t->trigger = dup_setting(get, PK_ENV_TRACE_TRIGGER);
	t->command = dup_setting(get, PK_ENV_TRACE_CMD);
	v = get(PK_ENV_TRACE_MAX_SIZE);
	t->max_size = v ? strtoull(v, NULL, 10) : 0;
	v = get(PK_ENV_TRACE_BUF);
	t->buf_events = v ? (uint32_t)strtoul(v, NULL, 0) : 0;
	if (t->buf_events < 1024 || t->buf_events > (1u << 26))
		t->buf_events = BUF_EVENTS;
	v = get(PK_ENV_TRACE_PID);
	if (v) {
		t->has_pid = true;
		t->env_pid = strtol(v, NULL, 10);
		v = get(PK_ENV_TRACE_GEN);
		t->env_gen = v ? strtoul(v, NULL, 10) : 0;
	}
	v = get(PK_ENV_TRACE_SESSION);
	t->session = v ? strtoull(v, NULL, 16) : 0;
	/* (a run not started by the command: its files are a session of their own) */
	while (!t->session && getrandom(&t->session, sizeof(t->session), 0) < 0 && errno == EINTR)
		;
	if (!t->session)
		t->session = (uint64_t)time(NULL) << 20 ^ (uint64_t)getpid();
	v = get(PK_ENV_TRACE_TOP);
	t->top = v && !strcmp(v, "1");
	/* The command's settings, else the user's for the library (it reads them itself). */
	v = get(PK_ENV_TRACE_RELOC);
	if (!v)
		v = get("PROBEKIT_RELOC");
	snprintf(t->reloc, sizeof(t->reloc), "%s", v ? v : "");
	v = get(PK_ENV_TRACE_INT3);
	if (!v)
		v = get("PROBEKIT_INT3");
	t->int3 = v && !strcmp(v, "1");
	v = get(PK_ENV_TRACE_LIBCALL);
	t->libcall = !v || strcmp(v, "0");
	if (dladdr((void *)agent_trace_config, &di) && di.dli_fname &&
	    strlen(di.dli_fname) < sizeof(t->agent))
		strcpy(t->agent, di.dli_fname);
}

void agent_library_settings(void)
{
	const char *r = agent_trace_conf.reloc;

	pki_sites_set_reloc(!strcmp(r, "1")	 ? PKI_RELOC_ALL
			    : !strcmp(r, "main") ? PKI_RELOC_MAIN
						 : PKI_RELOC_OFF);
	pki_sites_set_int3(agent_trace_conf.int3);
	if (agent_trace_conf.libcall && strcmp(r, "1")) /* (all relocated: from any caller) */
		agent_libcalls_setup();
}

/*
 * The library's own settings, which the user puts in PROG's environment for
 * the library inside the agent (doc/api.md): they stay, for the library reads
 * them when it first patches, after this cleaning, and for PROG's children.
 */
static bool user_setting(const char *var)
{
	static const char *const keep[] = {
	    "PROBEKIT_TEXT_ALIAS=", "PROBEKIT_TRACE_CLOCK=",	  "PROBEKIT_RELOC=",
	    "PROBEKIT_INT3=",	    "PROBEKIT_HWBP_UNDELIVERED=", "PROBEKIT_RING_FAULTS="};

	for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
		if (!strncmp(var, keep[i], strlen(keep[i])))
			return true;
	return false;
}

/*
 * Remove the agent's PROBEKIT_* variables (not the library settings above)
 * and our entry in LD_PRELOAD, so that PROG
 * sees the environment the user gave and its children are not traced (see
 * the policy in agent.h).  Runs in the constructor: no other thread yet.
 *
 * environ is edited in place, not with setenv()/unsetenv(): a program may
 * define its own (bash does: before its main() they do not touch environ,
 * and a loop waiting for unsetenv() to shift the array would never end).
 * The user's LD_PRELOAD takes the place of the first LD_PRELOAD entry (a
 * string allocated once, never freed: environ refers to it).
 */
static void env_clean(void)
{
	static const char saved_var[] = PK_ENV_PRELOAD_SAVED "=";
	extern char **environ;
	char *pre = NULL;
	size_t i, n = 0;

	if (!environ)
		return;
	for (i = 0; environ[i]; i++)
		if (!strncmp(environ[i], saved_var, sizeof(saved_var) - 1)) {
			const char *saved = environ[i] + sizeof(saved_var) - 1;

			pre = malloc(11 + strlen(saved) + 1);
			if (pre)
				sprintf(pre, "LD_PRELOAD=%s", saved);
		}
	for (i = 0; environ[i]; i++) {
		if (!strncmp(environ[i], "PROBEKIT_", 9) && !user_setting(environ[i]))
			continue;
		if (!strncmp(environ[i], "LD_PRELOAD=", 11)) {
			if (pre)
				environ[n++] = pre;
			pre = NULL;
			continue;
		}
		environ[n++] = environ[i];
	}
	environ[n] = NULL;
	free(pre); /* no LD_PRELOAD entry (preloaded another way): nothing to restore */
}

/* ---- trace mode's selection ---- */

/* Split a newline-separated list in place into *@v (malloc'd); the count, or -ENOMEM. */
static long split(char *list, char ***v)
{
	size_t n = 1;
	char *save = NULL, *tok;

	*v = NULL;
	if (!list)
		return 0;
	for (const char *c = list; *c; c++)
		n += *c == '\n';
	*v = malloc(n * sizeof(**v));
	if (!*v)
		return -ENOMEM;
	n = 0;
	for (tok = strtok_r(list, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save))
		(*v)[n++] = tok;
	return (long)n;
}

int agent_globs_split(struct agent_globs *g, char *funcs, char *notrace)
{
	long nf = split(funcs, &g->f), nn = split(notrace, &g->n);

	g->nf = nf > 0 ? (size_t)nf : 0;
	g->nn = nn > 0 ? (size_t)nn : 0;
	return nf < 0 || nn < 0 ? -ENOMEM : 0;
}

void agent_globs_free(struct agent_globs *g)
{
	free(g->f);
	free(g->n);
	*g = (struct agent_globs){0};
}

bool agent_globs_want(const struct agent_globs *g, const char *name, bool *fmatched)
{
	bool in = !g->nf;
	struct pki_name_forms forms;
	size_t i;

	if (!g->nf && !g->nn)
		return true;
	pki_name_forms_init(&forms, name); /* C++ and Rust names: matched demangled too */
	for (i = 0; i < g->nf && (fmatched || !in); i++)
		if (pki_name_forms_match(&forms, g->f[i])) {
			in = true;
			if (fmatched)
				fmatched[i] = true;
		}
	for (i = 0; in && i < g->nn; i++)
		if (pki_name_forms_match(&forms, g->n[i]))
			in = false;
	pki_name_forms_free(&forms);
	return in;
}

/* ---- the settings passed on ---- */

char *const *agent_env_for_next(char *const *envp, bool same, struct agent_envbuf *b)
{
	const struct agent_trace_conf *const t = &agent_trace_conf;
	const char *user_pre = NULL;
	size_t n = 0, i;

	for (i = 0; envp && envp[i]; i++) {
		if (!strncmp(envp[i], "LD_PRELOAD=", 11)) {
			user_pre = envp[i] + 11;
			continue;
		}
		if (!strncmp(envp[i], "PROBEKIT_", 9) && !user_setting(envp[i]))
			continue; /* (the library's settings go on as they are) */
		if (n >= PK_ENVBUF_VARS)
			return NULL;
		b->vec[n++] = envp[i];
	}
	if (user_pre && *user_pre) {
		if ((size_t)snprintf(b->preload, sizeof(b->preload), "LD_PRELOAD=%s:%s", user_pre,
				     t->agent) >= sizeof(b->preload) ||
		    (size_t)snprintf(b->saved, sizeof(b->saved), "%s=%s", PK_ENV_PRELOAD_SAVED,
				     user_pre) >= sizeof(b->saved))
			return NULL;
		b->vec[n++] = b->saved;
	} else {
		snprintf(b->preload, sizeof(b->preload), "LD_PRELOAD=%s", t->agent);
	}
	b->vec[n++] = b->preload;
	snprintf(b->trace, sizeof(b->trace), "%s=%s", PK_ENV_TRACE, t->base);
	b->vec[n++] = b->trace;
	if (t->funcs && (size_t)snprintf(b->funcs, sizeof(b->funcs), "%s=%s", PK_ENV_TRACE_FUNCS,
					 t->funcs) < sizeof(b->funcs))
		b->vec[n++] = b->funcs;
	if (t->notrace && (size_t)snprintf(b->notrace, sizeof(b->notrace), "%s=%s",
					   PK_ENV_TRACE_NOTRACE, t->notrace) < sizeof(b->notrace))
		b->vec[n++] = b->notrace;
	if (t->args) {
		if ((size_t)snprintf(b->args, sizeof(b->args), "%s=%s", PK_ENV_TRACE_ARGS,
				     t->args) >= sizeof(b->args))
			return NULL;
		b->vec[n++] = b->args;
	}
	if (t->auto_args) {
		snprintf(b->auto_args, sizeof(b->auto_args), "%s=1", PK_ENV_TRACE_AUTO_ARGS);
		b->vec[n++] = b->auto_args;
	}
	snprintf(b->children, sizeof(b->children), "%s=%d", PK_ENV_TRACE_CHILDREN, t->children);
	b->vec[n++] = b->children;
	snprintf(b->entry, sizeof(b->entry), "%s=%d", PK_ENV_TRACE_ENTRY_ONLY, !t->exits);
	b->vec[n++] = b->entry;
	snprintf(b->buf, sizeof(b->buf), "%s=%u", PK_ENV_TRACE_BUF, t->buf_events);
	b->vec[n++] = b->buf;
	snprintf(b->drop, sizeof(b->drop), "%s=%d", PK_ENV_TRACE_DROP, t->drop);
	b->vec[n++] = b->drop;
	snprintf(b->ring, sizeof(b->ring), "%s=%d", PK_ENV_TRACE_RING, t->ring);
	b->vec[n++] = b->ring;
	if (t->trigger && (size_t)snprintf(b->trigger, sizeof(b->trigger), "%s=%s",
					   PK_ENV_TRACE_TRIGGER, t->trigger) < sizeof(b->trigger))
		b->vec[n++] = b->trigger;
	if (t->command && (size_t)snprintf(b->command, sizeof(b->command), "%s=%s",
					   PK_ENV_TRACE_CMD, t->command) < sizeof(b->command))
		b->vec[n++] = b->command;
	if (t->reloc[0]) {
		snprintf(b->reloc, sizeof(b->reloc), "%s=%s", PK_ENV_TRACE_RELOC, t->reloc);
		b->vec[n++] = b->reloc;
	}
	if (t->int3) {
		snprintf(b->int3, sizeof(b->int3), "%s=1", PK_ENV_TRACE_INT3);
		b->vec[n++] = b->int3;
	}
	if (!t->libcall) {
		snprintf(b->libcall, sizeof(b->libcall), "%s=0", PK_ENV_TRACE_LIBCALL);
		b->vec[n++] = b->libcall;
	}
	if (t->max_size) {
		snprintf(b->max_size, sizeof(b->max_size), "%s=%llu", PK_ENV_TRACE_MAX_SIZE,
			 (unsigned long long)t->max_size);
		b->vec[n++] = b->max_size;
	}
	snprintf(b->pid, sizeof(b->pid), "%s=%d", PK_ENV_TRACE_PID, (int)agent_lineage.pid);
	b->vec[n++] = b->pid;
	snprintf(b->gen, sizeof(b->gen), "%s=%lu", PK_ENV_TRACE_GEN,
		 same ? agent_lineage.gen + 1 : 0);
	b->vec[n++] = b->gen;
	snprintf(b->session, sizeof(b->session), "%s=%016llx", PK_ENV_TRACE_SESSION,
		 (unsigned long long)t->session);
	b->vec[n++] = b->session;
	b->vec[n] = NULL;
	return b->vec;
}

bool agent_follows_children(void)
{
	return agent_lineage.follow && agent_trace_conf.children;
}

char *const *agent_child_env(char *const envp[], struct agent_envbuf *b)
{
	char *const *env;

	if (!agent_follows_children())
		return envp;
	env = agent_env_for_next(envp, false, b);
	return env ? env : envp;
}

/* ---- the constructor ---- */

/* PROBEKIT_LISTEN=1: the cooperative mode (agent.h, doc/design/attach.md A11). */
static bool listening(void)
{
	const char *v = getenv(PK_ENV_LISTEN);

	return v && !strcmp(v, "1");
}

/*
 * Loaded from "/proc/PID/fd/N" or "/proc/self/fd/N", as the command's
 * bootstrap does (src/attach/inject.c)?
 */
static bool loaded_by_fd(const char *name)
{
	size_t n;

	if (strncmp(name, "/proc/", 6))
		return false;
	n = !strncmp(name + 6, "self", 4) ? 4 : strspn(name + 6, "0123456789");
	return n && !strncmp(name + 6 + n, "/fd/", 4) && name[10 + n] &&
	       strspn(name + 10 + n, "0123456789") == strlen(name + 10 + n);
}

/*
 * Before main(): libc's sigaction() first (the library's own calls go
 * through our wrapper), the settings read before the environment is
 * cleaned, the interposers' real functions, then the mode asked for.  With
 * neither mode asked for, the command (if any) gets "ok" and PROG runs with
 * the wrappers idle.
 */
__attribute__((constructor(101))) static void agent_start(void)
{
	Dl_info di;

	pki_sigown_init(); /* its fork handler before any client's (base/sigown.c) */
	agent_signal_init();
	agent_bounce_init();
	/*
	 * Loaded into a running process by `probekit trace -p` (attach.c): the
	 * process's environment is not ours to read or edit, and nothing starts
	 * before the command's settings arrive on the channel.
	 */
	if (dladdr((void *)agent_start, &di) && di.dli_fname && loaded_by_fd(di.dli_fname)) {
		agent_attached = agent_injected = true;
		return;
	}
	read_cmd_config();
	read_watch_config();
	agent_trace_config(env_get);
	if (agent_trace_conf.on)
		agent_library_settings();
	agent_dl_config();
	/*
	 * Preloaded by the program's own environment to listen: that stays as
	 * it is.  Preloaded by a command (its descriptors, a mode): cleaned,
	 * and no listener.
	 */
	if (!listening() || cmd.ctl_fd >= 0 || agent_trace_conf.on || agent_watch_conf.spec[0])
		env_clean();
	agent_exec_init();
	agent_shell_init();
	if (agent_trace_start() || agent_watch_start())
		return; /* the mode answered the command */
	ctl_send(PK_CTL_OK "\n");
	if (listening() && cmd.ctl_fd < 0 && !agent_listen_start())
		agent_out_printf("probekit-agent: %s=1: cannot listen for attaches: %s\n",
				 PK_ENV_LISTEN, strerror(errno));
}
