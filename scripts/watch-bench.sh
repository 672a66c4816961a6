#!/usr/bin/env bash
# The cost of watching a hot counter (README, "Benchmarks";
# doc/design/watch-ring.md): the same program run plain, under
# `probekit watch --path signal` (a SIGTRAP per hit), under
# `probekit watch --path ring` (perf's ring buffer, read by the agent's
# thread) and under gdb's `watch -l` (a ptrace stop per hit, continued by a
# silent command), each the median wall time of RUNS runs, with its ratio
# to the plain run and, for probekit, the hits printed and lost.  The
# floor row is `perf stat -e mem:ADDR/8:w` on the same run (address space
# randomization off, so ADDR is known before the start): the kernel takes
# each hit's debug exception and counts it, nothing more; no watch whose
# every hit traps can cost less on that machine.
#
# The program is tests/targets/hot_counter (ITERS locked adds to `hot` in
# one thread), or with --redis, redis-server under redis-benchmark
# (REQUESTS requests, SET/GET/INCR) with the watch on
# server.stat_numcommands, one write per command (the target: the ring path
# at most 1.2x the plain run, where the floor allows).  --redis takes
# redis-server and redis-benchmark from PATH, or from REDIS_SRC/src after
# `make -C REDIS_SRC` (a source tree fetched from github.com/redis/redis,
# built with its default -g, so that gdb finds the field's offset).
#
# Where the machine accepts hardware breakpoints but never delivers their
# hits (some hypervisors: tests/lib/hwbp_delivered.c), every watched figure
# would be a program running unwatched: the script says "hardware hits not
# delivered here" and prints the plain figure only.
#
# usage: scripts/watch-bench.sh [-n ITERS] [-r RUNS] [--redis [-q REQUESTS]]
#   -n ITERS     hot_counter's increments (default 100000)
#   -r RUNS      runs of each, the median kept (default 5)
#   --redis      redis-server under redis-benchmark instead
#   -q REQUESTS  redis-benchmark's requests (default 100000)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$repo/build}
pk=${PROBEKIT:-$build/cli/probekit}
hot=$build/tests/targets/hot_counter
hwbp=$build/tests/lib/hwbp_delivered
iters=100000 runs=5 redis=false requests=100000
while (($#)); do
	case $1 in
	-n) iters=$2; shift 2 ;;
	-r) runs=$2; shift 2 ;;
	-q) requests=$2; shift 2 ;;
	--redis) redis=true; shift ;;
	*) sed -n '2,/^set/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
	esac
done
for f in "$pk" "$hot" "$hwbp"; do
	[[ -x $f ]] || { echo "no $f: build with the tests first (./dev build)" >&2; exit 1; }
done
dir=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	rm -rf "$dir"
}
trap cleanup EXIT

secs() { date +%s.%N; }
# median of the numbers on stdin
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# --- what is run: run_plain / run_watched PATH / run_gdb, each one run, its seconds on stdout

if ! $redis; then
	what="hot_counter $iters (one thread, locked adds to \`hot\`)"
	sym=hot
	prog=$hot field_off=0
	total=$iters
	run_prog() { "$@" "$hot" "$iters" >/dev/null; }
else
	rs=$(command -v redis-server) rb=$(command -v redis-benchmark)
	if [[ -n ${REDIS_SRC:-} ]]; then rs=$REDIS_SRC/src/redis-server rb=$REDIS_SRC/src/redis-benchmark; fi
	[[ -x ${rs:-} && -x ${rb:-} ]] || {
		echo "no redis-server and redis-benchmark: install them, or set REDIS_SRC to a" \
			"redis source tree built with make" >&2
		exit 1
	}
	off=$(gdb -q -batch -ex 'print (char *)&server.stat_numcommands - (char *)&server' "$rs" 2>/dev/null |
		sed -n 's/^\$1 = //p')
	[[ $off =~ ^[0-9]+$ ]] || { echo "gdb finds no server.stat_numcommands in $rs (no debug info?)" >&2; exit 1; }
	what="redis-server, redis-benchmark -n $requests -t set,get,incr"
	sym=server+$off
	prog=$rs field_off=$off
	total=
	port=$((20000 + RANDOM % 20000))
	# run_prog CMD...: the server under CMD, the benchmark against it, then SHUTDOWN.
	run_prog() {
		"$@" "$rs" --port "$port" --save '' --appendonly no >"$dir/server.log" 2>&1 &
		local s=$! k
		pids+=("$s")
		for ((k = 0; k < 500; k++)); do "$rb" -p "$port" -n 1 -t ping -q >/dev/null 2>&1 && break; sleep 0.02; done
		"$rb" -p "$port" -n "$requests" -t set,get,incr -q >/dev/null 2>&1
		# SHUTDOWN: the server exits by exit(), so the agent prints its summary.
		if exec 3<>"/dev/tcp/127.0.0.1/$port"; then
			printf 'SHUTDOWN NOSAVE\r\n' >&3
			exec 3>&-
		fi 2>/dev/null
		wait "$s"
	}
