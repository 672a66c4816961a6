#!/usr/bin/env bash
# probekit watch against tests/targets/watch_target (4 threads x 5 calls of
# bump(), each one locked write to `counter`): the hits reported, --count,
# and PROG's stdout, exit status and death by signal unchanged; the errors.
# Page mode runs everywhere; the hardware cases where hits are delivered.
#
# With tests/targets/sigtrap_target: PROG's own SIGTRAP handler keeps its
# traps and its exit status, a thread that blocks SIGTRAP is counted.
#
# SECCOMP_EXEC runs a command with perf_event_open denied by seccomp.
#
# WATCH_TARGET_LEAF is watch_target built -O1: bump() has no frame.
#
# WATCH_PTR: a pointer global that points to heap objects, changed while
# it runs (tests/targets/watch_ptr.c), for *SYMBOL and --follow.
#
# WATCH_TARGET_NOFP: watch_target built -O2 -fomit-frame-pointer.
#
# HWBP_DELIVERED: tests/lib/hwbp_delivered.c (exit 0 where hits are delivered, 77 not).
#
# HOT_COUNTER: tests/targets/hot_counter.c, a counter bumped in a loop and
# fresh pages touched.  The ring path (doc/design/watch-ring.md) runs on
# every machine with its test switch PROBEKIT_RING_FAULTS (WR8: the
# program's page faults sampled instead of the breakpoint), and on the
# breakpoint itself where hits are delivered, against the signal path.
#
# usage: test-watch-cmd.sh PROBEKIT WATCH_TARGET SIGTRAP_TARGET SECCOMP_EXEC WATCH_TARGET_LEAF WATCH_PTR WATCH_TARGET_NOFP HWBP_DELIVERED HOT_COUNTER
set -uo pipefail
pk=$1 target=$2 strap=$3 secx=$4 leaf=$5 wptr=$6 nofp=$7 hwbp=$8 hot=$9
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Sanitizer builds: their runtime must be preloaded before the agent.
# The target prints how many LD_PRELOAD/PROBEKIT_ variables it sees: the
# user's LD_PRELOAD only, never the agent's.
nenv=0
if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then export LD_PRELOAD=$PKT_SAN_PRELOAD nenv=1; else unset LD_PRELOAD; fi
# PROBEKIT_HWBP_UNDELIVERED is the user's, kept for PROG (and its library).
[[ -n ${PROBEKIT_HWBP_UNDELIVERED+x} ]] && nenv=$((nenv + 1))
pass=0 fail=0

ok() { pass=$((pass + 1)); }
bad() {
	echo "FAIL: $*"
	for f in out err rep; do
		[[ -s $tmp/$f ]] && { echo "  --- $f:"; sed 's/^/    /' "$tmp/$f" | head -40; }
	done
	fail=$((fail + 1))
}

# run ARGS...: probekit watch ARGS, stdout to out, stderr to err; sets rc.
# Bounded: a run that spins (a trap loop) fails instead of hanging the suite.
run() {
	timeout -k 5 30 "$pk" watch "$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
}
# count REGEX FILE
count() { grep -Ec -- "$1" "$2"; }

# The reported instruction is the locked add itself (x86 traps after it: the
# agent decodes bump from its start to find it), at its offset in objdump.
dis=$(objdump -d --no-show-raw-insn "$target" | sed -n '/<bump>:$/,/^$/p')
bump_at=$(sed -n '1s/^0*\([0-9a-f]*\) .*/\1/p' <<<"$dis")
lock_at=$(grep -m1 lock <<<"$dis" | sed 's/^ *\([0-9a-f]*\):.*/\1/')
lock_off=
[[ -n $bump_at && -n $lock_at ]] && lock_off=$(printf '0x%x' $((0x$lock_at - 0x$bump_at)))
[[ -n $lock_off ]] || { echo "cannot find the locked add in bump (objdump)"; exit 1; }
hit_w='^ +[0-9]+\.[0-9]{6} tid [0-9]+ write counter: -?[0-9]+( \(0x[0-9a-f]+\))? -> -?[0-9]+( \(0x[0-9a-f]+\))? at bump\+'$lock_off'$'
hit_x='^ +[0-9]+\.[0-9]{6} tid [0-9]+ exec bump\+0x0$'

"$target" 3 >"$tmp/plain.out" 2>"$tmp/plain.err"
plain_rc=$?
[[ $plain_rc -eq 3 ]] && grep -qx "counter=20 env=$nenv" "$tmp/plain.out" ||
	bad "target alone: rc $plain_rc"


