#!/usr/bin/env bash
# probekit trace records PROG's calls into its libraries by default, timed:
# each library function's count is the program's own count of its calls
# (libc's calls of the same function from inside are not PROG's), through a
# tail call and from a callback too; named as PROG imports it; left out by
# --no-libcall; -f names one with no flag; exec'd programs alike; the
# counts equal uftrace's (its PLT hooks) where uftrace is installed.
#
# A non-PIE build, an allocator preloaded in front of libc's, and the names
# of one function (open, open64) too.
#
# Functions relocation refuses (glibc's memcpy, liblzma's lzma_code,
# relaylib's, whether or not a jump relay could stand for them) and the
# agent's own wrappers (sigaction) are counted through PROG's PLT slots
# (library-calls.md LC5), never a breakpoint that a thread blocking SIGTRAP
# would die on, also where the slots are read-only (-z now): their pages
# keep their protection.  Debian's ls (run through env) and sqlite3 against
# uftrace, memcpy among the functions.
#
# The exec family and _exit are recorded entries only: a vfork child's
# (vforkexec) run on its parent's shadow stack, and no call of the parent's
# is closed by them.
#
# usage: test-trace-libcall.sh PROBEKIT LIBCALLS LIBCALLS_NOPIE ALLOCATOR RELAYPROG VFORKEXEC
set -uo pipefail
pk=$(realpath "$1") prog=$(realpath "$2") nopie=$(realpath "$3") alloc=$(realpath "$4")
relayprog=$(realpath "$5") vforkexec=$(realpath "$6")
. "$(dirname "$(realpath "$0")")/lib.sh"

# counts FILE: "name calls" of FILE's library functions (report --raw), sorted.
counts() {
	"$pk" report --raw "$1" 2>/dev/null |
		awk 'NR > 2 && $NF ~ /^\[lib.*\.so/ {print $(NF-1), $1}' | sort
}
# expected: the program's own "name count" lines.
expected() { grep -E '^[a-z_]+ [0-9]+$' out | sort; }
# libc_rows FILE: the functions FILE's report has from libc.
libc_rows() { "$pk" report --raw "$1" 2>/dev/null | awk '$NF == "[libc.so.6]" {print $(NF-1)}'; }

run -o d.trace -- "$prog" 7
check "default: rc $rc" "[[ $rc == 0 ]]"
counts d.trace >got
expected >want
check "default: each library call counted as the program counts it" \
	"[[ -s want ]] && join want got | awk '\$2 != \$3 {bad = 1} END {exit bad}' && [[ \$(join want got | wc -l) == \$(wc -l <want) ]]"
check "default: fopen and fclose recorded once (their own malloc is not PROG's)" \
	"grep -qx 'fopen 1' got && grep -qx 'fclose 1' got && grep -qx 'malloc 7' got"
check "default: memcpy (no site in libc) and sigaction (the agent's wrapper) counted" \
	"grep -qx 'memcpy 7' got && grep -qx 'sigaction 2' got"
check "default: named as imported (strlen, not its CPU variant)" \
	"grep -qx 'strlen 14' got && ! grep -q '^__strlen' got"
check "default: PROG's own functions too" \
	"\"$pk\" report --raw d.trace | grep -q ' tail_strlen \\[libcalls\\]\$'"
# Timed: every library call has an exit, so a duration (replay shows '{' or a leaf).
"$pk" replay d.trace >rp 2>&1
check "replay: malloc's calls are timed leaves" \
	"[[ \$(grep -cE '[0-9.]+ [mun]?s +\\[ *[0-9]+\\] \\| +malloc\\(\\);' rp) == 7 ]]"
# The tail call from tail_strlen returns into main: counted as PROG's.
check "replay: the tail-called strlen under main" "grep -qE '\\| +strlen\\(\\);' rp"

run -o n.trace --no-libcall -- "$prog" 7
check "--no-libcall: rc $rc, no libc function" "[[ $rc == 0 && -z \$(libc_rows n.trace) ]]"
check "--no-libcall: PROG's own still" \
	"\"$pk\" report --raw n.trace | grep -q ' tail_strlen \\[libcalls\\]\$'"

# open and open64 are one function: one row, under the first name, or the
# name -f gives.
check "default: open and open64 one row" "grep -qx 'open 3' got && ! grep -q '^open64 ' got"
run -o o.trace -f open64 -- "$prog" 2
check "-f open64: the function under that name" "[[ \$(counts o.trace) == 'open64 3' ]]"

# Not position-independent: free (its address taken) is defined at PROG's
# PLT entry; its calls are libc's free's all the same.
run -o np.trace -- "$nopie" 7 got
counts np.trace >got.np
check "non-PIE: each library call counted as the program counts it" \
	"join want got.np | awk '\$2 != \$3 {bad = 1} END {exit bad}' && [[ \$(join want got.np | wc -l) == \$(wc -l <want) ]]"
