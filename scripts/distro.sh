#!/usr/bin/env bash
# probekit trace --relocate on Debian's own binaries, as installed (stripped,
# no patchable entries, built with gcc -O2 and its -fipa-ra): python3,
# sqlite3, git, bash, coreutils (sort, ls, tar) and redis-server, each on a
# workload of its own.  Each run is made plain, under `probekit trace
# --relocate` and under `uftrace record -P .` (the reference: uftrace's
# dynamic patching of the same file), in fresh directories holding the same
# input files.  Checks that probekit's runs give the plain run's exit status
# and stdout, and compares the per-function call counts of `probekit report`
# with `uftrace report` on the functions both hook (uftrace sees only the
# symbols a file has: .dynsym in a stripped binary).  Differences whose
# cause is uftrace's, checked with gdb, are listed in
# tests/realprog/known-distro.txt: printed, not judged.
#
# usage: scripts/distro.sh [-q] [PROG...]   (default: every one installed)
#   PROG: python3 sqlite3 git bash coreutils redis
#   -q   no uftrace runs (outputs only)
# Environment: PROBEKIT (default build/cli/probekit), DISTRO_DIR (work
# directory, default a temporary one, removed), DISTRO_TRACE_OPTS (more
# options for probekit trace, e.g. --int3).
# Exit status: 0 when every probekit run matched its plain run and every
# judged count matched uftrace's; 1 otherwise; 77 when none is installed.
# redis-server's counts depend on its event loop's timing: printed, not
# judged.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PROBEKIT=$(realpath "${PROBEKIT:-$repo/build/cli/probekit}")
rp() { python3 "$repo/tests/realprog/rp.py" "$@"; }
quick=0
[[ ${1:-} == -q ]] && { quick=1; shift; }
progs=("$@")
((${#progs[@]})) || progs=(python3 sqlite3 git bash coreutils redis)
if [[ -n ${DISTRO_DIR:-} ]]; then
	W=$DISTRO_DIR
	mkdir -p "$W"
else
	W=$(mktemp -d)
	trap 'rm -rf "$W"' EXIT
fi
command -v uftrace >/dev/null || quick=1
export LC_ALL=C TZ=UTC

# ---- workloads: setup_NAME DIR prepares the inputs, cmds_NAME prints the runs
# (one a line: ARGS of the binary bin_NAME; a line starting with ~ has counts
# that depend on timing).
bin_python3=/usr/bin/python3.11
cmds_python3() {
	echo '-c import json,re; d=[{"k":i,"v":str(i)*3} for i in range(3000)]; s=json.dumps(d); print(len(s), len(re.findall(r"[0-9]+", s)), sum(x["k"] for x in json.loads(s)))'
	echo '-c import collections; c=collections.Counter(w for w in open("words.txt").read().split()); print(c.most_common(5))'
}
setup_python3() { words "$1/words.txt"; }

bin_sqlite3=/usr/bin/sqlite3
cmds_sqlite3() { echo "-batch db.sqlite .read:work.sql"; }
setup_sqlite3() {
	cat >"$1/work.sql" <<-'SQL'
		create table t(id integer primary key, k text, v integer);
		with recursive n(i) as (select 1 union all select i + 1 from n where i < 5000)
		insert into t(k, v) select printf('key%05d', i), (i * 7919) % 1000 from n;
		create index tv on t(v);
		select count(*), sum(v), min(k), max(k) from t;
		select v, count(*) from t group by v order by count(*) desc, v limit 5;
		update t set v = v + 1 where id % 3 = 0;
		delete from t where v > 900;
		select count(*), sum(v) from t;
	SQL
}

bin_git=/usr/bin/git
cmds_git() {
	echo "-C r add -A"
	echo "-C r commit -q -m first"
	echo "-C r log --format=%H%n%an%n%s"
	echo "-C r diff --stat HEAD~0"
	echo "-C r show --stat --format=%s HEAD"
}
setup_git() {
	mkdir -p "$1/r" && words "$1/r/a.txt" && seq 1 3000 >"$1/r/b.txt" &&
		git -C "$1/r" init -q && git -C "$1/r" config user.name probekit &&
		git -C "$1/r" config user.email p@k
}

bin_bash=/usr/bin/bash
cmds_bash() { echo "work.sh"; }
setup_bash() {
	cat >"$1/work.sh" <<-'SH'
		f() { local s=0 i; for ((i = 0; i < $1; i++)); do s=$(( (s + i * i) % 100003 )); done; echo "$s"; }
		declare -A h; for w in $(<words.txt); do h[$w]=$(( ${h[$w]:-0} + 1 )); done
		echo "${#h[@]} words"; f 20000; x=""; for i in {1..300}; do x+="${i:0:1}"; done; echo "${#x}"
		printf '%s\n' "${!h[@]}" | sort | head -3
	SH
	words "$1/words.txt"
}

bin_coreutils=/usr/bin/sort
cmds_coreutils() {
	echo "words.txt"
	echo "-n -r nums.txt"
	echo "-u -f words.txt"
}
setup_coreutils() { words "$1/words.txt" && seq 1 7 20000 | sort -R --random-source=/dev/zero >"$1/nums.txt"; }

bin_redis=/usr/bin/redis-server
cmds_redis() { echo "~redis"; }
setup_redis() { :; }

# words FILE: 4,000 pseudo-random words (deterministic).
words() { awk 'BEGIN { srand(7); for (i = 0; i < 4000; i++) { w = ""; n = 2 + int(rand() * 6); for (j = 0; j < n; j++) w = w sprintf("%c", 97 + int(rand() * 8)); print w } }' >"$1"; }

# redis: the server under TOOL, a session of redis-cli (not traced) against
# it, then SHUTDOWN; stdout is the session's.
redis_session() { # PORT
	local p=$1 i
	for i in $(seq 1 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.05; done
	{
		for i in $(seq 1 300); do echo "SET k$i v$i"; done
		echo "INCRBY n 5"; echo "LPUSH l a b c"; echo "LRANGE l 0 -1"; echo "DBSIZE"; echo "GET k77"
	} | redis-cli -p "$p"
	redis-cli -p "$p" shutdown nosave >/dev/null 2>&1
	return 0
}

# run NAME TOOL N ARGS: one run under TOOL (plain|pk|uf) in $R/TOOL.N
run() {
	local name=$1 tool=$2 n=$3 args=$4 bin d pre=()
	bin=bin_$name
	bin=${!bin}
	d=$R/$tool.$n
	rm -rf "$d" && mkdir -p "$d" && "setup_$name" "$d" || return 1
	case $tool in
	# shellcheck disable=SC2086 # DISTRO_TRACE_OPTS are words
	pk) pre=("$PROBEKIT" trace --relocate ${DISTRO_TRACE_OPTS:-} -o "$R/pk.t/$n.trace" --) ;;
	uf) pre=(uftrace record --no-libcall -P . -d "$R/uf.t/$n") ;;
	esac
	if [[ $name == redis ]]; then
		local port=$((20000 + RANDOM % 20000))
		(cd "$d" && "${pre[@]}" "$bin" --port "$port" --save "" --appendonly no \
			>"$R/$tool.$n.log" 2>&1) &
		local pid=$!
		redis_session "$port" >"$R/$tool.$n.out" 2>/dev/null
		wait "$pid"
		echo $? >"$R/$tool.$n.rc"
		return 0
	fi
	# shellcheck disable=SC2086 # ARGS are words (but python's -c takes the rest)
	if [[ $args == -c\ * ]]; then
		(cd "$d" && "${pre[@]}" "$bin" -c "${args#-c }" </dev/null >"$R/$tool.$n.out" 2>"$R/$tool.$n.err")
	else
		(cd "$d" && "${pre[@]}" "$bin" ${args//:/ } </dev/null >"$R/$tool.$n.out" 2>"$R/$tool.$n.err")
	fi
	echo $? >"$R/$tool.$n.rc"
}

one() {
	local name=$1 bin st=0 n=0 line args det=() sched=()
	bin=bin_$name
	bin=${!bin}
	[[ -x $bin ]] || { echo "distro: $name: $bin not installed" >&2; return 77; }
	[[ $name == redis ]] && ! command -v redis-cli >/dev/null && { echo "distro: redis: no redis-cli" >&2; return 77; }
	R=$W/$name
	rm -rf "$R" && mkdir -p "$R/pk.t" "$R/uf.t"
	while IFS= read -r line; do
		n=$((n + 1))
		args=${line#\~}
		if [[ $line == \~* ]]; then sched+=("$n"); else det+=("$n"); fi
		run "$name" plain "$n" "$args"
		run "$name" pk "$n" "$args"
		((quick)) || run "$name" uf "$n" "$args"
	done < <("cmds_$name")
	local same=yes i
	for ((i = 1; i <= n; i++)); do
		cmp -s "$R/plain.$i.rc" "$R/pk.$i.rc" && cmp -s "$R/plain.$i.out" "$R/pk.$i.out" || same=NO
	done
	[[ $same == yes ]] || st=1
	# (each run's session: its first file, with its children's and exec'd programs')
	for f in "$R"/pk.t/*.trace; do
		[[ -f $f ]] && "$PROBEKIT" report --raw "$f" >"$f.rep" 2>/dev/null
	done
	local ev lost
	ev=$(cat "$R"/pk.t/*.rep 2>/dev/null | sed -n 's/^# .*: pid .* \([0-9]*\) events, \([0-9]*\) lost.*/\1/p' | awk '{ s += $1 } END { print s + 0 }')
	lost=$(cat "$R"/pk.t/*.rep 2>/dev/null | sed -n 's/^# .*: pid .* \([0-9]*\) events, \([0-9]*\) lost.*/\2/p' | awk '{ s += $1 } END { print s + 0 }')
	echo
	echo "== $name ($bin, $n run(s))"
	echo "probekit trace --relocate: exit status and stdout as plain: $same; events $ev, lost $lost"
	((quick)) && return $st
	for d in "$R"/uf.t/*/; do uftrace report -d "$d" -f call --no-pager --demangle=no >"${d%/}.rep" 2>/dev/null; done
	counts() { # LABEL JUDGED RUN...
		local label=$1 judged=$2 pkf=() uff=()
		shift 2
		for i; do pkf+=("$R"/pk.t/"$i".trace*.rep) uff+=("$R/uf.t/$i.rep"); done
		rp probekit "${pkf[@]}" >"$R/pk.$label.counts"
		rp uftrace "${uff[@]}" >"$R/uf.$label.counts"
		rp compare "$R/pk.$label.counts" "$R/uf.$label.counts" - "$repo/tests/realprog/known-distro.txt" \
			>"$R/compare.$label.txt"
		grep '^uftrace' "$R/compare.$label.txt" | sed "s/^uftrace  */uftrace -P . ($label) /"
		sed -n '2,20p' "$R/compare.$label.txt"
		((judged)) && ! grep -q '^uftrace .* different *0 ' "$R/compare.$label.txt" && st=1
		return 0
	}
	((${#det[@]})) && counts judged 1 "${det[@]}"
	((${#sched[@]})) && counts "timing-dependent, not judged" 0 "${sched[@]}"
	return $st
}

status=0 ran=0
for p in "${progs[@]}"; do
	declare -F "cmds_$p" >/dev/null || { echo "distro: unknown program $p" >&2; exit 2; }
	one "$p"
	case $? in
	0) ran=1 ;;
	77) ;;
	*) ran=1 status=1 ;;
	esac
done
((ran)) || exit 77
exit $status
