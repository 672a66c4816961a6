// SPDX-License-Identifier: MIT
/*
 * A hook with an exit callback (probekit/fprobe.h): every call of
 * parse_number() is seen at its entry, with its argument, and at its
 * return, with its result, while the program runs unchanged.  The
 * callbacks only record; the program prints once the hook is gone.  Built
 * with patchable entries, each function has a site the library hooks
 * (probekit/sites.h).
 *
 *   cc -fpatchable-function-entry=5 hook_exit.c \
 *      $(pkg-config --cflags --libs probekit) -o hook_exit
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <probekit/fprobe.h>

__attribute__((noinline)) int parse_number(const char *s)
{
	return atoi(s);
}

static struct {
	const char *arg;
	long ret;
} seen[8];
static int nseen;

static int on_entry(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		    struct pk_regs *regs, void *data)
{
	(void)fp, (void)ip, (void)parent_ip;
	memcpy(data, &regs->di, sizeof(regs->di)); /* the argument, for the exit */
	return 0;				   /* 0: run the exit callback of this call */
}

static void on_exit_(struct pk_fprobe *fp, unsigned long ip, unsigned long parent_ip,
		     struct pk_ret *ret, void *data)
{
	(void)fp, (void)ip, (void)parent_ip;
	if (nseen < 8) {
		memcpy(&seen[nseen].arg, data, sizeof(seen[nseen].arg));
		seen[nseen++].ret = (int)ret->ax;
	}
}

int main(void)
{
	static const char *const globs[] = {"parse_number"};
	PK_OPTS(pk_fprobe, fp, .entry = on_entry, .exit = on_exit_,
		.data_size = sizeof(unsigned long),
		.filter = PK_OPTS_INIT(pk_ops_filter, .globs = globs, .nglobs = 1));
	int err, sum = 0;

	pk_set_print(pk_print_stderr); /* the library's reasons, when it refuses */
	err = pk_fprobe_register(&fp);

	if (err) {
		fprintf(stderr, "pk_fprobe_register: %s\n", strerror(-err));
		return 1;
	}
	sum += parse_number("42");
	sum += parse_number("-7");
	pk_fprobe_unregister(&fp); /* no callback runs once it returns */
	sum += parse_number("1000");
	for (int i = 0; i < nseen; i++)
		printf("parse_number(\"%s\") = %ld\n", seen[i].arg, seen[i].ret);
	printf("sum %d, %d call(s) seen\n", sum, nseen);
	return !(nseen == 2 && seen[0].ret == 42 && seen[1].ret == -7 && sum == 1035);
}
