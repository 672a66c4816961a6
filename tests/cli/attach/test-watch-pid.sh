#!/usr/bin/env bash
# probekit watch -p PID: a watchpoint on every thread of a running program
# (tests/cli/attach/busy.c), reported while attached, removed at the detach: in
# page mode on every machine, and with a debug register where the machine
# delivers its hits.  Each hit of `naps` (the sleeper's counter) is its next value;
# threads created after the attach are watched too (`spawned`); --count
# detaches by itself; -o writes the report to a file; a second watch reuses
# the agent; refusals (an unknown symbol, hits not delivered) leave the
# process untouched.  After each detach the program has its own SIGTRAP
# handler back, its text equals its files, its threads and descriptors are
# the ones it had (plus the agent's memfd), and its work was unharmed.
#
# usage: test-watch-pid.sh PROBEKIT BUSY TEXT_EQUAL HWBP_DELIVERED
set -uo pipefail
. "$(dirname "$(realpath "$0")")/lib.sh"
pk=$(realpath "$1") busy=$(realpath "$2") texteq=$(realpath "$3") hwbp=$(realpath "$4")
scratch
unset PROBEKIT_HWBP_UNDELIVERED

skip_unless_attachable

hit_naps='^ +[0-9]+\.[0-9]{6} tid [0-9]+ write naps: '

# consecutive FILE: every naps hit in FILE is "N -> N+1", and there are some.
# The first hit's old value is the one read as the watch went on: a write in
# between (the program runs) makes it N -> N+k.
consecutive() {
	grep -E "$hit_naps" "$1" | sed -E 's/.*write naps: ([0-9]+)( \([^)]*\))? -> ([0-9]+).*/\1 \3/' |
		awk '{ n++; if ($2 != $1 + 1 && !(n == 1 && $2 > $1)) bad++ } END { exit !(n > 0 && !bad) }'
}

# sigtrap_caught: busy's own SIGTRAP handler is the process's action (SigCgt bit 5).
sigtrap_caught() {
	local cgt
	cgt=$(awk '/^SigCgt:/ {print $2}' "/proc/$bpid/status")
	(((0x$cgt >> 4) & 1))
}

# Refusals first: they hold on every machine.  An unknown symbol is refused,
# naming it, and leaves the process as it was.
start
"$pk" watch -p "$bpid" no_such_variable 2>cmd
rc=$?
check "unknown symbol: refused ($rc), named" "[[ $rc == 125 ]] && grep -q \"unknown symbol 'no_such_variable'\" cmd"
check "unknown symbol: SIGTRAP still the program's" sigtrap_caught
after_detach "unknown symbol"

# Hits the hardware would not deliver (the library's test switch, read in
# the process) are refused with the cause under --mode hw, never reported as
# "0 hit(s)".
finish "unknown symbol"
start "$busy" 0 env PROBEKIT_HWBP_UNDELIVERED=1
"$pk" watch -p "$bpid" --mode hw naps 2>cmd
rc=$?
check "undelivered: refused ($rc) with the cause" \
	"[[ $rc == 125 ]] && grep -q 'does not deliver them' cmd && ! grep -q 'hit(s) printed' cmd"
check "undelivered: SIGTRAP still the program's" sigtrap_caught
after_detach "undelivered"
finish "undelivered"

# The ring path attached, on every machine with its test switch (page
# faults sampled instead of the breakpoint: doc/design/watch-ring.md WR8):
# the path said, the summary back, and the detach leaves no descriptor or
# thread of it.
start "$busy" 0 env PROBEKIT_RING_FAULTS=64
"$pk" watch -p "$bpid" --path ring naps --duration 0.5 2>cmd
rc=$?
check "ring path attached: exit status $rc, the path said, a summary" \
	"[[ $rc == 0 ]] && grep -q 'ring path (perf.s ring buffer' cmd && grep -qE '^# [0-9]+ hit\(s\) printed, 0 lost$' cmd"
after_detach "ring path attached"
finish "ring path attached"

"$hwbp" >hw
delivered=$?
[[ $delivered -eq 0 || $delivered -eq 77 ]] || { echo "hwbp_delivered: exit $delivered"; exit 1; }
modes=(page)
if [[ $delivered -eq 0 ]]; then modes+=(hw ring); else echo "hardware cases skipped (both paths): $(cat hw)"; fi
# The options of each: a debug register's hits by SIGTRAP (values) or read
# from perf's ring buffer (no values, doc/design/watch-ring.md).
margs() {
	case $1 in
	page) echo --mode page ;;
	hw) echo --mode hw --path signal ;;
	ring) echo --mode hw --path ring ;;
	esac
}

