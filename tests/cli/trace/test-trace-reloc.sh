#!/usr/bin/env bash
# probekit trace of programs built without patchable entries, through the
# library's relocated entries (PROBEKIT_RELOC=main: the main program's
# functions, doc/design/reloc-sites.md): Debian's stripped /usr/bin/ls and
# test_core.  The traced run must behave as the plain one (exit status,
# stdout), record events of the program's own functions, lose none, and
# see no exit without its entry.
#
# With --relocate-all the libraries are relocated too, libc included:
# libc_calls' own calls of two libc functions are counted exactly, in a
# fork child too, and a shell pipeline gives its plain output.
#
# usage: test-trace-reloc.sh PROBEKIT TEST_CORE LIBC_CALLS
set -uo pipefail
pk=$(realpath "$1") core=$(realpath "$2") lc=$(realpath "$3")
. "$(dirname "$(realpath "$0")")/lib.sh"
export PROBEKIT_RELOC=main

for prog in /usr/bin/ls "$core"; do
	label=$(basename "$prog")
	args=()
	[[ $prog == /usr/bin/ls ]] && args=(-la /usr/share/doc)
	[[ $prog == "$core" ]] && args=(--help)
	rm -f r.trace*
	vs_plain "$label" r.trace "$prog" "${args[@]}"
	check "$label: summary" "grep -q 'wrote .*r.trace: [0-9]* events, 1 thread(s), ended at exit' err"
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
check "--relocate: ls traced" "[[ $rc == 0 ]] && grep -q 'wrote .*r.trace: [0-9]* events, 1 thread(s), ended at exit' err"
rm -f r.trace*
run -o r.trace -- /usr/bin/ls /
check "by default: ls traced" "[[ $rc == 0 ]] && grep -q 'wrote .*r.trace: [0-9]* events, 1 thread(s), ended at exit' err"
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

# Every object: libc's functions traced, counted as the program counts them.
# Not under a sanitizer: its runtime, preloaded first, calls libc from inside
# the hooks and owns the stack the return trampoline reads (the sanitizer
# builds test the agent's code, the plain build this).
unset PROBEKIT_RELOC
if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then
	echo "trace_reloc: --relocate-all not run under a sanitizer"
	echo "trace_reloc: $pass passed, $fail failed"
	[[ $fail == 0 ]]
	exit
fi
libc_counts() { { counts "$1" rand_r; counts "$1" strverscmp; } | sort; }
"$lc" >plain.out 2>&1
rm -f a.trace*
run --relocate-all -o a.trace -- "$lc"
check "--relocate-all: rc $rc, stdout of the plain run" "[[ $rc == 0 ]] && cmp -s out plain.out"
libc_counts a.trace >got
want out parent >exp
check "--relocate-all: libc calls counted as the program does ($(tr '\n' ' ' <got))" "[[ -s exp ]] && cmp -s got exp"
# strlen is an IFUNC: the implementation chosen is named after it, or by
# its own name where libc's separate debug file is installed (libc6-dbg:
# __strlen_avx2...); libc's own calls add to the program's 500.
n=$({ counts a.trace strlen; counts a.trace __strlen_; } | awk '{n += $2} END {print n + 0}')
check "--relocate-all: the IFUNC's implementation traced ($n calls)" \
	"grep -qx 'ifunc strlen 500' out && (( $n >= 500 ))"
# The fork child's file (the posix_spawn child, /bin/true, has its own: the
# relocation setting goes on to the programs PROG starts).
child= spawned=
for f in a.trace.*; do
	"$pk" report "$f" >rep 2>&1
	head -1 rep | grep -q "$lc:" && child=$f
	head -1 rep | grep -q '/true:' && spawned=$f
done
check "--relocate-all: the posix_spawn child traced too (${spawned:-none})" "[[ -n '$spawned' ]]"
libc_counts "${child:-none}" >got
want out child >exp
check "--relocate-all: and in the fork child ($(tr '\n' ' ' <got))" "[[ -s exp ]] && cmp -s got exp"
# Lost: only the calls libc's thread teardown makes after the trace of the
# pthread_exit thread ended, counted as such (no buffer was full).
"$pk" report --threads a.trace >rep 2>&1
lost=$(sed -n 's/.* events, \([0-9]*\) lost, .*/\1/p' rep | head -1)
late=$(sed -n 's/.* \([0-9]*\) events after thread exit/\1/p' rep | head -1)
check "--relocate-all: nothing lost but after a thread's end (lost ${lost:-?}, after ${late:-0})" \
	"[[ -n '$lost' && '$lost' == '${late:-0}' ]] && ! grep -q 'buffers full' rep"
bash -c 'for i in 3 1 2; do echo $i; done | sort' >plain.out 2>&1
run --relocate-all -o b.trace -- bash -c 'for i in 3 1 2; do echo $i; done | sort'
check "--relocate-all: a pipeline of bash and sort (rc $rc)" "[[ $rc == 0 ]] && cmp -s out plain.out"
"$pk" report b.trace >rep 2>&1
check "--relocate-all: libc's functions in the report" "grep -q '\[libc.so.6\]' rep"

echo "trace_reloc: $pass passed, $fail failed"
[[ $fail == 0 ]]