# Are hardware breakpoints delivered here (one armed on a private word, the
# word written: tests/lib/hwbp_delivered.h)?  Where not, the cases that need hits
# are skipped (exit 77 once the others pass) and the refusal is tested instead.
"$hwbp" >"$tmp/hw"
delivered=$?
[[ $delivered -eq 0 || $delivered -eq 77 ]] || { echo "hwbp_delivered: exit $delivered"; exit 1; }

# The cases that need delivered hits: the signal path's (values, handlers) ...
hit_cases() {
	# Every write, by the four workers, PROG's stdout and status untouched.
	run --path signal counter -- "$target" 3
	n=$(count "$hit_w" "$tmp/err")
	tids=$(grep -E "$hit_w" "$tmp/err" | awk '{print $3}' | sort -u | wc -l)
	if [[ $rc -eq 3 && $n -eq 20 && $tids -eq 4 ]] && cmp -s "$tmp/out" "$tmp/plain.out" &&
		grep -q '^target done$' "$tmp/err" && grep -q '^# 20 hit(s) printed, 0 lost$' "$tmp/err" &&
		grep -q 'watch_target exited with status 3$' "$tmp/err"; then ok; else
		bad "watch counter: rc $rc, $n hits, $tids threads"; fi

	# No worker tid is PROG's pid (the main thread never writes counter).
	run --path signal counter -- "$target" 0
	pid=$(grep -Eo 'tid [0-9]+' "$tmp/err" | head -1)
	[[ $rc -eq 0 && -n $pid ]] && ok || bad "watch counter, status 0: rc $rc"

	# --count stops early; PROG goes on and exits with its own status.
	run --path signal --count 3 counter -- "$target" 7
	n=$(count "$hit_w" "$tmp/err")
	if [[ $rc -eq 7 && $n -eq 3 ]] && grep -q '^# --count 3 reached' "$tmp/err" &&
		grep -qx "counter=20 env=$nenv" "$tmp/out"; then ok; else bad "--count 3: rc $rc, $n hits"; fi

	# -o FILE: the report is in FILE, PROG's stderr alone on stderr.
	run --path signal -o "$tmp/rep" counter -- "$target" 3
	n=$(count "$hit_w" "$tmp/rep")
	if [[ $rc -eq 3 && $n -eq 20 ]] && [[ $(cat "$tmp/err") == "target done" ]] &&
		cmp -s "$tmp/out" "$tmp/plain.out"; then ok; else bad "-o: rc $rc, $n hits in the file"; fi
	rm -f "$tmp/rep"

	# Execute watchpoint on a function: one hit per call, with its caller under --stack.
	run --path signal -t x bump -- "$target" 3
	n=$(count "$hit_x" "$tmp/err")
	[[ $rc -eq 3 && $n -eq 20 ]] && ok || bad "-t x bump: rc $rc, $n hits"
	run --path signal -t x --stack -c 2 bump -- "$target" 3
	n=$(count '^ +#1 worker\+0x[0-9a-f]+$' "$tmp/err")
	[[ $rc -eq 3 && $n -eq 2 ]] && ok || bad "-t x --stack: rc $rc, $n frames in worker"

	# --stack on a data watchpoint: the caller of bump is worker.
	run --path signal --stack -c 4 counter -- "$target" 3
	n=$(count '^ +#1 worker\+0x[0-9a-f]+$' "$tmp/err")
	[[ $rc -eq 3 && $n -eq 4 ]] && ok || bad "--stack: rc $rc, $n frames in worker"

	# --stack in a frameless leaf (-O1: bump pushes no frame): its caller worker
	# is found from the return address at the top of the stack, then the frame
	# chain; the C library's frame (stripped: no symbol) is named by its file,
	# or by its function and file where libc's debug file (libc6-dbg) is installed.
	run --path signal --stack -c 4 counter -- "$leaf" 3
	n=$(count '^ +#1 worker\+0x[0-9a-f]+$' "$tmp/err")
	m=$(count '^ +#2 (libc\.so\.6\+0x[0-9a-f]+|start_thread\+0x[0-9a-f]+ \(libc\.so\.6\))$' "$tmp/err")
	[[ $rc -eq 3 && $n -eq 4 && $m -eq 4 ]] && ok || bad "--stack, frameless leaf: rc $rc, $n frames in worker, $m in libc"

	# *SYMBOL: the object a pointer points to.  fixed -> target from the start:
	# poke()'s two writes.  cur is NULL before main(): refused without --follow;
	# with it, each of the 3 objects' field b (+8) is watched once cur points
	# to it: 3 x 3 writes in bump(), 3 moves said, and the program's output as
	# without probekit.
	run --path signal '*fixed' -- "$wptr"
	n=$(count '^ +[0-9.]+ tid [0-9]+ write \*fixed: [0-9]+ -> [0-9]+ at poke\+0x' "$tmp/err")
	[[ $rc -eq 0 && $n -eq 2 ]] && ok || bad "*fixed: rc $rc, $n hits in poke"
	"$wptr" >"$tmp/plain.out"
	run --follow '*cur+8' -- "$wptr"
	n=$(count '^ +[0-9.]+ tid [0-9]+ write \*cur\+8: [0-9]+ -> [0-9]+ at bump\+0x' "$tmp/err")
	m=$(count '^# tid [0-9]+: cur = 0x[0-9a-f]+ \(was (0|0x[0-9a-f]+)\) at main\+0x[0-9a-f]+: watching 8 byte\(s\) at 0x' "$tmp/err")
	v=$(grep -cE 'write \*cur\+8: (0 -> 1|1 -> 2|2 -> 3) ' "$tmp/err")
	[[ $rc -eq 0 && $n -eq 9 && $m -eq 3 && $v -eq 9 ]] && cmp -s "$tmp/out" "$tmp/plain.out" &&
		ok || bad "--follow '*cur+8': rc $rc, $n hits in bump, $m moves, $v values 0->1->2->3"

	# --stack without any frame pointer: the .eh_frame unwinder finds worker,
	# then the C library's thread start and clone3 (stripped: file+offset, or
	# named from libc6-dbg's debug file), as gdb's bt does.
	run --path signal --stack -c 2 counter -- "$nofp" 3
	n=$(count '^ +#1 worker\+0x[0-9a-f]+$' "$tmp/err")
	m=$(count '^ +#3 (libc\.so\.6\+0x[0-9a-f]+|clone3?\+0x[0-9a-f]+ \(libc\.so\.6\))$' "$tmp/err")
	[[ $rc -eq 3 && $n -eq 2 && $m -eq 2 ]] && ok || bad "--stack, no frame pointers: rc $rc, $n frames in worker, $m third frames in libc"

	# Reads and writes: the locked add both reads and writes; reported once per access trap.
	run --path signal -t rw -c 5 counter -- "$target" 3
	n=$(count '^ +[0-9.]+ tid [0-9]+ access counter: value ' "$tmp/err")
	[[ $rc -eq 3 && $n -eq 5 ]] && ok || bad "-t rw: rc $rc, $n hits"

	# Reads and writes, no --count: the agent's own read of the value in its
	# handler is not a hit (it looped: millions of hits for 20 writes).  One
	# hit per locked add, and one for main's read when it prints the counter.
	run --path signal -t rw counter -- "$target" 3
	n=$(count '^ +[0-9.]+ tid [0-9]+ access counter: value ' "$tmp/err")
	if [[ $rc -eq 3 && $n -eq 21 ]] && grep -q '^# 21 hit(s) printed, 0 lost$' "$tmp/err"; then ok; else
		bad "-t rw, every hit: rc $rc, $n hits"; fi

	# PROG installs its own SIGTRAP handler after start (sigaction, then signal)
	# and traps N times itself (raise, int3): its handler sees exactly its N
	# traps and reads back as the current handler; the watch hits are all ours.
	for how in sigaction signal; do
		"$strap" $how 10 >"$tmp/plain.out" 2>/dev/null
		plain_rc=$?
		run --path signal counter -- "$strap" $how 10
		n=$(count 'tid [0-9]+ write counter: ' "$tmp/err")
		if [[ $plain_rc -eq 3 && $rc -eq 3 && $n -eq 10 ]] &&
			grep -qx 'traps=10 counter=10 own=1' "$tmp/out" && cmp -s "$tmp/out" "$tmp/plain.out"
		then ok; else bad "PROG's SIGTRAP handler ($how): rc $rc (plain $plain_rc), $n hits"; fi
		# Watching the variable PROG's handler writes: no trap loop, every write seen.
		run --path signal traps -- "$strap" $how 10
		n=$(count 'tid [0-9]+ write traps: ' "$tmp/err")
		if [[ $rc -eq 3 && $n -eq 10 ]] && cmp -s "$tmp/out" "$tmp/plain.out"; then ok; else
			bad "watching what PROG's SIGTRAP handler writes ($how): rc $rc, $n hits"; fi
	done

	# A thread that blocks SIGTRAP writes 7 times: not seen, but counted.
	run --path signal counter -- "$strap" blocked 7
	if [[ $rc -eq 0 ]] && grep -qx 'counter=7' "$tmp/out" &&
		grep -q '^# 0 hit(s) printed, 7 lost (7 not seen: thread(s) blocked SIGTRAP)$' "$tmp/err"
	then ok; else bad "thread blocking SIGTRAP: rc $rc"; fi

	# A hex link-time address (PIE: offset from the load base), length given.
	addr=$(nm "$target" | awk '$3 == "counter" {print "0x" $1}')
	run --path signal -l 8 "$addr" -- "$target" 3
	n=$(grep -Ec "tid [0-9]+ write $addr: " "$tmp/err")
	[[ $rc -eq 3 && $n -eq 20 ]] && ok || bad "address $addr: rc $rc, $n hits"

	# Death by a signal is reproduced, stdout still identical; the hits are all there.
	"$target" 3 crash >"$tmp/plain.out" 2>/dev/null
	plain_rc=$?
	run --path signal counter -- "$target" 3 crash
	n=$(count "$hit_w" "$tmp/err")
	# (Under ASan its SIGSEGV handler reports and exits 1, with or without probekit.)
	if [[ $plain_rc -ne 0 && $rc -eq $plain_rc && $n -eq 20 ]] && cmp -s "$tmp/out" "$tmp/plain.out" &&
		{ [[ $plain_rc -ne 139 ]] || grep -q 'killed by signal 11' "$tmp/err"; }; then ok; else
		bad "crash: rc $rc (plain $plain_rc), $n hits"; fi

	# 16 bytes from counter: two debug registers, every write in the first,
	# named by its piece, its value old -> new.
	run --mode hw -l 16 counter -- "$target" 3
	n=$(count '^ +[0-9]+\.[0-9]{6} tid [0-9]+ write counter\+0/8: -?[0-9]+( \(0x[0-9a-f]+\))? -> -?[0-9]+( \(0x[0-9a-f]+\))? at bump\+'$lock_off'$' "$tmp/err")
	v=$(grep -cE 'write counter\+0/8: 19 \(0x13\) -> 20 \(0x14\) ' "$tmp/err")
	[[ $rc -eq 3 && $n -eq 20 && $v -eq 1 ]] && grep -q "all threads, hardware (2 debug registers), signal path .*not the ring path: the range does not fit a debug register$" "$tmp/err" &&
		ok || bad "--mode hw -l 16 counter: rc $rc, $n hits, $v last"

	# Options after SYMBOL are ours too, up to "--" (or PROG without "--").
	run --path signal counter -l 8 -c 2 -- "$target" 3
	n=$(count "$hit_w" "$tmp/err")
	[[ $rc -eq 3 && $n -eq 2 ]] && grep -q '^# --count 2 reached' "$tmp/err" && ok ||
		bad "options after SYMBOL: rc $rc, $n hits"
	run --path signal counter --count 2 "$target" 3
	n=$(count "$hit_w" "$tmp/err")
	[[ $rc -eq 3 && $n -eq 2 ]] && ok || bad "options after SYMBOL, no --: rc $rc, $n hits"
	ring_hit_cases
}