# no_memfd: nothing of page mode's is left in the process (its pages private again).
no_memfd() { ! grep -q 'probekit-watch' "/proc/$bpid/maps"; }

for mode in "${modes[@]}"; do
start
echo "--- $(margs "$mode")"
if [[ $mode == ring ]]; then
	hit_naps='^ +[0-9]+\.[0-9]{6} tid [0-9]+ write naps (at|after) '
	consecutive() { true; } # no values on the ring path
fi

# 1. A second of naps: every hit is the next value, then the detach.
"$pk" watch -p "$bpid" $(margs "$mode") naps --duration 1 2>cmd
rc=$?
check "watch -p: exit status $rc" "[[ $rc == 0 ]]"
check "watch -p: attached, detached" "grep -q 'attached to process $bpid' cmd && grep -q 'detached from process $bpid' cmd"
check "watch -p: the watch named" "grep -q '^# probekit watch: naps, 8 byte(s) at 0x[0-9a-f]*, writes, all threads' cmd"
check "watch -p: about 20 hits, each the next value" \
	"[[ \$(grep -cE '$hit_naps' cmd) -ge 5 ]] && consecutive cmd"
check "watch -p: the summary counts what was printed, none lost" \
	"grep -qx \"# \$(grep -cE '$hit_naps' cmd) hit(s) printed, 0 lost\" cmd"
check "watch -p: the sleeper's function named" "grep -E '$hit_naps' cmd | head -1 | grep -q ' at sleeper+0x'"
check "watch -p: SIGTRAP the program's again" sigtrap_caught
check "watch -p: no page of ours left" no_memfd
after_detach "watch -p"

# 2. Threads created after the attach are watched.
tids0=$(ls "/proc/$bpid/task")
touch spawn
"$pk" watch -p "$bpid" $(margs "$mode") spawned --duration 0.5 2>cmd
rc=$?
rm -f spawn
sleep 0.1
new=$(grep -E '^ +[0-9.]+ tid [0-9]+ write spawned' cmd | awk '{print $3}' | sort -u | grep -vxF "$tids0" | wc -l)
check "new threads: exit status $rc, hits by $new thread(s) created after the attach" "[[ $rc == 0 && $new -ge 5 ]]"
after_detach "new threads"

# 3. --count: the watch ends after N hits and detaches by itself; -o FILE.
"$pk" watch -p "$bpid" $(margs "$mode") -c 3 -o report naps 2>cmd
rc=$?
check "--count 3: exit status $rc, detached" "[[ $rc == 0 ]] && grep -q 'detached from process $bpid' cmd"
check "--count 3: three hits in the file, the agent reused" \
	"[[ \$(grep -cE '$hit_naps' report) == 3 ]] && grep -q -- '--count 3 reached' report && grep -q 'the agent reused' cmd"
check "--count 3: no report on stderr" "! grep -qE '$hit_naps' cmd"
after_detach "--count"

# 4. SIGINT detaches; the program's own SIGTRAP handler gets its signals after.
: >cmd # the last run's lines are not this one's
"$pk" watch -p "$bpid" $(margs "$mode") naps 2>cmd &
w=$!
for ((k = 0; k < 6000; k++)); do grep -q 'watching until Ctrl-C' cmd && break; kill -0 "$w" 2>/dev/null || break; sleep 0.01; done
sleep 0.2
kill -INT "$w"
wait "$w"
rc=$?
check "SIGINT: exit status $rc, detached" "[[ $rc == 0 ]] && grep -q 'detached from process $bpid' cmd && grep -q 'hit(s) printed' cmd"
after_detach "SIGINT"
kill -TRAP "$bpid"
sleep 0.1
finish "SIGINT"
check "SIGINT: busy's SIGTRAP handler caught the one sent after" "grep -qx 'signals 1 0' out"
done

# 5. Usage.
"$pk" watch -p 1 2>cmd
check "usage: -p without SYMBOL" "[[ $? == 125 ]] && grep -q 'no SYMBOL' cmd"
"$pk" watch -p 1 naps -- true 2>cmd
check "usage: -p with PROG" "[[ $? == 125 ]] && grep -q 'no PROG' cmd"
"$pk" watch --duration 1 naps -- true 2>cmd
check "usage: --duration without -p" "[[ $? == 125 ]] && grep -q 'duration is for -p' cmd"
"$pk" watch -p x naps 2>cmd
check "usage: -p x" "[[ $? == 125 ]] && grep -q 'needs a process id' cmd"

echo "watch -p: $pass passed, $fail failed"
((fail == 0))