plain_got=$("$nopie" 7 got | grep '^got ')
check "non-PIE, -z now: its PLT slots' pages as protected as untraced ($plain_got)" \
	"[[ -n '$plain_got' ]] && grep -qx '$plain_got' out"

# An allocator preloaded in front of libc's (unversioned malloc and free):
# PROG's calls bind to it, and are counted there.
if [[ -z ${PKT_SAN_PRELOAD:-} ]]; then # (a sanitizer's runtime interposes malloc itself)
	LD_PRELOAD=$alloc "$pk" trace -o al.trace -- "$prog" 7 >out 2>err
	check "preloaded allocator: PROG's malloc and free counted in it" \
		"\"$pk\" report --raw al.trace | awk '\$NF ~ /libcalls_alloc/ {print \$(NF-1), \$1}' | sort | tr '\n' ' ' | grep -qx 'free 7 malloc 7 '"
fi

# --no-relocate: patchable entries only, which PROG has none of: refused.
run -o nr.trace --no-relocate -- "$prog" 7
check "--no-relocate: no library call either, refused ($rc)" "[[ $rc == 125 ]]"

run -o f.trace -f malloc -- "$prog" 5
check "-f malloc: no flag needed, 5 calls" "[[ \$(counts f.trace) == 'malloc 5' ]]"

# --relocate-all hooks malloc itself: every caller's calls, fopen's among them.
run -o a.trace --relocate-all -f malloc -- "$prog" 5
m=$(counts a.trace | awk '$1 == "malloc" {print $2}')
check "--relocate-all: malloc from any caller ($m > 5)" "[[ -n '$m' && $m -gt 5 ]]"

# An exec'd program's library calls: its own file.
run -o e.trace -- /usr/bin/env "$prog" 4
ef=$(ls e.trace.*.1 2>/dev/null | head -1)
check "exec: the exec'd program's file ($ef) has its malloc calls" \
	"[[ -n '$ef' ]] && counts '$ef' | grep -qx 'malloc 4'"

# A script whose "#!" line is /usr/bin/env bash: env, bash and the program
# the script runs are each traced with the same settings; the program's
# library calls are in its own file of the session.
printf '#!/usr/bin/env bash\n"%s" 4\n' "$prog" >envscript.sh
chmod +x envscript.sh
run -o s.trace -- ./envscript.sh
sf=
for f in s.trace.*.1; do
	[[ -f $f ]] && counts "$f" | grep -qx 'memcpy 4' && sf=$f
done
check "#!/usr/bin/env script: rc $rc, the program it runs traced ($sf), its library calls counted" \
	"[[ $rc == 0 && -n '$sf' ]] && counts '$sf' | grep -qx 'malloc 4' && grep -qx 'malloc 4' out"

# uftrace's PLT hooks count the same calls of every function both record.
# (Not on a sanitizer build's PROG, on which uftrace's runtime hangs.)
if [[ -z ${PKT_SAN_PRELOAD:-} ]] && command -v uftrace >/dev/null &&
	timeout 120 uftrace record --force -d uf "$prog" 7 >/dev/null 2>&1; then
	# (open and open64 apart: uftrace hooks names, probekit the function)
	uftrace report -d uf -f call 2>/dev/null | awk 'NR > 2 && NF == 2 && $2 !~ /^open/ {print $2, $1}' |
		sort >uf.counts
	both=$(join uf.counts got | wc -l)
	check "vs uftrace: $both functions in both, same counts" \
		"[[ $both -ge 6 ]] && join uf.counts got | awk '\$2 != \$3 {print; bad = 1} END {exit bad}'"
else
	echo "SKIP: uftrace comparison (a sanitizer build, or uftrace missing or cannot record here)"
fi

# Distribution programs against uftrace: every library call both record
# counted alike, memcpy among them.  ls through env: its own file.
if [[ -z ${PKT_SAN_PRELOAD:-} ]] && command -v uftrace >/dev/null &&
	timeout 120 uftrace record --force -d ufls /usr/bin/ls -la /usr/share/doc >/dev/null 2>&1; then
	run -o ls.trace -- /usr/bin/env /usr/bin/ls -la /usr/share/doc
	lf=$(ls ls.trace.*.1 2>/dev/null | head -1)
	uftrace report -d ufls -f call 2>/dev/null | awk 'NR > 2 && NF == 2 {print $2, $1}' | sort >ufls.counts
	"$pk" report --raw "$lf" 2>/dev/null | awk 'NR > 2 && $NF ~ /\.so/ {print $(NF-1), $1}' | sort >ls.counts
	both=$(join ufls.counts ls.counts | wc -l)
	check "env ls: rc $rc, $both library functions in both, same counts, memcpy among them" \
		"[[ $rc == 0 && -n '$lf' ]] && ((both >= 20)) && join ufls.counts ls.counts | grep -q '^memcpy ' &&
		 join ufls.counts ls.counts | awk '\$2 != \$3 {print; bad = 1} END {exit bad}'"
	if command -v sqlite3 >/dev/null; then
		sql='create table t(a, b); insert into t values (1, "x"), (2, "y"); select b, sum(a) from t group by b;'
		timeout 120 uftrace record --force -d ufsq sqlite3 :memory: "$sql" >/dev/null 2>&1
		run -o sq.trace -- sqlite3 :memory: "$sql"
		uftrace report -d ufsq -f call 2>/dev/null | awk 'NR > 2 && NF == 2 {print $2, $1}' | sort >ufsq.counts
		"$pk" report --raw sq.trace 2>/dev/null | awk 'NR > 2 && $NF ~ /\.so/ {print $(NF-1), $1}' | sort >sq.counts
		both=$(join ufsq.counts sq.counts | wc -l)
		check "sqlite3: rc $rc, $both library functions in both, same counts, memcpy and signal among them" \
			"[[ $rc == 0 ]] && ((both >= 20)) && [[ \$(join ufsq.counts sq.counts | grep -cE '^(memcpy|signal) ') == 2 ]] &&
			 join ufsq.counts sq.counts | awk '\$2 != \$3 {print; bad = 1} END {exit bad}'"
	fi