# ... and the ring path's on the same programs: the same hits, without values.
ring_w='^ +[0-9]+\.[0-9]{6} tid [0-9]+ write counter at bump\+'$lock_off'$'
ring_hit_cases() {
	# auto takes the ring for a plain watch and says so; the hits are the signal path's.
	run counter -- "$target" 3
	n=$(count "$ring_w" "$tmp/err")
	tids=$(grep -E "$ring_w" "$tmp/err" | awk '{print $3}' | sort -u | wc -l)
	if [[ $rc -eq 3 && $n -eq 20 && $tids -eq 4 ]] && cmp -s "$tmp/out" "$tmp/plain.out" &&
		grep -q '^# probekit watch: counter, .*all threads, hardware (a debug register), ring path' "$tmp/err" &&
		grep -q '^# 20 hit(s) printed, 0 lost$' "$tmp/err"; then ok; else
		bad "ring path (auto): rc $rc, $n hits, $tids threads"; fi
	# A hot counter, faster than any report: on either path every hit is
	# printed or counted as lost, none unaccounted for.
	for path in ring signal; do
		run --path $path -o "$tmp/rep" hot -- "$hot" 20000 2
		n=$(grep -Ec "tid [0-9]+ write hot" "$tmp/rep")
		lost=$(sed -n 's/^# [0-9]* hit(s) printed, \([0-9]*\) lost.*$/\1/p' "$tmp/rep")
		grep -qx 'hot=40000' "$tmp/out" && [[ $rc -eq 0 && -n $lost ]] && ((n + lost == 40000)) &&
			grep -q "^# $n hit(s) printed, $lost lost" "$tmp/rep" && ok ||
			bad "hot counter, --path $path: rc $rc, $n printed, ${lost:-?} lost"
		rm -f "$tmp/rep"
	done
	run --path ring --count 3 counter -- "$target" 7
	n=$(count "$ring_w" "$tmp/err")
	[[ $rc -eq 7 && $n -eq 3 ]] && grep -q '^# --count 3 reached' "$tmp/err" && ok ||
		bad "--path ring --count 3: rc $rc, $n hits"
	run --path ring -t x bump -- "$target" 3
	n=$(count "$hit_x" "$tmp/err")
	[[ $rc -eq 3 && $n -eq 20 ]] && ok || bad "--path ring -t x bump: rc $rc, $n hits"
	# --stack: the kernel's frame-pointer walk; bump has its frame at -O0.
	run --path ring --stack -c 4 counter -- "$target" 3
	n=$(count '^ +#1 worker\+0x[0-9a-f]+$' "$tmp/err")
	[[ $rc -eq 3 && $n -eq 4 ]] && ok || bad "--path ring --stack: rc $rc, $n frames in worker"
	run --path ring -t rw counter -- "$target" 3
	n=$(count '^ +[0-9.]+ tid [0-9]+ access counter (at|after) ' "$tmp/err")
	[[ $rc -eq 3 && $n -eq 21 ]] && grep -q '^# 21 hit(s) printed, 0 lost$' "$tmp/err" && ok ||
		bad "--path ring -t rw: rc $rc, $n hits"
	# No signal: a thread that blocks SIGTRAP is seen like any other.
	run --path ring counter -- "$strap" blocked 7
	[[ $rc -eq 0 ]] && grep -qx 'counter=7' "$tmp/out" && grep -q '^# 7 hit(s) printed, 0 lost$' "$tmp/err" &&
		ok || bad "--path ring, a thread blocking SIGTRAP: rc $rc"
}

