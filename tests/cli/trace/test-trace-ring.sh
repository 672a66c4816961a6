#!/usr/bin/env bash
# probekit trace --ring: the flight recorder.  ring_prog calls phase_a()
# N times, then a trigger, then phase_b() N times.  With rings of 16 KiB
# (1024 events: 512 calls), the file holds about the last 512 calls before
# each trigger: phase_a's at the trigger, phase_b's at the exit; nothing in
# between, and the summary names the triggers and what was overwritten.
#
# usage: test-trace-ring.sh PROBEKIT RING_PROG
set -uo pipefail
pk=$(realpath "$1") prog=$(realpath "$2")
. "$(dirname "$(realpath "$0")")/lib.sh"

n=100000
# calls FILE FUNC: FUNC's calls in the report of FILE (0 if absent).
calls() { "$pk" report "$1" 2>/dev/null | awk -v f="$2" '$NF ~ /^\[/ && $(NF-1) == f { print $1; x=1 } END { if (!x) print 0 }'; }
near512() { [[ $1 -ge 500 && $1 -le 512 ]]; }

# 1. The exit only: the last 512 calls, all of phase_b.
run --ring 16K -o none.trace -- "$prog" none $n
check "none: rc $rc" "[[ $rc == 0 ]]"
check "none: summary" "grep -q 'none.trace: flight recorder: 1 snapshot(s) (1 exit), [0-9]* older events overwritten' err"
a=$(calls none.trace phase_a) b=$(calls none.trace phase_b)
check "none: phase_a $a, phase_b $b (512 expected)" "[[ $a == 0 ]] && near512 $b"
check "none: report says it" "$pk report none.trace 2>/dev/null | grep -q '^# flight recorder: 1 snapshot(s) (1 exit)'"
"$pk" replay none.trace >rep 2>&1
check "none: replay marks the cut" "grep -q 'events overwritten (--ring)' rep"
ow=$(sed -n 's/.*(1 exit), \([0-9]*\) older events overwritten/\1/p' err)
ev=$(sed -n 's|^probekit: wrote .*/none.trace: \([0-9]*\) events.*|\1|p' err)
# every event of the run is in the file or counted as overwritten: as many
# as the same run traced without the ring records
run -o full.trace -- "$prog" none $n
all=$(sed -n 's|^probekit: wrote .*/full.trace: \([0-9]*\) events.*|\1|p' err)
check "none: $ev events + $ow overwritten = $all, a full trace's" "[[ $((ev + ow)) == $all && $all -ge $((4 * n)) ]]"

# 2. SIGUSR2, which the program leaves at its default: a snapshot, the program lives on.
run --ring 16K -o sig.trace -- "$prog" signal $n
check "signal: rc $rc, output" "[[ $rc == 0 ]] && grep -qx 'handled 0' out"
check "signal: summary" "grep -q 'sig.trace: flight recorder: 2 snapshot(s) (1 SIGUSR2, 1 exit)' err"
a=$(calls sig.trace phase_a) b=$(calls sig.trace phase_b)
check "signal: phase_a $a, phase_b $b (512 each expected)" "near512 $a && near512 $b"

# 3. --trigger FUNC.
run --ring 16K --trigger ring_mark -o func.trace -- "$prog" func $n
check "func: rc $rc" "[[ $rc == 0 ]]"
check "func: summary" "grep -q 'func.trace: flight recorder: 2 snapshot(s) (1 --trigger, 1 exit)' err"
a=$(calls func.trace phase_a) b=$(calls func.trace phase_b) m=$(calls func.trace ring_mark)
check "func: phase_a $a, phase_b $b, ring_mark $m" "near512 $a && near512 $b && [[ $m == 1 ]]"

