#!/usr/bin/env bash
# The ways a process ends besides returning from main, traced: quick_exit()
# (glibc's own _exit after the at_quick_exit handlers) keeps every event;
# a main() that leaves with pthread_exit() or syscall(SYS_exit) while other
# threads finish ends when they do, with the status and output of a plain
# run, under every trace mode and under probekit watch (the agent's own
# threads must not keep the process alive).  exit_demo counts its calls of
# demo_leaf, the only function traced (-f).
#
# SELFHOOK links libprobekit and reads its own sites with it: traced, it
# runs as plainly (the agent's copy of the library shares no state with
# the program's) and its calls are in the trace.
#
# usage: test-trace-exit.sh PROBEKIT EXIT_DEMO SELFHOOK
set -uo pipefail
pk=$(realpath "$1") prog=$(realpath "$2") selfhook=$(realpath "$3")
. "$(dirname "$(realpath "$0")")/lib.sh"

# trun CMD ARGS...: probekit CMD ARGS, bounded (a process that never ends
# fails, 124 or 137, instead of hanging the suite); out, err, rc.
trun() {
	timeout -k 5 60 "$pk" "$@" >out 2>err
	rc=$?
}
# ended FILE: how the command says FILE ended.
ended() { sed -n "s#^probekit: wrote .*/$1: .* ended \(at\|by\) \(.*\)#\2#p" err; }
# plain ARGS: exit_demo ARGS run without probekit: plain.out, plain_rc.
plain() {
	timeout -k 5 60 "$prog" "$@" >plain.out 2>plain.err
	plain_rc=$?
}
# same LABEL: status and stdout of the traced run are the plain run's.
same() {
	check "$1: rc $rc, plain $plain_rc (124/137: never ended)" "[[ $rc == $plain_rc ]]"
	check "$1: stdout differs from a plain run" "cmp -s out plain.out"
}

# 1. quick_exit(): every event, the handler's included, and the END record.
plain quick 1000
trun trace -o quick.trace -f demo_leaf -- "$prog" quick 1000
same quick
check "quick: ended by '$(ended quick.trace)'" "[[ '$(ended quick.trace)' == exit ]]"
counts quick.trace >got
want out >exp
check "quick: report counts" "[[ -s exp ]] && diff -u exp got"

# 2. main leaves with pthread_exit() or syscall(SYS_exit) while 3 threads
#    finish (each waits until main is gone): the process ends when they do.
for mode in pexit sysexit; do
	plain $mode 3 1000
	for o in "" "--ring 64K" "--entry-only"; do
		label="$mode ${o:-default}"
		# shellcheck disable=SC2086 # two words
		trun trace $o -o $mode.trace -f demo_leaf -- "$prog" $mode 3 1000
		same "$label"
		check "$label: ended by '$(ended $mode.trace)'" "[[ '$(ended $mode.trace)' == exit ]]"
		counts $mode.trace >got
		want out >exp
		check "$label: report counts" "[[ -s exp ]] && diff -u exp got"
	done
	trun watch total -- "$prog" $mode 3 1000
	if [[ $rc != 124 && $rc != 137 ]] && grep -q 'accepts hardware breakpoints but does not deliver them' err; then
		echo "SKIP: watch $mode: hardware breakpoints are not delivered here"
	else
		same "watch $mode"
		check "watch $mode: the command saw it end" "grep -q 'exited with status 0' err"
	fi
done

# 3. main alone leaves with syscall(SYS_exit, 7): status 7, as plain; and
#    with pthread_exit(): exit(0), stdout flushed.
plain sysexit 0 100
trun trace -o alone.trace -f demo_leaf -- "$prog" sysexit 0 100
same "sysexit alone"
check "sysexit alone: ended by '$(ended alone.trace)'" "[[ '$(ended alone.trace)' == exit ]]"
plain pexit0 100
trun trace -o pexit0.trace -f demo_leaf -- "$prog" pexit0 100
same "pexit0"
counts pexit0.trace >got
want out >exp
check "pexit0: report counts" "[[ -s exp ]] && diff -u exp got"

# 3b. Calls open at the end.  demo_quit() calls exit(0), whose atexit
#     handler sleeps 50 ms: it runs until the END record, not 0 ns.  The
#     same file cut before its END (as a kill leaves it): when the trace
#     ended is not known, and demo_quit has '-', not a made-up time.
# row FILE FN: "calls total self avg min max" of FN in report --raw FILE.
row() { "$pk" report --raw "$1" 2>/dev/null | awk -v f="$2" '$(NF-1) == f || $NF == f {print $1, $2, $3, $4, $5, $6}'; }
plain inexit 10
trun trace -o inexit.trace -f demo_leaf -f demo_quit -- "$prog" inexit 10
same "inexit"
read -r c t s a mn mx <<<"$(row inexit.trace demo_quit)"
check "inexit: demo_quit runs until END ($c $t $s $a $mn $mx)" "[[ '$c' == 1 && '$t' -ge 50000000 && '$t' == '$s' && '$t' == '$mx' ]]"
"$pk" replay inexit.trace >rep 2>&1
check "inexit: replay gives demo_quit its time to END" "grep -Eq '^ +[0-9.]+ ms .*demo_quit\(\); \(still running at the end\)' rep"
python3 - inexit.trace cut.trace <<'PY'
import struct, sys
d = open(sys.argv[1], 'rb').read()
off = 16
while struct.unpack_from('<I', d, off)[0] != 7:  # up to END, not included
    off += 16 + (struct.unpack_from('<I', d, off + 4)[0] + 7) // 8 * 8
open(sys.argv[2], 'wb').write(d[:off])
PY
check "cut: demo_quit has no time ($(row cut.trace demo_quit))" "[[ '$(row cut.trace demo_quit)' == '1 - - - - -' ]]"
check "cut: the footnote counts it" "$pk report cut.trace 2>/dev/null | grep -q '^# 1 of the open calls have no known end'"
"$pk" replay cut.trace >rep 2>&1
check "cut: replay says demo_quit's end is unknown" "grep -Eq '^ +- .*demo_quit\(\); \(still running at its last event: end unknown\)' rep"

# 4. The agent's own calls are never events: under --relocate-all, libc's
#    write and close (which the agent calls to answer the command, and its
#    threads to read /proc) are traced, yet the first event is the
#    program's and every event is of the program's one thread.
trun trace --relocate-all -f write -f close -f demo_leaf -o self.trace -- "$prog" pexit0 3
check "relocate-all: rc $rc" "[[ $rc == 0 ]]"
"$pk" replay self.trace >rep 2>&1
first=$(awk '/\|/ {print $NF; exit}' rep)
check "relocate-all: first event '$first', not the agent's" "[[ '$first' == 'demo_leaf();' ]]"
check "relocate-all: one thread" "grep -q 'self.trace: [0-9]* events, 1 thread(s)' err"

# 5. A program that uses libprobekit itself.
"$selfhook" >plain.out 2>plain.err
plain_rc=$?
trun trace -o selfhook.trace -f demo_leaf -- "$selfhook"
same selfhook
check "selfhook: it saw its sites" "grep -qx 'sites demo_ found' out"
counts selfhook.trace >got
want out >exp
check "selfhook: report counts" "[[ -s exp ]] && diff -u exp got"

echo "trace_exit: $pass passed, $fail failed"
[[ $fail == 0 ]]