# *SYMBOL whose pointer is NULL, --follow without *: refused before main().
run '*cur' -- "$wptr"
[[ $rc -eq 125 ]] && grep -q "'\*cur': cur is NULL when the watch starts (before main()): --follow" "$tmp/err" &&
	ok || bad "*cur (NULL) without --follow: rc $rc"
run --follow counter -- "$target" 3
[[ $rc -eq 125 ]] && grep -q 'follow moves a \*SYMBOL watch' "$tmp/err" && ok || bad "--follow without *: rc $rc"
run '*counter' -- "$target" 3
[[ $rc -eq 125 ]] && grep -q 'is NULL when the watch starts' "$tmp/err" && ok || bad "*counter (a long, 0): rc $rc"

# Errors name what was wrong, before main() runs.
expect_err() { # RC REGEX ARGS...
	local want=$1 pat=$2
	shift 2
	run "$@"
	if [[ $rc -eq $want ]] && grep -Eq -- "$pat" "$tmp/err" && ! grep -q 'counter=' "$tmp/out"; then
		ok
	else
		bad "watch $* -> rc $rc (want $want), stderr !~ $pat"
	fi
}
expect_err 125 "unknown symbol 'countr' in PROG \([^)]*watch_target\) and its libraries \(did you mean 'counter'\?\)" \
	countr -- "$target"
