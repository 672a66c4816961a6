#!/usr/bin/env bash
# probekit export --format perfetto: the file decodes with `protoc --decode`
# against the schema of what probekit writes (tests/cli/perfetto/), and against
# Perfetto's own definitions when PERFETTO_PROTOS names a Perfetto source
# tree (scripts/perfetto-check.sh sets it); the two decodings are the same,
# no field is unknown, and perfetto_check.py finds every sequence's slices
# balanced, names interned before use, and per function the same calls and
# longest call as `probekit report`.  Then: entry-only traces give instants,
# a flight recorder's trace stays balanced, and the file is at most a
# third of the Chrome JSON's size.
#
# usage: test-trace-perfetto.sh PROBEKIT TRACE_MODES PROTO_DIR
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2") protodir=$(realpath "$3")
checker=$(dirname "$(realpath "$0")")/perfetto_check.py
. "$(dirname "$(realpath "$0")")/lib.sh"

decode() { protoc --decode=perfetto.protos.Trace -I "$protodir" "$protodir/probekit-perfetto.proto" <"$1"; }
ours=${PERFETTO_PROTOS:-}
# decode_theirs FILE: with Perfetto's own merged schema.
decode_theirs() {
	protoc --decode=perfetto.protos.Trace -I "$ours" "$ours/protos/perfetto/trace/perfetto_trace.proto" <"$1"
}
# report_rows FILE: "NAME CALLS MAX_NS" per function of the report.
report_rows() { "$pk" report --raw "$1" 2>/dev/null | awk '$NF ~ /^\[/ { print $(NF-1), $1, $6 }' | sort; }

run -o d.trace -- "$demo" --threads 2
check "trace: rc $rc" "[[ $rc == 0 ]]"
"$pk" export d.trace --format perfetto -o d.pftrace 2>err
check "export: rc $?, named the file" "grep -q 'wrote d.pftrace' err"
decode d.pftrace >d.txt 2>err
check "protoc --decode with probekit's schema: rc $?" "[[ -s d.txt ]] && ! grep -q . err"
python3 "$checker" <d.txt >d.chk 2>err
check "the decoded trace is consistent ($(tail -1 d.chk))" "[[ $? == 0 ]] && grep -q '^packets' d.chk"
awk 'NF == 4 { print $1, $2, $4 }' d.chk | sort >got
report_rows d.trace >want
# the longest call agrees to 2 ns (the report converts the difference, we each timestamp)
check "calls and longest call per function = the report's" "join got want | awk '{ if (\$2 != \$4 || \$3 - \$5 > 2 || \$5 - \$3 > 2) bad = 1 } END { exit bad || NR < 5 }'"
if [[ -n $ours && -f $ours/protos/perfetto/trace/perfetto_trace.proto ]]; then
	decode_theirs d.pftrace >theirs.txt 2>err
	check "protoc --decode with Perfetto's own protos: rc $?, no error" "[[ -s theirs.txt ]] && ! grep -q . err"
	check "the same decoding as with probekit's schema" "cmp -s d.txt theirs.txt"
	python3 "$checker" <theirs.txt >/dev/null
	check "Perfetto's decoding consistent too" "[[ $? == 0 ]]"
else
	echo "note: PERFETTO_PROTOS not set: checked against probekit's schema only (scripts/perfetto-check.sh checks against Perfetto's own)"
fi

# Size against Chrome JSON, same trace.  The ratio moves with the size of
# the durations, varints against decimal text (0.24 in a plain build, 0.25
# under ASan, whose calls are slower): a third bounds it with room.
"$pk" export d.trace --format chrome -o d.json 2>/dev/null
ps=$(stat -c %s d.pftrace) js=$(stat -c %s d.json)
check "perfetto $ps bytes <= a third of chrome's $js" "[[ $((ps * 3)) -le $js ]]"

# Entry-only: instants, as many as the calls.
run --entry-only -o eo.trace -- "$demo" --threads 1
"$pk" export eo.trace --format perfetto -o eo.pftrace 2>/dev/null
decode eo.pftrace | python3 "$checker" >eo.chk
check "entry-only: decodes, consistent" "[[ \${PIPESTATUS[0]} == 0 ]] && grep -q '^packets' eo.chk"
check "entry-only: instants, no slices ($(tail -1 eo.chk))" "grep -q 'begins 0 ends 0 instants [1-9]' eo.chk"
fib=$("$pk" report eo.trace 2>/dev/null | awk '$NF ~ /^\[/ && $(NF-1) == "demo_fib" { print $1 }')
check "entry-only: demo_fib instants = report's $fib calls" "grep -qx 'demo_fib 0 $fib 0' eo.chk"

# A flight recorder's trace (GAP events): still balanced.
run --ring 16K -o ring.trace -- "$demo" --threads 2
"$pk" export ring.trace --format perfetto -o ring.pftrace 2>/dev/null
decode ring.pftrace | python3 "$checker" >ring.chk
check "ring: decodes, balanced ($(tail -1 ring.chk))" "grep -q '^packets' ring.chk"

# Binary output is not written to a terminal, and a bad format is named.
"$pk" export d.trace --format perfet >/dev/null 2>err
check "unknown format named with the list" "grep -q \"unknown format 'perfet' (perfetto, chrome\" err"

echo "$pass passed, $fail failed"
[[ $fail == 0 ]]