fi

timed() { # CMD...: the seconds it took
	local t0 t1
	t0=$(secs)
	"$@"
	t1=$(secs)
	awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f\n", b - a}'
}
run_plain() { run_prog; }
run_watched() { run_prog "$pk" watch --mode hw --path "$1" -l 8 -o "$dir/report.$1" "$sym" --; }
# gdb stops at the first instruction (starti) so that `watch -l` finds the
# address, counts its stops in $n and writes them to gdb.out at the end.
gdb_cmds() {
	printf 'set pagination off\nset $n = 0\nstarti\nwatch -l %s\n' "$1"
	printf 'commands\nsilent\nset $n = $n + 1\ncontinue\nend\ncontinue\n'
	printf 'set logging file %s\nset logging overwrite on\nset logging enabled on\nprint $n\n' \
		"$dir/gdb.out"
}
run_gdb() {
	local expr=hot
	$redis && expr=server.stat_numcommands
	gdb_cmds "$expr" >"$dir/gdb.cmds"
	run_prog gdb -q -batch -x "$dir/gdb.cmds" --args >/dev/null 2>&1
}

echo "watch-bench: $what, median of $runs run(s)"
plain=$(for ((i = 0; i < runs; i++)); do timed run_plain; done | median)
printf '| %-34s | %10s | %6s | %s\n' "run" "seconds" "ratio" "hits"
printf '| %-34s | %10.4f | %6s | %s\n' "plain" "$plain" "1.00" "-"

"$hwbp" >"$dir/hw"
if [[ $? -ne 0 ]]; then
	echo "hardware hits not delivered here: $(sed 's/^SKIP: //' "$dir/hw")"
	echo "(the signal path, the ring path and gdb's watch -l would each time a program running unwatched: not measured)"
	exit 0
fi

# floor: the kernel counting each hit (perf stat), PROG at the address it
# has with randomization off (a PIE's base is then 0x555555554000)
floor_addr() {
	local base=0 v
	v=$(nm "$prog" | awk -v s="${sym%%+*}" '$3 == s {print $1; exit}')
	[[ -n $v ]] || return 1
	file -L "$prog" | grep -q 'pie executable' && base=0x555555554000
	printf '0x%x\n' $((base + 0x$v + field_off))
}
run_floor() { run_prog perf stat -x, -o "$dir/floor.csv" -e "mem:$1/8:w" -- setarch -R; }
if command -v perf >/dev/null && command -v setarch >/dev/null && addr=$(floor_addr); then
	t=$(for ((i = 0; i < runs; i++)); do timed run_floor "$addr"; done | median)
	n=$(awk -F, '/mem:/ {print $1; exit}' "$dir/floor.csv")
	printf '| %-34s | %10.4f | %6.2f | %s\n' "floor: perf stat -e mem:ADDR/8:w" "$t" \
		"$(awk -v a="$t" -v b="$plain" 'BEGIN {print a / b}')" "${n:-?} counted"
fi

for path in signal ring; do
	t=$(for ((i = 0; i < runs; i++)); do timed run_watched $path; done | median)
	sum=$(grep -E '^# [0-9]+ hit\(s\) printed' "$dir/report.$path" | tail -1 | sed 's/^# //')
	printf '| %-34s | %10.4f | %6.2f | %s\n' "probekit watch --path $path" "$t" \
		"$(awk -v a="$t" -v b="$plain" 'BEGIN {print a / b}')" "${sum:-no summary}"
	head -1 "$dir/report.$path" | grep -q "$path path" ||
		echo "  (the report's first line does not name the $path path: $(head -1 "$dir/report.$path"))"
done
if command -v gdb >/dev/null; then
	t=$(for ((i = 0; i < runs; i++)); do timed run_gdb; done | median)
	n=$(sed -n 's/^\$1 = //p' "$dir/gdb.out" | tail -1)
	printf '| %-34s | %10.4f | %6.2f | %s\n' "gdb watch -l (silent, continue)" "$t" \
		"$(awk -v a="$t" -v b="$plain" 'BEGIN {print a / b}')" "${n:-?} stop(s)${total:+ of $total}"
fi
