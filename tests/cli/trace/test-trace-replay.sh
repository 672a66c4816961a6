#!/usr/bin/env bash
# probekit replay: the call tree of a trace of trace_modes, checked against
# probekit report of the same file (every call shown once: a leaf line or a
# closing line), and each option against what it promises.  probekit graph:
# the paths under a function, whose calls add up to report's.  export
# --format speedscope: checked by parsing it.
#
# usage: test-trace-replay.sh PROBEKIT TRACE_MODES
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2")
. "$(dirname "$(realpath "$0")")/lib.sh"

run -o r.trace -- "$demo" --threads 2
check "trace: rc $rc" "[[ $rc == 0 ]]"
"$pk" replay r.trace >rp 2>rp.err
check "replay: rc $?" "[[ -s rp ]]"
# Each call is one line: 'fn();' (a leaf) or '} /* fn */' (its close).
for fn in demo_fib demo_stage demo_leaf demo_worker; do
	shown=$(grep -cE "\| *($fn\(\);|\} /\* $fn \*/)" rp)
	calls=$("$pk" report --raw r.trace 2>/dev/null | awk -v f="$fn" '$(NF-1) == f {print $1}')
	check "replay: $fn calls $shown, report $calls" "[[ -n '$calls' && $shown == $calls ]]"
done
check "replay: every '{' closed" "[[ \$(grep -c '() {\$' rp) == \$(grep -c '} /\\*' rp) ]]"
# -D 1: only the outermost calls.
"$pk" replay r.trace -D 1 >d1 2>&1
check "-D 1: nothing indented" "grep -q 'demo_worker' d1 && ! grep -q '|   ' d1"
# -t: no call shorter is shown, nor left open.
"$pk" replay r.trace -t 2us >t2 2>&1
check "-t 2us: no duration under 2 us" "[[ -s t2 ]] && ! awk -F'[' 'NR > 1 && \$1 ~ / ns / {bad = 1} END {exit !bad}' t2"
check "-t 2us: fewer lines" "[[ \$(wc -l <t2) -lt \$(wc -l <rp) ]]"
check "-t 2us: every '{' closed" "[[ \$(grep -c '() {\$' t2) == \$(grep -c '} /\\*' t2) ]]"
# -N hides a function and its callees; -f keeps only a function's subtree.
"$pk" replay r.trace -N demo_stage >nn 2>&1
check "-N demo_stage: neither it nor demo_leaf" "grep -q demo_fib nn && ! grep -qE 'demo_stage|demo_leaf' nn"
"$pk" replay r.trace -f demo_stage >ff 2>&1
check "-f demo_stage: only its subtree" "grep -q demo_leaf ff && ! grep -qE 'demo_worker|demo_fib' ff"
# --tid: one thread's lines only.
tid=$(awk -F'[][]' 'NR == 2 {gsub(/ /, "", $2); print $2}' rp)
"$pk" replay r.trace --tid "$tid" >td 2>&1
check "--tid $tid: its lines only" "[[ -s td ]] && ! awk -F'[][]' -v t=$tid 'NR > 1 {gsub(/ /, \"\", \$2); if (\$2 != t) bad = 1} END {exit !bad}' td"
# The threads' lines are merged in time order: main()'s line, entered first,
# comes before every worker's (a sanitizer's constructors may precede it),
# the workers' lines interleave, and each line is shown once: the lines
# are those of every thread's --tid replay together.
"$pk" replay r.trace -D 1 >m1 2>&1
check "merged: main() before the workers" "awk '/ main\\(\\);/ {m = NR} / demo_worker\\(\\);/ && !w {w = NR} END {exit !(m && w && m < w)}' m1"
"$pk" replay r.trace -D 2 >m2 2>&1
check "merged: the workers' lines interleave" "[[ \$(awk -F'[][]' 'NR > 1 {if (\$2 != p) n++; p = \$2} END {print n}' m2) -gt 4 ]]"
: >pertid
for t in $(awk -F'[][]' 'NR > 1 {gsub(/ /, "", $2); print $2}' rp | sort -u); do
	"$pk" replay r.trace --tid "$t" | tail -n +2 >>pertid
done
check "merged: the lines of the threads' replays, none lost or repeated" "cmp -s <(tail -n +2 rp | sort) <(sort pertid)"
check "merged: each thread's lines in its order" "for t in \$(awk -F'[][]' 'NR > 1 {gsub(/ /, \"\", \$2); print \$2}' rp | sort -u); do cmp -s <(awk -F'[][]' -v t=\$t 'NR > 1 {x = \$2; gsub(/ /, \"\", x); if (x == t) print}' rp) <(\"$pk\" replay r.trace --tid \$t | tail -n +2) || exit 1; done"
# Each line's time (a call's entry for its '{' or leaf line, its exit for
# its '}'), from the chrome export's calls of the same file: nondecreasing.
"$pk" export r.trace --format chrome -o r.json >/dev/null 2>&1
python3 - r.json rp >order.check 2>&1 <<'PY'
import json, re, sys, collections
calls, opened = collections.defaultdict(list), collections.defaultdict(list)
for e in json.load(open(sys.argv[1]))["traceEvents"]:
    if e["ph"] == "X":
        calls[e["tid"]].append((e["ts"], -e["dur"]))
    elif e["ph"] == "B":
        opened[e["tid"]].append(e["ts"])
    elif e["ph"] == "E":
        ts = opened[e["tid"]].pop()
        calls[e["tid"]].append((ts, ts - e["ts"]))
