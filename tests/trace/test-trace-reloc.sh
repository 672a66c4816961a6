#!/usr/bin/env bash
# probekit trace of programs built without patchable entries, through the
# library's relocated entries (PROBEKIT_RELOC=main: the main program's
# functions, doc/design/reloc-sites.md): Debian's stripped /usr/bin/ls and
# test_core.  The traced run must behave as the plain one (exit status,
# stdout), record events of the program's own functions, lose none, and
# see no exit without its entry.
#
# usage: test-trace-reloc.sh PROBEKIT TEST_CORE
set -uo pipefail
pk=$(realpath "$1") core=$(realpath "$2")
. "$(dirname "$(realpath "$0")")/lib.sh"
export PROBEKIT_RELOC=main

for prog in /usr/bin/ls "$core"; do
	label=$(basename "$prog")
	args=()
	[[ $prog == /usr/bin/ls ]] && args=(-la /usr/share/doc)
	[[ $prog == "$core" ]] && args=(--help)
	rm -f r.trace*
	vs_plain "$label" r.trace "$prog" "${args[@]}"
	check "$label: summary" "grep -q 'wrote .*r.trace: [0-9]* events, 1 thread(s), ended by exit' err"
	"$pk" report r.trace >rep 2>&1
	check "$label: report" "[[ \$? == 0 ]]"
	events=$(sed -n 's/.* \([0-9]*\) events, 0 lost.*/\1/p' rep | head -1)
	check "$label: events recorded, none lost ($events)" "[[ -n '$events' && $events -gt 100 ]]"
	check "$label: no exit without its entry" "! grep -q '[1-9][0-9]* exits without an entry' rep"
	check "$label: the program's own functions" "grep -q '\[$label\]' rep"
done
# The command's option does the same, and is the default for a program
# without a patchable entry; --no-relocate refuses the plain ls, with a hint.
rm -f r.trace*
unset PROBEKIT_RELOC
run --relocate -o r.trace -- /usr/bin/ls /
check "--relocate: ls traced" "[[ $rc == 0 ]] && grep -q 'wrote .*r.trace: [0-9]* events, 1 thread(s), ended by exit' err"
rm -f r.trace*
run -o r.trace -- /usr/bin/ls /
check "by default: ls traced" "[[ $rc == 0 ]] && grep -q 'wrote .*r.trace: [0-9]* events, 1 thread(s), ended by exit' err"
# The refusals are counted and named, once, at the start.
check "ls: its refusals said" "grep -q \"^probekit: PROG's functions without a patchable entry: [0-9]* relocated, [0-9]* refused (.*indirect_jmp [0-9]*\" err"
run --no-relocate -o r.trace -- /usr/bin/ls /
check "--no-relocate: refused with the hint" "[[ $rc == 125 ]] && grep -q 'leave out --no-relocate' err"
# test_core has no patchable entry either: relocated by default too.
rm -f r.trace*
run -o r.trace -- "$core" --help
# (the report into a file: grep -q ending the pipe early fails it under pipefail)
"$pk" report r.trace >rep 2>&1
check "test_core: its own functions by default" "[[ $rc == 0 ]] && grep -q '\[test_core\]' rep"
export PROBEKIT_RELOC=main
# ls is stripped: its functions are named from .eh_frame.
PROBEKIT_RELOC=main "$pk" trace -o l.trace -- /usr/bin/ls / >/dev/null 2>&1
"$pk" report l.trace >rep 2>&1
check "ls: unnamed functions as sub_<hex>" "grep -q ' sub_[0-9a-f]* \[ls\]' rep"

echo "trace_reloc: $pass passed, $fail failed"
[[ $fail == 0 ]]
