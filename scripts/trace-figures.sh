#!/usr/bin/env bash
# doc/benchmarks.md's "Traces of any size" figures, measured in one run: a trace of
# N calls of the bundled trace_demo (--bench N) and one of a real program
# (zstd -19 with two threads, built with patchable entries by
# scripts/realprog.sh), each recorded by probekit and by uftrace
# (`uftrace record -P .`), then read by each tool's report, replay and
# Chrome-JSON export (uftrace dump --chrome), and by probekit's Perfetto
# export.  For every step: wall time and peak memory (GNU time's maximum
# resident set), and the size of what it wrote.  Prints a Markdown table.
#
# usage: scripts/trace-figures.sh [-n CALLS] [-z] [-k]
#   -n CALLS  trace_demo --bench CALLS (default 10000000: 20 M events)
#   -z        also the zstd trace: 160 KB of zstd's sources at -19 with two
#             threads, about 130 M events (needs scripts/realprog.sh zstd once)
#   -k        keep the traces (in $TF_DIR, default build/trace-figures)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
pk=${PROBEKIT:-$repo/build/cli/probekit}
demo=$repo/build/examples/trace_demo
zstd=${TF_ZSTD:-$repo/build/realprog/zstd/pfe/zstd}
zsrc=$repo/build/realprog/zstd/data.2 # zstd's own sources, as realprog.sh lays them out
zdata=${TF_ZSTD_DATA:-$repo/build/realprog/zstd/data.fig}
dir=${TF_DIR:-$repo/build/trace-figures}
n=10000000 withz=false keep=false
while getopts n:zk o; do
	case $o in
	n) n=$OPTARG ;;
	z) withz=true ;;
	k) keep=true ;;
	*) sed -n '2,/^set/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
	esac
done
command -v uftrace >/dev/null || { echo "trace-figures: uftrace is needed (apt-get install uftrace)" >&2; exit 1; }
[[ -x $pk && -x $demo ]] || { echo "trace-figures: build first (./dev build)" >&2; exit 1; }
mkdir -p "$dir" && cd "$dir" || exit 1

# m LABEL OUT CMD...: run CMD (stdout to OUT), print "LABEL|seconds|peak MB|OUT bytes".
m() {
	local label=$1 out=$2 t
	shift 2
	t=$(mktemp)
	/usr/bin/time -f '%e %M' -o "$t" "$@" >"$out" 2>"$dir/last.err" ||
		{ echo "trace-figures: $label failed: $(tail -3 "$dir/last.err")" >&2; }
	read -r secs kb <"$t"
	rm -f "$t"
	printf '%s|%s s|%d MB|%s\n' "$label" "$secs" $((kb / 1024)) "$(size_of "$out")"
}
size_of() {
	[[ $1 == /dev/null ]] && { echo -; return; }
	du -sb "$1" 2>/dev/null | awk '{ printf "%.1f MB", $1 / 1e6 }'
}

# figures NAME CMD...: every step for the program CMD.
figures() {
	local name=$1 ev
	shift
	rm -rf "$name.trace" "$name.uftrace"
	echo "| $name: step | probekit | uftrace |"
	echo "|---|---|---|"
	row record "$(m "trace" /dev/null "$pk" trace -o "$name.trace" -- "$@")" \
		"$(m "record" /dev/null uftrace record -P . -d "$name.uftrace" "$@")"
	ev=$("$pk" report "$name.trace" 2>/dev/null | sed -n 's/.*threads, \([0-9]*\) events.*/\1/p')
	row "trace size ($ev events)" "x|x|x|$(size_of "$name.trace")" "x|x|x|$(size_of "$name.uftrace")"
	row report "$(m report /dev/null "$pk" report "$name.trace")" \
		"$(m report /dev/null uftrace report -d "$name.uftrace")"
	row replay "$(m replay /dev/null "$pk" replay "$name.trace")" \
		"$(m replay /dev/null uftrace replay -d "$name.uftrace")"
	row "Chrome JSON" "$(m json "$name.json" "$pk" export "$name.trace" --format chrome)" \
		"$(m json "$name.uf.json" uftrace dump --chrome -d "$name.uftrace")"
	row "Perfetto protobuf" "$(m perfetto "$name.pftrace" "$pk" export "$name.trace" --format perfetto)" "x|-|-|-"
	echo
	$keep || rm -rf "$name.trace" "$name.uftrace" "$name.json" "$name.uf.json" "$name.pftrace"
}
# row STEP "label|time|mem|size" "label|time|mem|size": one table line.
row() {
	local a b
	IFS='|' read -r _ at am as <<<"$2"
	IFS='|' read -r _ bt bm bs <<<"$3"
	a=$at b=$bt
	[[ $at == x ]] && a=$as || { [[ $as != - ]] && a="$at, $am, $as" || a="$at, $am"; }
	[[ $bt == x ]] && b=$bs || { [[ $bs != - ]] && b="$bt, $bm, $bs" || b="$bt, $bm"; }
	[[ $bt == - ]] && b=-
	echo "| $1 | $a | $b |"
}

echo "# $(nproc) CPUs, $(sed -n 's/^model name\t: //p' /proc/cpuinfo | head -1); each cell: wall time, peak memory, output size"
echo
figures "trace_demo --bench $n" "$demo" --bench "$n"
if $withz; then
	[[ -f $zdata || ! -f $zsrc ]] || head -c 160000 "$zsrc" >"$zdata"
	[[ -x $zstd && -f $zdata ]] || { echo "trace-figures: no $zstd: run scripts/realprog.sh zstd first" >&2; exit 1; }
	figures "zstd -19 -T2, 160 KB" "$zstd" -q -f -19 -T2 -B512KiB "$zdata" -o "$dir/z.zst"
fi