expect_err 125 "unknown symbol 'no_such_thing_at_all' in PROG" no_such_thing_at_all -- "$target"
expect_err 125 "--mode hw watches up to 32 bytes, .*, not 33 bytes" --mode hw -l 33 counter -- "$target"
expect_err 125 "'big' is 40 bytes: give the length to watch with -l" --mode hw big -- "$target"
expect_err 125 'small\+1: 32 bytes at 0x[0-9a-f]+ take [5-9] debug registers, more than the 4' \
	--mode hw -l 32 small+1 -- "$target"
expect_err 125 "unknown mode 'pages' \(auto, hw or page\)" --mode pages counter -- "$target"
expect_err 125 "--if 'new = 1': expected ==, !=, <, <=, > or >= at '= 1'" --if 'new = 1' counter -- "$target"
expect_err 125 "--in 'no_such_fn'|unknown symbol 'no_such_fn'" --in no_such_fn counter -- "$target"
expect_err 125 "--in 'counter': not a function" --in counter counter -- "$target"
expect_err 125 "--under 'counter': not a function" --under counter counter -- "$target"
expect_err 125 "--in and --under: one function" --in bump --under worker counter -- "$target"
expect_err 125 "--mode page watches data \(w or rw\), not execution" --mode page -t x bump -- "$target"
expect_err 125 "-t x: 'counter' is not a function" -t x counter -- "$target"
expect_err 125 "unknown type 'r' \(w, rw or x\)" -t r counter -- "$target"
expect_err 125 'expected PROG after counter --' counter --
expect_err 127 'no_such_prog_xyz: command not found in PATH' counter -- no_such_prog_xyz
cp "$target" "$tmp/suid"
chmod u+s "$tmp/suid"
expect_err 126 'suid is set-user-ID: the dynamic loader ignores LD_PRELOAD' counter -- "$tmp/suid"
PROBEKIT_AGENT=/nonexistent expect_err 125 'PROBEKIT_AGENT=/nonexistent: no such readable file' \
	counter -- "$target"
