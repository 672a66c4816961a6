// SPDX-License-Identifier: MIT
/*
 * A program outside the tree, built against an installed probekit through
 * pkg-config: proves the installed headers, libraries and .pc file work.
 */
#include <stdio.h>
#include <string.h>

#include <probekit/probekit.h>

int main(void)
{
	if (strncmp(pk_version(), "0.", 2)) {
		fprintf(stderr, "unexpected version %s\n", pk_version());
		return 1;
	}
	pk_set_print(pk_print_stderr);
	printf("consumer: probekit %s\n", pk_version());
	return 0;
}
