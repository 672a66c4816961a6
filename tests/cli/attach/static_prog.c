// SPDX-License-Identifier: MIT
/* A statically linked program, for the refusal of A1 (test-attach.sh): sleeps until killed. */
#include <unistd.h>

int main(void)
{
	for (;;)
		pause();
}
