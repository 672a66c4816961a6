#!/usr/bin/env bash
# probekit trace against tests/cli/trace/throw_demo (C++): exceptions thrown
# through traced frames (plain, rethrown, nested in a destructor during the
# unwinding, std::rethrow_exception, 60 frames deep, on 3 threads),
# backtrace() and pthread_exit() from traced frames.  The program must behave exactly as
# untraced (its output includes its backtrace depth), the report's counts
# must be the program's own, and every entry must have its exit.
#
# usage: test-trace-cxx.sh PROBEKIT THROW_DEMO [THROW_DEMO_PLAIN [THROW_DEMO_STATIC]]
# (THROW_DEMO_PLAIN: the same without patchable entries, traced by
# relocation: the same checks on it.  THROW_DEMO_STATIC: with its C++
# runtime and unwinder linked in: attached, exit tracing refused.)
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2") plain=${3:+$(realpath "$3")} static=${4:+$(realpath "$4")}
. "$(dirname "$(realpath "$0")")/lib.sh"

"$demo" >plain.out 2>plain.err
plain_rc=$?
check "plain run: rc $plain_rc" "[[ $plain_rc == 0 ]]"
for i in 1 2 3; do
	run -o cxx.trace -- "$demo"
	check "throw: rc $rc (run $i)" "[[ $rc == 0 ]]"
	check "throw: stdout differs from a plain run (run $i)" "cmp -s out plain.out"
	check "throw: nothing lost (run $i)" "! grep -q lost err"
	counts cxx.trace cx_ >got
	want out >exp
	check "throw: report counts != the program's own (run $i)" "diff -u exp got"
	check "throw: unmatched entries/exits: $(footnote cxx.trace) (run $i)" \
		"[[ '$(footnote cxx.trace)' == '0 0 0' ]]"
done
# Durations: every cx_throw call that threw ended at its catch, so no call
# of it lasts longer than its caller's whole run.
check "throw: cx_throw's total time is within cx_middle's" \
	"$pk report --raw cxx.trace | awk 'NF > 1 && \$(NF-1) == \"cx_throw\" {a = \$2} NF > 1 && \$(NF-1) == \"cx_middle\" {b = \$2} END {exit !(a > 0 && a <= b)}'"

# --entry-only needs none of it, and must count the same.
run -o entry.trace --entry-only -- "$demo"
check "entry-only: rc $rc" "[[ $rc == 0 ]]"
counts entry.trace cx_ >got
want out >exp
check "entry-only: counts" "diff -u exp got"

# Nobody catches: the same death (std::terminate, SIGABRT) and message, and
# the trace holds the calls up to it.
vs_plain uncaught unc.trace "$demo" --uncaught
check "uncaught: rc $rc" "[[ $rc == 134 ]]"
check "uncaught: terminate message" "grep -q \"terminate called after throwing an instance of 'int'\" err"
check "uncaught: ended by signal 6" "$pk report unc.trace 2>/dev/null | grep -q 'ended by signal 6'"
check "uncaught: cx_deep frames recorded" "[[ \$(counts unc.trace cx_deep) == 'cx_deep 6' ]]"

# pthread_exit() 3 traced frames deep: glibc's forced unwinding must run
# their destructors (one releases a mutex) exactly as untraced.
vs_plain pthread_exit pexit.trace "$demo" --pthread-exit
check "pthread_exit: rc $rc" "[[ $rc == 0 ]]"
check "pthread_exit: destructors ran, mutex released" \
	"cmp -s out plain.out && grep -q 'mutex released: yes' out"

# pthread_cancel() of a thread waiting 3 traced frames deep: glibc unwinds it
# from a cancellation point, through libgcc_s's _Unwind_ForcedUnwind, which
# it calls through a pointer of its own; the destructors must run.
vs_plain cancel cancel.trace "$demo" --cancel
check "pthread_cancel: rc $rc" "[[ $rc == 0 ]]"
check "pthread_cancel: destructors ran, mutex released" \
	"cmp -s out plain.out && grep -q 'mutex released: yes' out && grep -q 'cancelled: yes' out"

