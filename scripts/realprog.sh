#!/usr/bin/env bash
# probekit trace on real programs nobody here wrote: lua, zstd and sqlite,
# from Debian's source packages.  Each is built three ways with the same
# flags ($RP_CFLAGS): plain, with -fpatchable-function-entry=5 (traced by
# probekit and by uftrace), and with -finstrument-functions linked with
# tests/realprog/cygcount.c (a call counter: the reference).  A workload of
# the program's own runs under each; the script checks that exit status,
# stdout and the files written are the plain run's, and compares the
# per-function call counts of `probekit report` with `uftrace report` (same
# binary) and with the counter.  The plain build is also traced with
# --relocate (prologue relocation: no patchable entries, and gcc's -fipa-ra
# on, as in any distribution binary), its counts compared the same way
# (uftrace: -P . on the same plain binary).  Prints one table per program.
#
# usage: scripts/realprog.sh [-s SCALE] [-q] [PROG...]   (default: lua zstd sqlite)
#   -s SCALE   workload size (1: CI-sized, default 2: lua 13 M events, zstd
#              130 M in 9 runs, sqlite 14 M)
#   -q         quick: no uftrace runs
# leveldb (db_bench) can be named too; its counts are not judged (its
# compaction thread makes them depend on scheduling).
#
# Environment: RP_DIR (cache: sources, builds, runs; default build/realprog),
# PROBEKIT (default build/cli/probekit), RP_CFLAGS, JOBS (parallel compiles),
# RP_TRACE_ARGS (more options of probekit trace, e.g. -b EVENTS).
# Sources come from Debian's archive through a private apt state under
# $RP_DIR/apt (no root needed, the system's apt configuration is not
# touched); `apt-get source --download-only` checks them against the signed
# Sources index.  Builds are cached (rebuilt when RP_CFLAGS change).
#
# Exit status: 0 when every program ran with identical results under
# probekit and its counts equal the -finstrument-functions counter's; 1 when
# not; 77 when no program could be built (no sources: the reason is printed).
# uftrace's differences are reported, not judged (uftrace itself crashes lua,
# or misses its longjmps; see doc/testing.md "Real programs").
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
tests=$repo/tests/realprog
RP_DIR=${RP_DIR:-$repo/build/realprog}
PROBEKIT=${PROBEKIT:-$repo/build/cli/probekit}
# Same flags for every variant.  Chosen so that a function's calls are the
# same in the binary probekit patches and in the source-level counts of
# -finstrument-functions: no inlining of functions not marked always_inline
# (-finstrument-functions counts inlined copies too), no identical-code
# folding (two functions, one address), and no pure/const discovery (gcc
# removes or merges calls to a function it finds pure, e.g. sqlite3LogEst,
# which it cannot do once the function calls __cyg_profile_func_enter).
RP_CFLAGS=${RP_CFLAGS:--O2 -fno-inline -fno-ipa-icf -fno-ipa-pure-const -fno-ipa-modref -g0}
RP_CFLAGS_CLANG=${RP_CFLAGS_CLANG:--O2 -fno-inline -g0}
JOBS=${JOBS:-2}
RP_TRACE_ARGS=${RP_TRACE_ARGS:-}
scale=2 quick=0
while getopts s:q o; do
	case $o in
	s) scale=$OPTARG ;;
	q) quick=1 ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