else
	echo "SKIP (part): ls and sqlite3 against uftrace (a sanitizer build, or uftrace missing or cannot record here)"
fi

# A library function relocation refuses (liblzma's lzma_code: an indirect
# jump, a switch) is hooked through its jump relay, or a breakpoint where
# the relay's place is taken: xz's calls of it are counted all the same,
# single-threaded as uftrace counts them, and with a worker thread.
if [[ -x /usr/bin/xz ]] && "$pk" sites -f -g lzma_code "$(ldd /usr/bin/xz | awk '/liblzma/ {print $3}')" 2>/dev/null |
	grep -q ' refused '; then
	seq 1 60000 >xin
	run -o x.trace -- /usr/bin/xz -T1 -c xin
	mv out x1.xz
	counts x.trace >xgot
	check "xz -T1: rc $rc, its output as xz's" "[[ $rc == 0 ]] && xz -dc x1.xz | cmp -s - xin"
	check "xz -T1: lzma_code, refused by relocation, counted" "grep -Eq '^lzma_code [1-9]' xgot"
	if [[ -z ${PKT_SAN_PRELOAD:-} ]] && command -v uftrace >/dev/null &&
		timeout 120 uftrace record --force -d ufx /usr/bin/xz -T1 -c xin >/dev/null 2>&1; then
		uftrace report -d ufx -f call 2>/dev/null | awk 'NR > 2 && NF == 2 {print $2, $1}' | sort >ufx.counts
		check "xz -T1 vs uftrace: lzma_code, read and write, same counts" \
			"[[ \$(join ufx.counts xgot | grep -cE '^(lzma_code|read|write) ') == 3 ]] &&
			 join ufx.counts xgot | awk '\$2 != \$3 {print; bad = 1} END {exit bad}'"
	fi
	run -o x2.trace -- /usr/bin/xz -T2 --block-size=100000 -c xin
	mv out x2.xz
	check "xz -T2: rc $rc, lzma_code counted, its output as xz's" \
		"[[ $rc == 0 ]] && counts x2.trace | grep -Eq '^lzma_code [1-9]' && xz -dc x2.xz | cmp -s - xin"
else
	echo "SKIP (part): xz with a liblzma whose lzma_code relocation refuses is not installed here"
fi

# relaylib's functions: relay_taken's relay place is taken (its library
# maps it first), relay_free's is free, relay_none has none, relay_short
# relocates.  All are counted, the refused ones through PROG's PLT slots:
# no breakpoint, and the thread that blocks every signal calls relay_taken
# unharmed.  --int3 changes none of it.
want_relay=$'relay_free 5\nrelay_none 5\nrelay_short 5\nrelay_taken 6'
for opt in "" --int3; do
	run $opt -o r.trace -- "$relayprog" 5
	check "relaylib $opt: rc $rc, the blocked thread's call unharmed" "[[ $rc == 0 ]] && grep -qx 'blocked thread ok' out"
	"$pk" report --raw r.trace 2>/dev/null | awk '$(NF-1) ~ /^relay_/ {print $(NF-1), $1}' | sort >rgot
	check "relaylib $opt: every call counted ($(tr '\n' ' ' <rgot))" "[[ \$(cat rgot) == \"\$want_relay\" ]]"
	check "relaylib $opt: no library call left out nor on a breakpoint" \
		"! grep -q 'library calls not traced\\|library calls through INT3' err"
done

run -o v.trace -- "$vforkexec"
"$pk" report --raw --threads v.trace >vrep 2>&1
check "vfork child: rc $rc, its execl and _exit entries only, no exit without its entry" \
	"[[ $rc == 0 ]] && grep -qx 'child 7' out && grep -q '^ *1 *- .* execl \\[' vrep &&
	 grep -q '^ *1 *- .* _exit \\[' vrep && ! grep -q '[1-9][0-9]* exits without an entry' vrep"

echo "trace_libcall: $pass passed, $fail failed"
((fail == 0))