for v in calls.values():
    v.sort(reverse=True)
stacks, last = collections.defaultdict(list), -1
for l in open(sys.argv[2]).readlines()[1:]:
    m = re.match(r".*\[ *(\d+)\] \| *(.*)$", l)
    tid, text = int(m.group(1)), m.group(2)
    if text.startswith("}"):
        t = stacks[tid].pop()
    else:
        ts, negdur = calls[tid].pop()
        t = ts
        if text.endswith("{"):
            stacks[tid].append(ts - negdur)
    # the export gives times and durations to the ns: an exit time
    # (ts + dur) and the time it is compared with may each be a few ns off
    assert t >= last - 0.0035, "%s: %.3f after %.3f" % (l.strip(), t, last)
    last = max(last, t)
print("in order")
PY
check "merged: each line's time no earlier than the line before's ($(tail -1 order.check))" \
	"grep -qx 'in order' order.check"
# Nothing matched: said, and status 1.
"$pk" replay r.trace --tid 999999999 >nt 2>nt.err
check "--tid 999999999: no such thread, status 1" "[[ \$? == 1 && ! -s nt ]] && grep -q 'no thread 999999999 in the trace (its threads: [0-9]' nt.err"
"$pk" replay r.trace -f nosuch >nf 2>nf.err
check "-f nosuch: no function, status 1" "[[ \$? == 1 && ! -s nf ]] && grep -q \"no function matches 'nosuch'\" nf.err"
# --since/--until: a window shows fewer calls, each entered inside it.
"$pk" replay r.trace --until 1ns >u1 2>&1
check "--until 1ns: almost nothing" "[[ \$(wc -l <u1) -lt 10 ]]"
# An entry-only trace: calls with '-' for the time.
run -o e.trace --entry-only -- "$demo" --threads 1
"$pk" replay e.trace >eo 2>&1
check "entry-only: '-' times" "grep -qE '^ *- \[.*demo_fib\(\);' eo && ! grep -q '{\$' eo"
"$pk" replay r.trace -t soon >/dev/null 2>bad.err
check "bad time: usage error" "[[ \$? == 2 ]] && grep -q 'bad time' bad.err"

# graph: under demo_worker, every path once; the calls of each function on
# the paths add up to report's, and the root's time is report's total.
"$pk" graph demo_worker r.trace >g 2>&1
for fn in demo_fib demo_stage demo_leaf; do
	sum=$(awk -v f="$fn" '$NF == f { c = $0; sub(/.*\(/, "", c); sub(/\).*/, "", c); s += c } END { print s + 0 }' g)
	calls=$("$pk" report --raw r.trace 2>/dev/null | awk -v f="$fn" '$(NF-1) == f {print $1}')
	check "graph: $fn calls on the paths $sum, report $calls" "[[ $sum == $calls ]]"
done
root=$(awk 'NR == 2 {print $1, $2}' g)
total=$("$pk" report r.trace 2>/dev/null | awk '$(NF-1) == "demo_worker" {print $2, $3}')
check "graph: the root's time is report's total ($root, $total)" "grep -q '(2) demo_worker' g && [[ -n '$total' && '$root' == '$total' ]]"
"$pk" graph demo_worker r.trace -D 1 >g1 2>&1
check "graph -D 1: FUNC and its direct callees" "grep -q '^[^+]*  +-([0-9]*) demo_fib\$' g1 && grep -q '  +-([0-9]*) demo_stage\$' g1 && ! grep -q '    +-' g1"
"$pk" graph no_such r.trace >/dev/null 2>gbad
check "graph: an unknown function is named" "[[ \$? == 1 ]] && grep -q \"no function 'no_such'\" gbad"

# speedscope: valid JSON, one evented profile per thread, frames opened and
# closed in order, as many opens per function as report's calls.
"$pk" export r.trace --format speedscope -o r.ss >/dev/null 2>&1
python3 - r.ss >ss.check 2>&1 <<'PY'
import json, sys, collections
d = json.load(open(sys.argv[1]))
frames = d["shared"]["frames"]
opens = collections.Counter()
for p in d["profiles"]:
    assert p["type"] == "evented" and p["unit"] == "nanoseconds"
    st, last = [], 0
    for e in p["events"]:
        assert e["at"] >= last
        last = e["at"]
        if e["type"] == "O":
            st.append(e["frame"])
            opens[frames[e["frame"]]["name"]] += 1
        else:
            assert st and st.pop() == e["frame"], "closed out of order"
    assert not st, "left open"
for name, n in sorted(opens.items()):
    print(name, n)
PY
check "speedscope: valid, nested in order" "grep -q '^demo_fib ' ss.check && ! grep -q Error ss.check"
for fn in demo_fib demo_stage demo_leaf; do
	calls=$("$pk" report --raw r.trace 2>/dev/null | awk -v f="$fn" '$(NF-1) == f {print $1}')
	check "speedscope: $fn opened $calls times" "grep -qx '$fn $calls' ss.check"
done

echo "trace_replay: $pass passed, $fail failed"
[[ $fail == 0 ]]