expect_err 125 'watch: empty SYMBOL' "" -- "$target"
expect_err 125 'watch: no SYMBOL given' -- "$target"
# An address where nothing is mapped: refused, naming it; the agent does not
# read it itself (it did: PROG died before main() and the loader was blamed).
for t in w x; do
	expect_err 125 'cannot watch 0x10000000000: nothing is mapped at 0x[0-9a-f]+ in PROG' \
		-t $t -l 1 0x10000000000 -- "$target"
	grep -q 'loader' "$tmp/err" && bad "unmapped address, -t $t: the loader is blamed"
done

# Page mode, on every machine: every write by the four workers, at the
# locked add itself, with the value before and after; the program's output
# and status untouched; --count, -t rw, --stack; auto says what it took.
page_cases() {
	run --mode page counter -- "$target" 3
	n=$(count "$hit_w" "$tmp/err")
	tids=$(grep -E "$hit_w" "$tmp/err" | awk '{print $3}' | sort -u | wc -l)
	if [[ $rc -eq 3 && $n -eq 20 && $tids -eq 4 ]] && cmp -s "$tmp/out" "$tmp/plain.out" &&
		grep -q '^# probekit watch: counter, 8 byte(s) at 0x[0-9a-f]*, writes, all threads, page mode' "$tmp/err" &&
		grep -q '^# 20 hit(s) printed, 0 lost$' "$tmp/err"; then ok; else
		bad "--mode page counter: rc $rc, $n hits, $tids threads"; fi
	# The values go 0 -> 1 ... 19 -> 20, each once.
	vals=$(sed -E 's/ \(0x[0-9a-f]+\)//g' "$tmp/err" | grep -Eo 'counter: -?[0-9]+ -> -?[0-9]+' |
		awk '{print $2 "->" $4}' | sort -n | tr '\n' ' ')
	want=$(for i in $(seq 0 19); do echo "$i->$((i + 1))"; done | sort -n | tr '\n' ' ')
	[[ $vals == "$want" ]] && ok || bad "--mode page values: $vals"

	run --mode page --count 3 counter -- "$target" 7
	n=$(count "$hit_w" "$tmp/err")
	if [[ $rc -eq 7 && $n -eq 3 ]] && grep -q '^# --count 3 reached' "$tmp/err" &&
		grep -qx "counter=20 env=$nenv" "$tmp/out"; then ok; else bad "--mode page --count 3: rc $rc, $n hits"; fi

	if [[ -z ${PKT_SAN_PRELOAD:-} ]]; then
		run --mode page -t rw counter -- "$target" 3
		n=$(count "$hit_w" "$tmp/err")
		[[ $rc -eq 3 && $n -eq 20 ]] && ok || bad "--mode page -t rw: rc $rc, $n hits"
	fi

	run --mode page --stack -c 4 counter -- "$target" 3
	n=$(count '^ +#1 worker\+0x[0-9a-f]+$' "$tmp/err")
	[[ $rc -eq 3 && $n -eq 4 ]] && ok || bad "--mode page --stack: rc $rc, $n frames in worker"

	# 40 bytes, no -l: the symbol's size, which only page mode takes; nothing writes it.
	run big -- "$target" 3
	if [[ $rc -eq 3 ]] && grep -q '^# probekit watch: big, 40 byte(s) at .*page mode' "$tmp/err" &&
		grep -q '^# 0 hit(s) printed, 0 lost$' "$tmp/err"; then ok; else bad "big (40 bytes): rc $rc"; fi

	# Conditions, evaluated in the process: one value, the changes only, one function.
	run --mode page --if 'new == 5' counter -- "$target" 3
	n=$(count "$hit_w" "$tmp/err")
	if [[ $rc -eq 3 && $n -eq 1 ]] && grep -Eq 'write counter: 4 -> 5 at bump' "$tmp/err" &&
		grep -q '^# 19 hit(s) did not pass the condition' "$tmp/err"; then ok; else
		bad "--if 'new == 5': rc $rc, $n hits"; fi
	if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then
		echo "SKIP under ASan (-t rw on counter): ASan's flags that every instrumented" \
			"function reads, the library's handlers too, are copied into the program's" \
			".bss beside counter"
	else
		run --mode page -t rw --changed counter -- "$target" 3
		n=$(count "$hit_w" "$tmp/err")
		if [[ $rc -eq 3 && $n -eq 20 ]] && ! grep -q 'read counter' "$tmp/err" &&
			grep -q '^# 1 hit(s) did not pass the condition' "$tmp/err"; then ok; else
			bad "-t rw --changed: rc $rc, $n hits"; fi
	fi
	run --mode page --in bump counter -- "$target" 3
	n=$(count "$hit_w" "$tmp/err")
	[[ $rc -eq 3 && $n -eq 20 ]] && ok || bad "--in bump: rc $rc, $n hits"
	run --mode page --in worker counter -- "$target" 3
	n=$(count "$hit_w" "$tmp/err")
	[[ $rc -eq 3 && $n -eq 0 ]] && grep -q '^# 20 hit(s) did not pass' "$tmp/err" && ok ||
		bad "--in worker: rc $rc, $n hits"
	# --under: worker is on the stack of every write (bump's caller), main of none;
	# built -O2 without frame pointers, bump is a frameless leaf whose return
	# address is on top of the stack.
	for t in "$target" "$nofp"; do
		run --mode page --under worker counter -- "$t" 3
		n=$(count ' write counter: .* at bump\+0x[0-9a-f]+$' "$tmp/err")
		[[ $rc -eq 3 && $n -eq 20 ]] && ok || bad "--under worker ($(basename "$t")): rc $rc, $n hits"
	done
	run --mode page --under main counter -- "$target" 3
	n=$(count "$hit_w" "$tmp/err")
	[[ $rc -eq 3 && $n -eq 0 ]] && grep -q '^# 20 hit(s) did not pass' "$tmp/err" && ok ||
		bad "--under main: rc $rc, $n hits"

	# auto: a debug register where hits are delivered, page mode where not.
	run -c 1 counter -- "$target" 3
	if [[ $delivered -eq 0 ]]; then want='hardware'; else want='page mode'; fi
	[[ $rc -eq 3 ]] && grep -q "^# probekit watch: counter, .*all threads, $want" "$tmp/err" && ok ||
		bad "auto: rc $rc, want $want"
}
page_cases

