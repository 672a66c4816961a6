// SPDX-License-Identifier: MIT
/*
 * Where the commands write: an output file opened as the trace file is
 * (src/trace/session.c, file_create: no symbolic link followed and nobody
 * else's file overwritten in a directory others can write to), and the
 * indentation of the call-tree printers (replay, graph), capped so that
 * their output stays linear in the depth.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "sym/demangle.h"

/* Is @path's directory one that only we (or root) can write to? */
static bool dir_private(const char *path)
{
	char dir[PATH_MAX], *slash;
	struct stat st;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash)
		slash[slash == dir] = '\0'; /* "/x" -> "/" */
	else
		snprintf(dir, sizeof(dir), ".");
	return !stat(dir, &st) && !(st.st_mode & (S_IWGRP | S_IWOTH)) &&
	       (st.st_uid == geteuid() || st.st_uid == 0);
}

int cli_output_open(const char *path, unsigned mode)
{
	struct stat st;
	int fd;

	if (dir_private(path)) {
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
		return fd < 0 ? cli_error("%s: %s", path, strerror(errno)), -1 : fd;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
	if (fd >= 0 || errno != EEXIST)
		return fd < 0 ? cli_error("%s: %s", path, strerror(errno)), -1 : fd;
	/* O_NONBLOCK: a planted FIFO must not block us here (refused below). */
	fd = open(path, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 && errno == ELOOP)
		return cli_error("%s: a symbolic link in a directory other users can write to: "
				 "not followed, refusing to write there",
				 path),
		       -1;
	if (fd < 0)
		return cli_error("%s: %s", path, strerror(errno)), -1;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || st.st_nlink != 1) {
		close(fd);
		return cli_error(
			   "%s: exists in a directory other users can write to and is not a "
			   "regular file of ours with a single link: refusing to overwrite it",
			   path),
		       -1;
	}
	if (ftruncate(fd, 0) || fcntl(fd, F_SETFL, 0)) {
		cli_error("%s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

size_t cli_indent(size_t level, unsigned long long shown, char *mark, size_t n)
{
	if (level <= CLI_INDENT_MAX) {
		mark[0] = '\0';
		return 2 * level;
	}
	snprintf(mark, n, "[%llu] ", shown);
	return 2 * CLI_INDENT_MAX;
}

char *cli_join_lines(char **v, int n)
{
	size_t len = 1;
	char *s, *p;

	if (n <= 0)
		return NULL;
	for (int i = 0; i < n; i++)
		len += strlen(v[i]) + 1;
	s = p = malloc(len);
	if (!s)
		return NULL;
	for (int i = 0; i < n; i++)
		p = stpcpy(p + !!i, v[i]), *p = '\n';
	*p = 0;
	return s;
}

int cli_demangle = PKI_DEMANGLE_SIMPLE;

bool cli_demangle_opt(int c, const char *arg)
{
	enum pki_demangle_style style = PKI_DEMANGLE_NO;

	if (c == CLI_O_DEMANGLE && pki_demangle_style_parse(arg, &style))
		return cli_usage_error("--demangle: no, simple or full, not '%s'", arg), false;
	cli_demangle = style;
	return true;
}

char *cli_demangled(const char *name)
{
	return pki_demangle(name, (enum pki_demangle_style)cli_demangle);
}

/*
 * A command's glob arrays live as long as the command: chained from here so
 * that a leak checker sees them reachable whichever way the command returns.
 */
struct globs_block {
	struct globs_block *next;
	char *v[];
};
static struct globs_block *globs_blocks;

bool cli_globs_add(struct cli_globs *g, const char *cmd, int c, char *glob, int argc)
{
	if (!*glob || strchr(glob, '\n'))
		return cli_usage_error("%s: -%c needs a glob (one line)", cmd, c), false;
	if (!g->v) {
		struct globs_block *b = calloc(1, sizeof(*b) + (size_t)argc * sizeof(b->v[0]));

		if (!b)
			return cli_error("%s: out of memory", cmd), false;
		b->next = globs_blocks;
		globs_blocks = b;
		g->v = b->v;
	}
	g->v[g->n++] = glob;
	return true;
}

bool cli_globs_any(const struct cli_globs *g, const char *name)
{
	for (int i = 0; i < g->n; i++)
		if (pki_glob_match(g->v[i], name))
			return true;
	return false;
}

/* Shell-quoting one word (cli_quote_args): where it needs quotes, and which. */
static bool word_plain(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!strchr("_@%+=:,./-", *s) && !(*s >= 'a' && *s <= 'z') &&
		    !(*s >= 'A' && *s <= 'Z') && !(*s >= '0' && *s <= '9'))
			return false;
	return true;
}

static bool word_has_control(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return true;
	return false;
}

/* snprintf at *@len of @buf (@n bytes), *@len counting what did not fit too. */
__attribute__((format(printf, 4, 5))) static void put(char *buf, size_t n, size_t *len,
						      const char *fmt, ...)
{
	size_t at = *len < n ? *len : n;
	va_list ap;

	va_start(ap, fmt);
	*len += (size_t)vsnprintf(buf + at, n - at, fmt, ap);
	va_end(ap);
}

/* @s quoted for a shell, after @len bytes of @buf (n bytes): the new length, may pass n. */
static size_t word_put(char *buf, size_t n, size_t len, const char *s)
{
	if (word_plain(s)) {
		put(buf, n, &len, "%s", s);
		return len;
	}
	if (!word_has_control(s)) { /* '...', a quote as '\'' */
		put(buf, n, &len, "'");
		for (; *s; s++)
			if (*s == '\'')
				put(buf, n, &len, "'\\''");
			else
				put(buf, n, &len, "%c", *s);
		put(buf, n, &len, "'");
		return len;
	}
	put(buf, n, &len, "$'"); /* bash's form, for newlines and other control characters */
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '\n' || c == '\t')
			put(buf, n, &len, "\\%c", c == '\n' ? 'n' : 't');
		else if (c < 0x20 || c == 0x7f)
			put(buf, n, &len, "\\x%02x", c);
		else if (c == '\'' || c == '\\')
			put(buf, n, &len, "\\%c", c);
		else
			put(buf, n, &len, "%c", c);
	}
	put(buf, n, &len, "'");
	return len;
}

const char *cli_quote_args(char *buf, size_t n, const char *const *v, size_t nv)
{
	size_t len = 0, last = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < nv; i++) {
		last = len;
		if (i)
			len += (size_t)snprintf(buf + len, n - len, " ");
		if (len < n)
			len = word_put(buf, n, len, v[i]);
		if (len >= n) { /* whole words only, then "..." */
			snprintf(buf + last, n - last, "%s...", last ? " " : "");
			break;
		}
	}
	return buf;
}
