#!/usr/bin/env bash
# A program's own SIGSEGV beside the agent's SIGSEGV owner
# (doc/design/signals.md), under probekit watch --mode page: the page
# watchpoint on `watched` claims the faults on its page while the program
# installs its handler after start, blocks every signal, writes `watched`
# (claimed, reported) and reads back its own handler and mask; its own
# fault then reaches its handler with si_addr and si_code, or, still
# blocked, kills it by SIGSEGV as the kernel would (tests/cli/trace/segv_prog.c).
#
# usage: test-trace-segv.sh PROBEKIT SEGV_PROG
set -uo pipefail
pk=$(realpath "$1") prog=$(realpath "$2")
. "$(dirname "$(realpath "$0")")/lib.sh"

ulimit -c 0
watch() {
	"$pk" watch --mode page -t rw watched "$@" >out 2>err
	rc=$?
}
hit='^ +[0-9.]+ tid [0-9]+ write watched\+10/1: 0 -> 1 at main\+0x[0-9a-f]+$'

watch -- "$prog" own
check "own: rc $rc" "[[ $rc == 0 ]]"
if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then # ASan's runtime installed its SIGSEGV handler first
	check "own: its previous action read as ASan's" "grep -q '^previous: ' out && ! grep -qx 'previous: SIG_DFL' out"
else
	check "own: its previous action read as SIG_DFL" "grep -qx 'previous: SIG_DFL' out"
fi
check "own: the watched access claimed" "grep -qx 'claimed: 1' out"
check "own: the watched access reported" "grep -Eq '$hit' err"
check "own: its handler saw its fault" "grep -q '^handler: si_addr and si_code' out"

watch -- "$prog" blocked
check "blocked: rc $rc (SIGSEGV, as without probekit)" "[[ $rc == 139 ]]"
check "blocked: the watched access claimed" "grep -qx 'claimed: 1' out"
check "blocked: the report says how it ended" "grep -q 'killed by signal 11' err"

echo "$pass passed, $fail failed"
((fail == 0))