# ring_mark's exit was overwritten (the 2nd snapshot's GAP cut it): its end
# is not known, '-', not the 0 ns of an end made up at its entry.
check "func: ring_mark cut by the gap has no time" "$pk report --raw func.trace 2>/dev/null | grep -Eq '^ +1 +- +- +- +- +-  ring_mark '"
"$pk" replay func.trace >rep 2>&1
check "func: replay says ring_mark's end is unknown" "grep -Eq '^ +- .*ring_mark\(\); \(cut: events overwritten\)' rep"
# The trigger's snapshot alone (the file cut after its TRIGGER record, as a
# kill would leave it): main and ring_mark were open at the trigger's time,
# which ends them, not their last event.
run --ring 1M --trigger ring_mark -o cut.trace -- "$prog" func 1000
python3 - cut.trace cut1.trace <<'PY'
import struct, sys
d = open(sys.argv[1], 'rb').read()
off = 16
while True:
    typ, ln = struct.unpack_from('<II', d, off)
    off += 16 + (ln + 7) // 8 * 8
    if typ == 9:
        break
open(sys.argv[2], 'wb').write(d[:off])
PY
"$pk" report --raw cut1.trace >rep 2>/dev/null
check "trigger cut: ring_mark ends at the trigger, not 0 ns" "awk '\$NF == \"[ring_prog]\" && \$(NF-1) == \"ring_mark\" && \$2 > 0 && \$6 > 0 {x = 1} END {exit !x}' rep"
check "trigger cut: main's time known" "awk '\$NF == \"[ring_prog]\" && \$(NF-1) == \"main\" && \$2 > 0 {x = 1} END {exit !x}' rep"
check "trigger cut: no end unknown" "! grep -q 'no known end' rep"

# 4. A crash: the snapshot is the last thing, and the program dies as it would.
run --ring 16K -o crash.trace -- "$prog" crash $n
check "crash: rc $rc (SIGABRT)" "[[ $rc == 134 ]]"
check "crash: summary" "grep -q 'crash.trace: flight recorder: 1 snapshot(s) (1 crash)' err"
a=$(calls crash.trace phase_a)
check "crash: phase_a $a" "near512 $a"

# 5. The program's own SIGUSR2 handler: it runs, and SIGUSR2 is no trigger.
run --ring 16K -o own.trace -- "$prog" own $n
check "own: rc $rc, the program's handler ran" "[[ $rc == 0 ]] && grep -qx 'handled 1' out"
check "own: no SIGUSR2 snapshot" "grep -q 'own.trace: flight recorder: 1 snapshot(s) (1 exit)' err"

# 6. SIGUSR2 sent to probekit itself (kill %1, pkill) reaches PROG: a snapshot.
rm -f ready go
# (The wait loop's library calls left out: the ring holds phase_a's last calls.)
"$pk" trace --ring 16K --no-libcall -o fwd.trace -- "$prog" wait $n >out 2>err &
pkpid=$!
for ((k = 0; k < 2000; k++)); do [[ -e ready ]] && break; sleep 0.01; done
kill -USR2 $pkpid
sleep 0.2
touch go
wait $pkpid
rc=$?
check "usr2 to probekit: rc $rc, summary" "[[ $rc == 0 ]] && grep -q 'fwd.trace: flight recorder: 2 snapshot(s) (1 SIGUSR2, 1 exit)' err"
a=$(calls fwd.trace phase_a)
check "usr2 to probekit: phase_a $a" "near512 $a"

# 7. Usage errors, named.
run --trigger ring_mark -- "$prog" none 10
check "--trigger without --ring refused" "[[ $rc == 125 ]] && grep -q 'needs --ring' err"
run --ring 1K -- "$prog" none 10
check "--ring too small refused" "[[ $rc == 125 ]] && grep -q 'from 16K to 1G' err"
run --ring 16K --trigger no_such_fn -o x.trace -- "$prog" none 10
check "--trigger unknown function: said at start and at the end" "[[ $rc == 0 ]] && grep -q 'no_such_fn: no traced function of that name yet' err && grep -q 'trigger no_such_fn never fired' err"
run --ring 16K --drop -- "$prog" none 10
check "--ring --drop refused" "[[ $rc == 125 ]] && grep -q 'never waits' err"
run --ring 16K --ring 32kb -o twice.trace -- "$prog" none 10
check "--ring twice: the last one, '32kb' read as 32 KiB" "[[ $rc == 0 ]] && grep -q 'twice.trace: flight recorder' err"

echo "$pass passed, $fail failed"
[[ $fail == 0 ]]