# Built plainly (g++ -O2): relocated entries, the same behaviour and counts.
if [[ -n $plain ]]; then
	"$plain" >plain.out 2>plain.err
	for i in 1 2; do
		run -o rel.trace -- "$plain"
		check "relocated: rc $rc (run $i)" "[[ $rc == 0 ]]"
		check "relocated: stdout differs from a plain run (run $i)" "cmp -s out plain.out"
		check "relocated: traced by relocation (run $i)" "grep -q '[0-9]* relocated' err"
		counts rel.trace cx_ >got
		want out >exp
		check "relocated: report counts != the program's own (run $i)" "diff -u exp got"
		check "relocated: unmatched entries/exits: $(footnote rel.trace) (run $i)" \
			"[[ '$(footnote rel.trace)' == '0 0 0' ]]"
	done
	vs_plain "relocated uncaught" runc.trace "$plain" --uncaught
	check "relocated uncaught: rc $rc" "[[ $rc == 134 ]]"
	vs_plain "relocated pthread_exit" rpexit.trace "$plain" --pthread-exit
	check "relocated pthread_exit: destructors ran" "grep -q 'mutex released: yes' out"
	vs_plain "relocated pthread_cancel" rcancel.trace "$plain" --cancel
	check "relocated pthread_cancel: destructors ran" \
		"cmp -s out plain.out && grep -q 'mutex released: yes' out"
fi

# Attached (trace -p), the unwinder's entry points are hooked instead of
# interposed: the program throws through traced frames on two threads
# (every pattern, pthread_exit() threads, backtrace()) while attached,
# detached and attached again, checking each result itself; every exit
# has its entry; after the detach the text equals the files but for the
# unwinder's hooked entries, which stay (doc/design/attach.md A9h).
#
# Where the unwinder's library was loaded decides whether its entries'
# jump relays have a place (their offsets are the functions' own bytes,
# doc/design/reloc-sites.md RS2e): where one is taken, exit tracing is
# refused attached, saying so, before the text is touched.  That refusal is
# checked, and the program started again, at another address.
textcheck=$(dirname "$(realpath "$0")")/../attach/text-equal.py
start_forever() {
	rm -f stop
	: >fout
	"$demo" --forever stop >fout 2>&1 &
	fpid=$!
	for ((k = 0; k < 500; k++)); do grep -q '^ready' fout && break; sleep 0.01; done
}
attach_once() {
	"$pk" trace -p "$fpid" -f 'cx_*' --duration 0.3 -o attach.trace 2>err
	rc=$?
}
start_forever
if ! "$pk" inject --check -p "$fpid" >err 2>&1 && grep -q 'Yama\|CAP_SYS_PTRACE\|seccomp' err; then
	echo "note: the attached cases not run: $(cat err)"
	touch stop
	wait "$fpid"
	echo "trace_cxx: $pass passed, $fail failed"
	[[ $fail == 0 ]]
	exit
fi
for ((try = 1; try < 8; try++)); do
	attach_once
	[[ $rc == 125 ]] && grep -q "unwinder: its entries would need breakpoints (their jump's place is taken)" err ||
		break
	check "relays without a place ($try): refused, the text untouched" \
		"python3 '$textcheck' $fpid >tx || { sed 's/^/    /' tx; false; }"
	touch stop
	wait "$fpid"
	rc=$?
	check "relays without a place ($try): the program's own checks (rc $rc)" \
		"[[ $rc == 0 ]] && ! grep -q 'wrong [1-9]' fout"
	start_forever
done
for i in 1 2 3; do
	((i == 1)) || attach_once
	check "attached $i: rc $rc, the unwinder stays hooked" \
		"[[ $rc == 0 ]] && grep -q 'unwinder.s entry points stay hooked' err"
	check "attached $i: cx_throw timed" \
		"$pk report --raw attach.trace 2>/dev/null | awk 'NF > 1 && \$(NF-1) == \"cx_throw\" && \$2 > 0 {ok = 1} END {exit !ok}'"
	check "attached $i: cx_ptr and cx_deep recorded" \
		"$pk report attach.trace 2>/dev/null | grep -q ' cx_ptr ' && $pk report attach.trace 2>/dev/null | grep -q ' cx_deep '"
	check "attached $i: no exit without its entry: $(footnote attach.trace)" \
		"[[ '$(footnote attach.trace | cut -d' ' -f1-2)' == '0 0' ]]"
	check "attached $i: text equal to the files but the unwinder's entries" \
		"python3 '$textcheck' $fpid --unwinder-hooked >tx && grep -qx 'unwinder entries hooked: 6' tx"