# The ring path on every machine: what cannot take it is refused before
# PROG runs; where hits are not delivered it says so; its reader, report
# and summary run on sampled page faults (PROBEKIT_RING_FAULTS, WR8).
expect_err 125 "--path ring cannot serve --if and --changed" --path ring --changed counter -- "$target"
expect_err 125 "--path ring cannot serve --mode page" --path ring --mode page counter -- "$target"
expect_err 125 "--path ring cannot serve --in" --path ring --in bump counter -- "$target"
expect_err 125 "--path ring cannot serve --follow" --path ring --follow '*cur' -- "$wptr"
expect_err 125 "unknown path 'rings' \(auto, ring or signal\)" --path rings counter -- "$target"
expect_err 125 "cannot watch text with --path ring: the range does not fit a debug register" \
	--path ring text -- "$target"
PROBEKIT_HWBP_UNDELIVERED=1 expect_err 125 \
	'cannot watch counter with --path ring: hardware hits not delivered here .*PROBEKIT_HWBP_UNDELIVERED is set' \
	--path ring counter -- "$target" 3
ring_faults_cases() {
	local ring_any='^ +[0-9]+\.[0-9]{6} tid [0-9]+ write counter (at|after) [^ ]+'
	PROBEKIT_RING_FAULTS=64 run --path ring counter -- "$target" 3
	n=$(count "$ring_any" "$tmp/err")
	if [[ $rc -eq 3 && $n -gt 0 ]] && grep -qx "counter=20 env=$((nenv + 1))" "$tmp/out" &&
		grep -q '^# probekit watch: counter, .*ring path (perf.s ring buffer: no signal, no values)$' "$tmp/err" &&
		grep -q "^# $n hit(s) printed, 0 lost\$" "$tmp/err" && ! grep -q ' -> ' "$tmp/err"
	then ok; else bad "ring path (page faults): rc $rc, $n hits"; fi
	PROBEKIT_RING_FAULTS=64 run -c 3 counter -- "$target" 3
	n=$(count "$ring_any" "$tmp/err")
	[[ $rc -eq 3 && $n -eq 3 ]] && grep -q '^# --count 3 reached' "$tmp/err" &&
		grep -q '^# 3 hit(s) printed, 0 lost$' "$tmp/err" && ok || bad "ring path --count 3: rc $rc, $n hits"
	# The faults of 4096 fresh pages in one data page per CPU: what the ring
	# had no room for is counted in the summary, never silently dropped.
	PROBEKIT_RING_FAULTS=1 run -o "$tmp/rep" hot -- "$hot" 0 1 4096
	n=$(grep -Ec 'tid [0-9]+ write hot' "$tmp/rep")
	lost=$(sed -n 's/^# [0-9]* hit(s) printed, \([0-9]*\) lost$/\1/p' "$tmp/rep")
	if [[ $rc -eq 0 && -n $lost ]] && grep -q "^# $n hit(s) printed, $lost lost\$" "$tmp/rep" &&
		((n + lost >= 4096)) &&
		{ [[ $lost -eq 0 ]] || grep -q "^# $lost hit(s) lost: the ring buffers (1 page(s) per CPU) were full" "$tmp/rep"; }
	then ok; else bad "ring path, lost samples: rc $rc, $n printed, ${lost:-?} lost"; fi
	rm -f "$tmp/rep"
}
ring_faults_cases

