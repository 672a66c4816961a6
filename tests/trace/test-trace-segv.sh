#!/usr/bin/env bash
# A program's own SIGSEGV under probekit trace, with the agent's SIGSEGV
# owner claiming the faults on one page (its test client,
# PROBEKIT_TEST_SEGV_PAGE; doc/design/signals.md): the program installs
# its handler after start, blocks every signal, touches the page (claimed)
# and reads back its own handler and mask; its own fault then reaches its
# handler with si_addr and si_code, or, still blocked, kills it by SIGSEGV
# as the kernel would (tests/trace/segv_prog.c).
#
# usage: test-trace-segv.sh PROBEKIT SEGV_PROG
set -uo pipefail
pk=$(realpath "$1") prog=$(realpath "$2")
. "$(dirname "$(realpath "$0")")/lib.sh"

page=0x5e5e00000000
export PROBEKIT_TEST_SEGV_PAGE=$page
ulimit -c 0

run -o own.trace -- "$prog" own "$page"
check "own: rc $rc" "[[ $rc == 0 ]]"
check "own: its previous action read as SIG_DFL" "grep -qx 'previous: SIG_DFL' out"
check "own: the watched access claimed" "grep -qx 'claimed: 1' out"
check "own: its handler saw its fault" "grep -q '^handler: si_addr and si_code' out"

run -o blocked.trace -- "$prog" blocked "$page"
check "blocked: rc $rc (SIGSEGV, as without probekit)" "[[ $rc == 139 ]]"
check "blocked: the watched access claimed" "grep -qx 'claimed: 1' out"
check "blocked: the trace ended by the signal" "grep -q 'ended by signal' err"

echo "$pass passed, $fail failed"
((fail == 0))