done
# top -p times in the process: a frame a throw removes counts too (cx_deep
# never returns otherwise), and its time is its caller's child time.
"$pk" top -p "$fpid" -f 'cx_*' --batch --count 1 --interval 0.5 -r 0 >top.out 2>err
rc=$?
check "top -p: rc $rc, cx_deep counted" \
	"[[ $rc == 0 ]] && awk '\$NF == \"cx_deep\" && \$1 > 0 {ok = 1} END {exit !ok}' top.out"
check "top -p: cx_catch's self time leaves out its callees, the unwound ones too" \
	"awk '\$NF == \"cx_catch\" {sub(/s\\/s/, \"\", \$2); sub(/s\\/s/, \"\", \$3); ok = \$3 < \$2 / 2} END {exit !ok}' top.out"
"$pk" trace -p "$fpid" -f 'cx_*' --entry-only --duration 0.3 -o attach.trace 2>err
rc=$?
check "attached --entry-only: rc $rc, cx_catch recorded" \
	"[[ $rc == 0 ]] && $pk report attach.trace 2>/dev/null | grep -q ' cx_catch '"
sleep 0.3 # unattached, with the frames hijacked before still on the stacks
touch stop
wait "$fpid"
rc=$?
check "attached: the program's own checks (rc $rc): $(grep '^rounds' fout | tr '\n' ' ')" \
	"[[ $rc == 0 ]] && [[ \$(grep -c '^rounds [1-9][0-9]* wrong 0 bt-wrong 0 exits [0-9]* unreleased 0\$' fout) == 2 ]] && grep -q '^rounds.* exits [1-9]' fout"

# Its unwinder linked in statically: out of reach attached, so exit tracing
# is refused before anything is touched, naming the cause; --entry-only
# traces it, and the program throws on unharmed.
if [[ -n $static ]]; then
	rm -f stop
	: >fout
	"$static" --forever stop >fout 2>&1 &
	fpid=$!
	for ((k = 0; k < 500; k++)); do grep -q '^ready' fout && break; sleep 0.01; done
	"$pk" trace -p "$fpid" -f 'cx_*' --duration 0.3 -o static.trace 2>err
	rc=$?
	check "static unwinder: exits refused ($rc), saying why" \
		"[[ $rc == 125 ]] && grep -q 'linked in statically' err && grep -q -- '--entry-only' err"
	check "static unwinder: the text untouched" "python3 '$textcheck' $fpid >/dev/null"
	"$pk" trace -p "$fpid" -f 'cx_*' --entry-only --duration 0.3 -o static.trace 2>err
	rc=$?
	check "static unwinder, --entry-only: rc $rc, cx_catch recorded" \
		"[[ $rc == 0 ]] && $pk report static.trace 2>/dev/null | grep -q ' cx_catch '"
	touch stop
	wait "$fpid"
	rc=$?
	check "static unwinder: the program's own checks (rc $rc)" \
		"[[ $rc == 0 ]] && [[ \$(grep -c '^rounds [1-9][0-9]* wrong 0 bt-wrong 0 exits [0-9]* unreleased 0\$' fout) == 2 ]]"
fi

# Through a listening agent the program preloaded, the unwinder's entry
# points are the agent's: exits are traced, durations and all.
agent=$(dirname "$pk")/../agent/libprobekit-agent.so
rm -f stop
: >fout
LD_PRELOAD=${PKT_SAN_PRELOAD:+$PKT_SAN_PRELOAD:}$agent PROBEKIT_LISTEN=1 "$demo" --forever stop >fout 2>&1 &
fpid=$!
for ((k = 0; k < 500; k++)); do
	grep -q '^ready' fout && grep -q probekit-listen /proc/$fpid/task/*/comm 2>/dev/null && break
	sleep 0.01
done
"$pk" trace -p "$fpid" -f 'cx_*' --duration 0.3 -o listen.trace 2>err
rc=$?
check "listening agent: rc $rc, exits traced" \
	"[[ $rc == 0 ]] && grep -q 'through its listening agent' err && $pk report --raw listen.trace 2>/dev/null | awk 'NF > 1 && \$(NF-1) == \"cx_throw\" && \$2 > 0 {ok = 1} END {exit !ok}'"
touch stop
wait "$fpid"
rc=$?
check "listening agent: the program's own checks (rc $rc)" \
	"[[ $rc == 0 ]] && [[ \$(grep -c '^rounds [1-9][0-9]* wrong 0 bt-wrong 0 exits [0-9]* unreleased 0\$' fout) == 2 ]]"

echo "trace_cxx: $pass passed, $fail failed"
[[ $fail == 0 ]]