# Where hits are not delivered, every watch is refused before main() runs,
# with the cause, never a "0 hit(s)" report; PROBEKIT_HWBP_UNDELIVERED=1
# pretends so on a machine that delivers (the library's check arms its
# breakpoint over another word than the one it writes).
refused() { # WHAT ARGS...
	local what=$1
	shift
	run "$@"
	if [[ $rc -eq 125 ]] && ! grep -q 'counter=' "$tmp/out" && ! grep -q 'hit(s) printed' "$tmp/err" &&
		grep -q 'cannot watch .*: Operation not supported (this machine accepts hardware breakpoints but does not deliver them' "$tmp/err"
	then ok; else bad "$what: rc $rc (want 125 and the cause)"; fi
}
PROBEKIT_HWBP_UNDELIVERED=1 refused "PROBEKIT_HWBP_UNDELIVERED=1" --mode hw counter -- "$target" 3
grep -q 'PROBEKIT_HWBP_UNDELIVERED is set' "$tmp/err" && ok || bad "the message names the switch"
PROBEKIT_HWBP_UNDELIVERED=1 refused "PROBEKIT_HWBP_UNDELIVERED=1, -t x" -t x bump -- "$target" 3
# Ranges split over several registers get as far as the library: 24 bytes, an
# unaligned 2-byte field (1 + 1), a symbol of 8 bytes aligned to 2.
PROBEKIT_HWBP_UNDELIVERED=1 refused "split, -l 24" --mode hw -l 24 counter -- "$target" 3
PROBEKIT_HWBP_UNDELIVERED=1 refused "split, small+1 -l 2" --mode hw -l 2 small+1 -- "$target" 3
PROBEKIT_HWBP_UNDELIVERED=1 refused "split, small" --mode hw small -- "$target" 3
# ... and auto takes page mode instead, saying so.
PROBEKIT_HWBP_UNDELIVERED=1 run -c 2 counter -- "$target" 3
[[ $rc -eq 3 && $(count "$hit_w" "$tmp/err") -eq 2 ]] && grep -q 'all threads, page mode' "$tmp/err" && ok ||
	bad "PROBEKIT_HWBP_UNDELIVERED=1, auto: rc $rc"

# The switch reaches PROG's environment as the user gave it; "0" pretends nothing.
PROBEKIT_HWBP_UNDELIVERED=0 run -c 1 --path signal counter -- "$target" 3
if [[ $delivered -eq 0 ]]; then
	[[ $rc -eq 3 ]] && [[ $(count "$hit_w" "$tmp/err") -eq 1 ]] && ok ||
		bad "PROBEKIT_HWBP_UNDELIVERED=0: rc $rc"
	hit_cases
else
	refused "not delivered here" --mode hw counter -- "$target" 3
	expect_err 125 'cannot watch counter with --path ring: hardware hits not delivered here' \
		--path ring counter -- "$target" 3
	echo "SKIP (the cases that need delivered hits, both paths'): $(cat "$tmp/hw")"
fi

# perf_event_open denied by seccomp: the message names seccomp, not paranoid.
timeout 30 "$secx" "$pk" watch --mode hw counter -- "$target" 3 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [[ $rc -eq 125 ]] && grep -q 'cannot watch counter at 0x[0-9a-f]*: Permission denied (this process runs under a seccomp filter' "$tmp/err"
then ok; else bad "seccomp: rc $rc"; fi

"$pk" watch --help >"$tmp/out" 2>&1 && grep -q '^usage: probekit watch' "$tmp/out" && ok ||
	bad "--help"

echo "watch command: $pass passed, $fail failed"
[[ $fail -eq 0 ]] || exit 1
[[ $delivered -eq 0 ]] || exit 77