progs=("$@")
((${#progs[@]})) || progs=(lua zstd sqlite)
mkdir -p "$RP_DIR" || exit 1
RP_DIR=$(cd "$RP_DIR" && pwd)
PROBEKIT=$(realpath "$PROBEKIT")
rp() { python3 "$tests/rp.py" "$@"; }
say() { echo "realprog: $*" >&2; }

# ---- sources --------------------------------------------------------------
declare -A debpkg=([lua]=lua5.4 [zstd]=libzstd [sqlite]=sqlite3 [leveldb]=leveldb)
# apt_private ARGS...: apt-get with a state of its own holding only the
# deb-src lines of the system's Debian release.
apt_private() {
	local a=$RP_DIR/apt codename
	if [[ ! -f $a/parts/src.sources ]]; then
		codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
		[[ -n $codename ]] || return 1
		mkdir -p "$a"/{parts,lists/partial,cache/archives/partial}
		cat >"$a/parts/src.sources" <<-EOF
			Types: deb-src
			URIs: http://deb.debian.org/debian
			Suites: $codename $codename-updates
			Components: main
			Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
		EOF
	fi
	apt-get -q -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$a/parts" \
		-o Dir::State::Lists="$a/lists" -o Dir::Cache="$a/cache" \
		-o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)" "$@"
}
# tarball PKG: the upstream tarball of Debian source package PKG in dl/, if any
# (not its signature, not sqlite3's orig-www documentation).
tarball() {
	local t
	for t in "$RP_DIR/dl/${1}_"*.orig.tar.*; do
		[[ -f $t && $t != *.asc ]] && { echo "$t"; return 0; }
	done
	return 1
}
# orig NAME: the path of NAME's upstream tarball, downloaded if missing.
orig() {
	local p=${debpkg[$1]} f
	f=$(tarball "$p")
	if [[ -z $f ]]; then
		mkdir -p "$RP_DIR/dl"
		if ! ls "$RP_DIR/apt/lists/"*Sources* >/dev/null 2>&1; then
			apt_private update >"$RP_DIR/apt-update.log" 2>&1 ||
				{ say "apt-get update (deb-src) failed: $(tail -1 "$RP_DIR/apt-update.log")"; return 1; }
		fi
		(cd "$RP_DIR/dl" && apt_private source --download-only "$p") >"$RP_DIR/dl/$p.log" 2>&1 ||
			{ say "apt-get source $p failed: $(tail -1 "$RP_DIR/dl/$p.log")"; return 1; }
		f=$(tarball "$p")
	fi
	[[ -n $f ]] && echo "$f"
}
# unpack NAME: $RP_DIR/NAME/src holds the upstream tree.
unpack() {
	local d=$RP_DIR/$1/src f
	[[ -f $d/.done ]] && return 0
	f=$(orig "$1") || return 1
	rm -rf "$d" && mkdir -p "$d" && tar -xf "$f" -C "$d" --strip-components=1 && touch "$d/.done"
}

# ---- builds ---------------------------------------------------------------
# build NAME VARIANT "CPPFLAGS" "LIBS" FILE...: compile FILE... (relative to
# the source tree) with $RP_CFLAGS plus the variant's flags into
# $RP_DIR/NAME/VARIANT/NAME.  Cached by a stamp of the flags.
build() {
	local name=$1 var=$2 cpp=$3 libs=$4 src=$RP_DIR/$1/src out=$RP_DIR/$1/$2 vflags="" extra=""
	shift 4
	case $var in
	pfe) vflags=-fpatchable-function-entry=5 ;;
	cyg) vflags=-finstrument-functions extra=$out/cygcount.o ;;
	esac
	# leveldb: clang++, because gcc 12 puts the site of an inline C++
	# function (a COMDAT section) in __patchable_function_entries outside its
	# group, and ld, gold and lld refuse the discarded duplicates.  Same flags
	# as the others where clang has them.
	local cc=gcc ld=gcc flags=$RP_CFLAGS
	[[ $name == leveldb ]] && cc=clang++ ld=clang++ flags=$RP_CFLAGS_CLANG
	local stamp
	stamp="$flags $vflags $cpp $libs $(md5sum "$tests/cygcount.c" | cut -c1-8)"
	[[ -x $out/$name && $(cat "$out/.stamp" 2>/dev/null) == "$stamp" ]] && return 0
	rm -rf "$out" && mkdir -p "$out/obj"
	[[ $var == cyg ]] && { gcc $RP_CFLAGS -c "$tests/cygcount.c" -o "$out/cygcount.o" || return 1; }
	(cd "$src" && printf '%s\n' "$@" | xargs -P "$JOBS" -I{} sh -c \
		'$3 $0 -c "$1" -o "$2/obj/$(echo "$1" | tr / _).o"' "$flags $vflags $cpp" {} "$out" "$cc") ||
		{ say "$name/$var: compile failed"; return 1; }
	$ld -o "$out/$name" "$out"/obj/*.o $extra $libs || { say "$name/$var: link failed"; return 1; }
	echo "$stamp" >"$out/.stamp"
}

prepare_lua() {
	unpack lua || return 1
	local f=()
	for s in "$RP_DIR"/lua/src/src/*.c; do [[ $s == */luac.c ]] || f+=("src/${s##*/}"); done
	for v in plain pfe cyg; do
		build lua $v "-DLUA_COMPAT_5_3 -DLUA_USE_LINUX -Dluai_makeseed(L)=42u -DSTRCACHE_N=1 -DSTRCACHE_M=2" "-Wl,-E -lm -ldl" "${f[@]}" || return 1
	done
}
prepare_zstd() {
	unpack zstd || return 1
	local f
	mapfile -t f < <(cd "$RP_DIR/zstd/src" && ls lib/common/*.c lib/compress/*.c lib/decompress/*.c \
		lib/decompress/*.S lib/dictBuilder/*.c programs/*.c)
	for v in plain pfe cyg; do
		build zstd $v "-Ilib -Ilib/common -Iprograms -DZSTD_MULTITHREAD -pthread -DZSTD_LEGACY_SUPPORT=0 -DBACKTRACE_ENABLE=0" \
			"-pthread" "${f[@]}" || return 1
	done
}
prepare_sqlite() {
	unpack sqlite || return 1
	local s=$RP_DIR/sqlite/src
	if [[ ! -f $s/sqlite3.c || ! -f $s/shell.c ]]; then
		if ! command -v tclsh >/dev/null; then
			if [[ $(id -u) == 0 ]]; then
				DEBIAN_FRONTEND=noninteractive apt-get install -y -q tcl >/dev/null 2>&1
			fi
			command -v tclsh >/dev/null ||
				{ say "sqlite: tclsh (Debian package tcl) is needed to make the amalgamation"; return 1; }
		fi
		(cd "$s" && ./configure --disable-tcl --disable-readline >configure.log 2>&1 &&
			make -j"$JOBS" sqlite3.c shell.c >make.log 2>&1) ||
			{ say "sqlite: making the amalgamation failed (see $s/make.log)"; return 1; }
	fi
	for v in plain pfe cyg; do
		build sqlite $v "-DSQLITE_THREADSAFE=1 -DSQLITE_OMIT_LOAD_EXTENSION -I." "-lpthread -lm" \
			sqlite3.c shell.c || return 1
	done
}

prepare_leveldb() {
	unpack leveldb || return 1
	local s=$RP_DIR/leveldb/src f
	# util/testutil.h (random strings for db_bench) includes gmock's header.
	[[ -f /usr/include/gmock/gmock.h ]] ||
		{ say "leveldb: db_bench needs gmock's headers (Debian package libgmock-dev)"; return 1; }
	mkdir -p "$RP_DIR/leveldb/cfg/port"
	printf '#define HAVE_%s\n' "FDATASYNC 1" "FULLFSYNC 0" "O_CLOEXEC 1" "CRC32C 0" "SNAPPY 0" \
		>"$RP_DIR/leveldb/cfg/port/port_config.h"
	# shellcheck disable=SC2010 # known names
	mapfile -t f < <(cd "$s" && ls db/*.cc table/*.cc util/*.cc helpers/memenv/*.cc benchmarks/db_bench.cc |
		grep -v -e _test.cc -e windows -e testharness -e leveldbutil)
	for v in plain pfe cyg; do
		build leveldb $v "-std=c++11 -DNDEBUG -DLEVELDB_PLATFORM_POSIX=1 -DLEVELDB_IS_BIG_ENDIAN=0 -I. -Iinclude -I$RP_DIR/leveldb/cfg" \
			"-pthread" "${f[@]}" || return 1
	done
}

# ---- workloads: one command a line, "STDIN ARGS..." ------------------------
# A STDIN starting with ~ marks a run whose call counts depend on scheduling
# (threads): its counts are compared and printed apart, not judged.
workload_lua() { echo "/dev/null $tests/work.lua $scale"; }
zstd_data() {
	local d=$RP_DIR/zstd/data.$scale
	# SCALE/2 MB of text: zstd's own sources, repeated as needed.
	if [[ ! -f $d ]]; then
		for ((i = 0; i < scale; i++)); do
			find "$RP_DIR/zstd/src/lib" "$RP_DIR/zstd/src/programs" -name '*.[ch]' | LC_ALL=C sort | xargs cat
		done 2>/dev/null | head -c $((scale << 19)) >"$d"
	fi
	echo "$d"
}
workload_zstd() {
	local d l
	d=$(zstd_data)
	for l in 1 3 9; do
		echo "/dev/null -q -f -$l $d -o c$l.zst"
		echo "/dev/null -q -d -f c$l.zst -o d$l"
	done
	# Two workers, jobs of 512 KiB (the smallest): SCALE jobs.
	# How many jobs run at once, and so how many compression contexts the
	# workers create and how often a full queue refuses a job, depends on
	# scheduling.
	# shellcheck disable=SC2088 # a marker, not a home directory
	echo "~/dev/null -q -f -T2 -B512KiB -6 $d -o t.zst"
	echo "/dev/null -q -d -f t.zst -o dt"
	echo "/dev/null -q -t c1.zst c3.zst c9.zst t.zst"
}
workload_sqlite() {
	sed "s/@ROWS@/$((5000 * scale))/g" "$tests/work.sql" >"$RP_DIR/sqlite/work.$scale.sql"
	echo "$RP_DIR/sqlite/work.$scale.sql -batch db"
}

# leveldb: db_bench, the benchmark that comes with it (deterministic keys and
# values).  Its background compaction thread runs when scheduling lets it,
# which changes what the foreground does: counts not judged.  Its stdout
# holds timings (only the benchmark names are compared) and its LOG file
# timestamps (the files are not compared).
workload_leveldb() {
	# shellcheck disable=SC2088 # a marker, not a home directory
	echo "~/dev/null --benchmarks=fillseq,fillrandom,overwrite,readseq,readrandom,deleterandom --num=$((2000 * scale)) --db=db"
}
out_filter_leveldb() { awk '/^[a-z]+ +:/ { print $1 }'; }
no_files_leveldb() { :; }

# ---- runs -----------------------------------------------------------------
# rel NAME: the plain build, copied to a path as long as pfe's and cyg's (a
# program may see its own path: lua's arg[0], interned only when short).
rel() {
	local d=$RP_DIR/$1/rel
	cmp -s "$RP_DIR/$1/plain/$1" "$d/$1" ||
		{ mkdir -p "$d" && cp "$RP_DIR/$1/plain/$1" "$d/$1"; }
	echo "$d/$1"
}

# runall NAME TOOL: every command of NAME's workload under TOOL
# (plain|pk|uf|ufe|cyg, and on the plain build pkr: probekit trace
# --relocate, ufr: uftrace record -P .) in a fresh directory $R/TOOL; stats
# in $R/TOOL.stats.
runall() {
	local name=$1 tool=$2 i=0 in args
	local w=$R/$tool
	rm -rf "$w" "$R/$tool.stats" "$R/$tool.t" && mkdir -p "$w" "$R/$tool.t"
	while read -r in args; do
		i=$((i + 1))
		in=${in#\~}
		case $tool in
		plain) set -- "$RP_DIR/$name/plain/$name" ;;
		pk) set -- "$PROBEKIT" trace $RP_TRACE_ARGS -o "$R/pk.t/$i.trace" -- "$RP_DIR/$name/pfe/$name" ;;
		pkr) set -- "$PROBEKIT" trace --relocate $RP_TRACE_ARGS -o "$R/pkr.t/$i.trace" -- "$(rel "$name")" ;;
		ufr) set -- uftrace record --no-libcall -P . -d "$R/ufr.t/$i" "$(rel "$name")" ;;
		uf) set -- uftrace record --no-libcall -P . -d "$R/uf.t/$i" "$RP_DIR/$name/pfe/$name" ;;
		ufe) set -- uftrace record --no-libcall -e -P . -d "$R/ufe.t/$i" "$RP_DIR/$name/pfe/$name" ;;
		cyg) set -- env CYGCOUNT_OUT="$R/cyg.t/$i.cnt" "$RP_DIR/$name/cyg/$name" ;;
		esac
		# shellcheck disable=SC2086 # ARGS are words
		(cd "$w" && rp run "$R/$tool.stats" "$R/$tool.t/$i.out" "$R/$tool.t/$i.err" "$in" -- "$@" $args)
	done < <("workload_$name")
	# Traces and uftrace's data are outside $w: only the program's files remain.
}
# same TOOL: TOOL's runs gave plain's exit statuses, stdout and files.
same() {
	local t=$1 n i
	[[ $(cut -d' ' -f1 "$R/$t.stats") == $(cut -d' ' -f1 "$R/plain.stats") ]] || return 1
	n=$(wc -l <"$R/plain.stats")
	local filter=cat
	declare -F "out_filter_$cur" >/dev/null && filter=out_filter_$cur
	for ((i = 1; i <= n; i++)); do
		cmp -s <($filter <"$R/$t.t/$i.out") <($filter <"$R/plain.t/$i.out") || return 1
	done
	declare -F "no_files_$cur" >/dev/null || diff -r -q "$R/$t" "$R/plain" >/dev/null
}
sum_col() { awk -v c="$2" '{ s += $c } END { printf "%.3f", s }' "$1"; }
max_col() { awk -v c="$2" '$c > m { m = $c } END { printf "%.1f", m / 1024 }' "$1"; }

# attached NAME (lua): `probekit trace -p` on the patchable build while it
# runs tests/realprog/attach.NAME, attached while it waits for its first
# line (one of 2 bytes: run the workload) and detached while it waits for
# its second; the trace's counts against the counter's, (run, end) +
# (skip, more, end) - 2 x (skip, end) (the script says why), and its stdout
# the counter's (run, end).  Returns 1 on a difference, including a
# function on one side only (a call missed, or one from outside the window).
attached() {
	local name=$1 d=$R/attach k i=0 pid pkpid rc pkrc in
	local script=$tests/attach.$name work=$tests/work.$name bin=$RP_DIR/$1/pfe/$1
	rm -rf "$d" && mkdir -p "$d" || return 1
	for in in 'qx jzq' 'qxv jzq' 'qxv kqxjv jzq'; do
		i=$((i + 1))
		tr ' ' '\n' <<<"$in" >"$d/in$i"
		(cd "$d" && CYGCOUNT_OUT="$d/ref$i.cnt" "$RP_DIR/$name/cyg/$name" "$script" "$work" \
			<"$d/in$i" >"$d/ref$i.out" 2>"$d/ref$i.err")
	done
	# WAITS-th "waiting" printed, and the program in read(0, ...) (60 s at most).
	waiting() {
		for ((k = 0; k < 6000; k++)); do
			[[ $(grep -c '^waiting$' "$d/att.out") -ge $1 &&
				$(cut -d' ' -f1,2 "/proc/$pid/syscall" 2>/dev/null) == "0 0x0" ]] && return 0
			sleep 0.01
		done
		return 1
	}
	mkfifo "$d/fifo" || return 1
	(cd "$d" && exec "$bin" "$script" "$work" <"$d/fifo" >"$d/att.out" 2>"$d/att.err") &
	pid=$!
	exec 7>"$d/fifo"
	waiting 1 || { say "$name attached: never waited for its first line"; exec 7>&-; return 1; }
	# (the program's own functions, which -finstrument-functions counts)
	"$PROBEKIT" trace -p "$pid" --no-libcall -o "$d/att.trace" 2>"$d/pk.err" &
	pkpid=$!
	for ((k = 0; k < 6000; k++)); do grep -q 'recording until' "$d/pk.err" && break; sleep 0.01; done
	echo qx >&7
	waiting 2 || say "$name attached: never waited for its second line"
	kill -INT "$pkpid"
	wait "$pkpid"
	pkrc=$?
	echo jzq >&7
	exec 7>&-
	wait "$pid"
	rc=$?
	"$PROBEKIT" report --raw "$d/att.trace" >"$d/att.rep" 2>&1
	rp probekit "$d/att.rep" >"$d/att.counts"
	for i in 1 2 3; do rp cyg "$R/cyg.nm" "$d/ref$i.cnt" >"$d/ref$i.counts"; done
	rp sum "$d/ref1.counts:1" "$d/ref3.counts:1" "$d/ref2.counts:-2" >"$d/ref.counts"
	echo "attached (probekit trace -p while it ran tests/realprog/attach.$name): exit status $rc," \
		"probekit's $pkrc, stdout $(cmp -s "$d/att.out" "$d/ref1.out" && echo identical || echo DIFFERENT)," \
		"$(grep -m1 -o '[0-9]* events, [0-9]* lost, ended at [a-z]*' "$d/att.rep")"
	cat "$tests/known.txt" "$tests/known-attach.txt" >"$d/known.txt"
	rp compare "$d/att.counts" - "$d/ref.counts" "$d/known.txt" >"$d/compare.txt"
	sed 's/^/  /' "$d/compare.txt"
	[[ $rc == 0 && $pkrc == 0 ]] && cmp -s "$d/att.out" "$d/ref1.out" &&
		grep -q 'ended at detach' "$d/att.rep" &&
		grep -q '^instrument-functions .* different *0 .* only probekit *0 *only instrument *0$' "$d/compare.txt"
}

# one NAME: prepare, run, compare, print the table; returns 1 on a difference.
one() {
	local name=$1 st=0 uft=uf note=""
	cur=$name
	R=$RP_DIR/$name/runs
	mkdir -p "$R"
	say "$name: building"
	"prepare_$name" || return 77
	say "$name: running (scale $scale)"
	for t in plain pk pkr cyg; do runall "$name" $t; done
	((quick)) || runall "$name" ufr
	if ((!quick)); then
		runall "$name" uf
		# uftrace stops recording past a depth of 1024 (lua: its longjmps
		# out of error() are not seen with --no-libcall).
		if ! same uf || grep -q 'call depth beyond' "$R"/uf.t/*.err; then
			note="uftrace record -P . broke the program or its recording (exit $(cut -d' ' -f1 "$R/uf.stats" | tr '\n' ' ')$(grep -h -m1 -o 'call depth beyond [0-9]*' "$R"/uf.t/*.err | head -1)); counts from uftrace record -e (entries only)"
			runall "$name" ufe
			uft=ufe
			same ufe || note="$note; uftrace -e changed the program's output too: uftrace counts not comparable"
		fi
	fi
	local pk_ok=yes pkr_ok=yes cyg_ok=yes
	same pk || { pk_ok=NO st=1; }
	same pkr || { pkr_ok=NO st=1; }
	same cyg || cyg_ok=NO

	ls "$R"/pk.t/*.trace* >/dev/null 2>&1 || { say "$name: no trace written"; return 1; }
	# (each run's session: its first file, with its children's and exec'd programs')
	for f in "$R"/pk.t/*.trace "$R"/pkr.t/*.trace; do
		[[ -f $f ]] && "$PROBEKIT" report --raw "$f" >"$f.rep" 2>/dev/null
	done
	local ev lost
	ev=$(cat "$R"/pk.t/*.rep | sed -n 's/^# .*: pid .* \([0-9]*\) events, \([0-9]*\) lost.*/\1/p' | awk '{ s += $1 } END { print s + 0 }')
	lost=$(cat "$R"/pk.t/*.rep | sed -n 's/^# .*: pid .* \([0-9]*\) events, \([0-9]*\) lost.*/\2/p' | awk '{ s += $1 } END { print s + 0 }')
	local ufc=-
	if ((!quick)); then
		for d in "$R/$uft.t"/*/ "$R/ufr.t"/*/; do uftrace report -d "$d" -f call --no-pager --demangle=no >"${d%/}.rep" 2>/dev/null; done
		ufc=$R/uf.counts
	fi
	nm -n "$RP_DIR/$name/cyg/$name" >"$R/cyg.nm"
	# The counts of the deterministic runs (judged), then of the others.
	local det=() sched=() n=0 in args
	while read -r in args; do
		n=$((n + 1))
		if [[ $in == \~* ]]; then sched+=("$n"); else det+=("$n"); fi
	done < <("workload_$name")
	counts() { # SUFFIX RUN...
		local sfx=$1 i pkf=() pkrf=() uff=() ufrf=() cyf=()
		shift
		for i; do
			pkf+=("$R"/pk.t/"$i".trace*.rep) uff+=("$R/$uft.t/$i.rep") cyf+=("$R/cyg.t/$i.cnt")
			pkrf+=("$R"/pkr.t/"$i".trace*.rep) ufrf+=("$R/ufr.t/$i.rep")
		done
		rp probekit "${pkf[@]}" >"$R/pk$sfx.counts"
		rp probekit "${pkrf[@]}" >"$R/pkr$sfx.counts"
		((quick)) || rp uftrace "${uff[@]}" >"$R/uf$sfx.counts"
		((quick)) || rp uftrace "${ufrf[@]}" >"$R/ufr$sfx.counts"
		rp cyg "$R/cyg.nm" "${cyf[@]}" >"$R/cyg$sfx.counts"
	}
	((${#det[@]})) && counts "" "${det[@]}"
	((${#sched[@]})) && counts .sched "${sched[@]}"

	echo
	echo "== $name ($(wc -l <"$R/plain.stats") run(s), scale $scale, $([[ $name == leveldb ]] && echo "clang++ $RP_CFLAGS_CLANG" || echo "$RP_CFLAGS"))"
	echo "identical exit status, stdout, files: probekit $pk_ok, probekit --relocate $pkr_ok, instrument-functions $cyg_ok"
	[[ -n $note ]] && echo "note: $note"
	echo "probekit events recorded $ev, lost $lost"
	((lost)) && echo "note: probekit lost $lost events (buffers full): its counts fall short by the calls in them"
	printf '%-22s %10s %10s %10s\n' "" "peak MB" "wall s" "x plain"
	local pw
	pw=$(sum_col "$R/plain.stats" 2)
	local -A label=([plain]=plain [pk]="probekit trace" [uf]="uftrace record" [ufe]="uftrace record -e"
		[cyg]=instrument-functions [pkr]="probekit --relocate" [ufr]="uftrace -P . (plain)")
	for t in plain pk uf ufe cyg pkr ufr; do
		[[ -f $R/$t.stats ]] || continue
		[[ $t == uf* ]] && ((quick)) && continue
		[[ $t == ufe && $uft != ufe ]] && continue
		local w
		w=$(sum_col "$R/$t.stats" 2)
		printf '%-22s %10s %10s %10s\n' "${label[$t]}" "$(max_col "$R/$t.stats" 3)" "$w" \
			"$(awk -v a="$w" -v b="$pw" 'BEGIN { printf "%.1f", (b + 0 > 0) ? a / b : 0 }')"
	done
	if ((${#det[@]})); then
		((${#sched[@]})) && echo "runs ${det[*]}:"
		rp compare "$R/pk.counts" "$ufc" "$R/cyg.counts" "$tests/known.txt" >"$R/compare.txt"
		cat "$R/compare.txt"
		# Only the counter is judged: uftrace's failures are its own.
		grep -q '^instrument-functions .* different *0 ' "$R/compare.txt" || st=1
		local ufrc=-
		((quick)) || ufrc=$R/ufr.counts
		echo "the plain build (-fipa-ra, no patchable entries) under probekit trace --relocate:"
		rp compare "$R/pkr.counts" "$ufrc" "$R/cyg.counts" "$tests/known.txt" >"$R/compare-reloc.txt"
		sed 's/^/  /' "$R/compare-reloc.txt"
		grep -q '^instrument-functions .* different *0 ' "$R/compare-reloc.txt" || st=1
		if [[ -f $tests/attach.$name ]]; then
			attached "$name" || st=1
		fi
	fi
	if ((${#sched[@]})); then
		echo "runs ${sched[*]}, whose counts depend on scheduling (not judged):"
		rp compare "$R/pk.sched.counts" "${ufc/.counts/.sched.counts}" "$R/cyg.sched.counts" \
			"$tests/known.txt" | sed 's/^/  /'
	fi
	return $st
}

status=0 built=0
for p in "${progs[@]}"; do
	declare -F "prepare_$p" >/dev/null || { say "unknown program $p"; exit 2; }
	one "$p"
	r=$?
	case $r in
	0) built=1 ;;
	77) say "$p: skipped" ;;
	*) built=1 status=1 ;;
	esac
done
((built)) || exit 77
exit $status
