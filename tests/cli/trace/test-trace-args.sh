#!/usr/bin/env bash
# Arguments and return values (-A/-R): tests/cli/trace/args_demo prints, for
# each call, the line replay must show from its own view of the values;
# the trace must show exactly those lines.  Every format, sizes, register
# and stack locations, strings NULL, wild, cut, unterminated before a
# PROT_NONE page, on a page not resident, and unmapped during the call; the
# same values with --entry-only, in a flight recorder that overwrites its
# oldest calls, and from 8 threads at once; report --args, the Chrome and
# Perfetto exports show them; bad specs refused with a clear error and
# nothing run.
#
# usage: test-trace-args.sh PROBEKIT ARGS_DEMO STRS_DEMO AUTO_DEMO
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2") strs=$(realpath "$3") auto=$(realpath "$4")
here=$(dirname "$(realpath "$0")")
protodir=$(realpath "$(dirname "$(realpath "$0")")/../perfetto")
. "$(dirname "$(realpath "$0")")/lib.sh"
# Each run compares the calls of the program's functions with what it made:
# its library calls left out.
run() {
	"$pk" trace --no-libcall "$@" >out 2>err
	rc=$?
}

specs=(-A 'add@arg1/d32,arg2/d32' -R 'add@retval/i32'
	-A 'bits@arg1/x,arg2/c,arg3/u16' -R 'bits@retval/x'
	-A 'slen@arg1/s' -R 'slen@retval/u' -A 'peek@arg1/s'
	-A 'scale@fparg1,fparg2' -R 'scale@retval/f'
	-A 'half@fparg1/f32' -R 'half@retval/f32'
	-A 'up@arg1/c' -R 'up@retval/c'
	-A 'many@arg1,arg2%rsi,arg7,arg8%stack+2' -R 'many'
	-A 'callback@arg1/p' -A 'drop@arg1/s' -R 'drop@retval/s')

# The calls replay shows, without duration and thread: "name(args) = ret;".
calls() { "$pk" replay "$@" 2>/dev/null | sed -n 's/^.*| *//p'; }

"$demo" >plain.out
run -o a.trace "${specs[@]}" -- "$demo"
check "args: rc $rc" "[[ $rc == 0 ]]"
check "args: stdout differs from a plain run but for the addresses" \
	"diff <(sed 's/0x[0-9a-f]*/ADDR/' plain.out) <(sed 's/0x[0-9a-f]*/ADDR/' out)"
sed -n 's/^want //p' out >want
calls a.trace >got
check "args: replay shows every call with the program's own values" "diff -u want got"
check "args: the file page was not resident when the call read it" \
	"grep -q 'resident before the call: 0' out"
check "args: the summary counts calls' events, not their values" \
	"grep -q 'wrote .*: $(($(wc -l <want) * 2)) events' err"

# --entry-only: the same arguments, no exits, no return values.
run -o e.trace --entry-only -A 'add@arg1/d32,arg2/d32' -A 'slen@arg1/s' -- "$demo"
check "entry-only args: rc $rc" "[[ $rc == 0 ]]"
check "entry-only args: the calls with their arguments" \
	"[[ \"\$(calls e.trace | grep -E '^(add|slen)' | head -4 | tr '\\n' '|')\" == 'add(2, 3);|add(-7, 1);|slen(\"abc\");|slen(\"\");|' ]]"

# A flight recorder overwrites its oldest calls, their values with them: what
# is left shows each call's own values, never a value of another call.
run -o r.trace --ring 64K -A 'tagged@arg1/d32,arg2/s' -R 'tagged@retval/d32' -- "$demo" ring 20000
check "ring args: rc $rc" "[[ $rc == 0 ]]"
sed -n 's/^want //p' out | sort >rwant
calls r.trace | grep '^tagged' | sort >rgot
check "ring args: many calls left ($(wc -l <rgot))" "(( \$(wc -l <rgot) > 300 ))"
check "ring args: each one as the program made it" "[[ -z \$(comm -13 rwant rgot) ]]"

# Threads: each call with its own values, none lost, none mixed.
run -o t.trace -A 'tagged@arg1/d32,arg2/s' -R 'tagged@retval/d32' -- "$demo" threads 8 3000
check "threads args: rc $rc" "[[ $rc == 0 ]]"
sed -n 's/^want //p' out | sort >twant
calls t.trace | sort >tgot
check "threads args: every call of every thread, as the program made it ($(wc -l <tgot))" \
	"[[ \$(wc -l <twant) == 24000 ]] && cmp -s twant tgot"

# The views and exports show them too.
"$pk" report --args --raw a.trace >rep 2>&1
check "report --args: a row per distinct values" \
	"grep -q ' add(2, 3) = 5 \\[' rep && grep -q ' add(-7, 1) = -6 \\[' rep && grep -q ' slen((null)) = 0 \\[' rep"
check "report without --args: a row per function" "[[ \$($pk report a.trace | grep -c ' add ') == 1 ]]"
check "chrome export: a call's args" \
	"$pk export --format chrome a.trace | grep -q '\"name\":\"add\",.*\"args\":{\"arg1\":\"2\",\"arg2\":\"3\",\"retval\":\"5\"}'"
if command -v protoc >/dev/null; then
	"$pk" export --format perfetto -o a.pftrace a.trace 2>/dev/null
	protoc --decode=perfetto.protos.Trace -I "$protodir" "$protodir/probekit-perfetto.proto" \
		<a.pftrace >a.txt 2>&1
	# "name"=value of each annotation (protoc prints the value first)
	awk '/string_value:/ {sub(/^ *string_value: /, ""); v = $0}
		/^ *name: "(arg|fparg|retval)/ {sub(/^ *name: /, ""); print $0 "=" v}' a.txt >pairs
	printf '%s\n' '"arg1"="\"abc\""' '"retval"="0x12cb"' '"fparg1"="1.5"' >pwant
	check "perfetto export: the arguments and return values are debug annotations" \
		"[[ \$(grep -cFxf pwant pairs) -ge 3 ]]"
else
	echo "SKIP: perfetto export check: no protoc (apt-get install protobuf-compiler)"
fi

# -F: only the calls whose arguments satisfy the condition are recorded
# (their callees are, whatever pick's call was): exact counts.
filtered() { # COND: the number of pick calls recorded under -F 'pick@if:COND'
	run -o c.trace -A 'pick@arg1/d32,arg2/s' -F "pick@if:$1" -- "$demo" cond 1000
	"$pk" report --raw c.trace 2>/dev/null | awk '$NF == "[args_demo]" && $(NF-1) == "pick" {print $1}'
}
"$demo" cond 1000 >cond.out
read -r _ n_pick _ n_inner _ n_get _ n_post _ n_not_get _ n_range _ n_get_lo <cond.out
check "-F arg1==7: one call" "[[ \$(filtered 'arg1/d32==7') == 1 ]]"
check "-F: the callee still traced (inner: $n_inner)" \
	"[[ \$($pk report --raw c.trace | awk '\$(NF-1) == \"inner\" {print \$1}') == $n_inner ]]"
check "-F: the call recorded has its values" "[[ \$(calls c.trace | grep -c '^pick(7, (null)) {') == 1 ]]"
check "-F a range with &&: $n_range calls" "[[ \$(filtered 'arg1/d32 >= 10 && arg1/d32 < 20') == $n_range ]]"
check "-F string prefix: $n_get calls" "[[ \$(filtered 'arg2==\"GET*\"') == $n_get ]]"
check "-F exact string: $n_post calls" "[[ \$(filtered 'arg2==\"POST /b\"') == $n_post ]]"
check "-F != prefix (NULL included): $n_not_get calls" "[[ \$(filtered 'arg2!=\"GET*\"') == $n_not_get ]]"
check "-F hex, unsigned: 1 call" "[[ \$(filtered 'arg1/x==0x3e7') == 1 ]]"
check "-F no call matches: none recorded" "[[ -z \$(filtered 'arg1/d32<0') ]]"
# -F on the return value: the call is held from its entry to its return,
# which decides; its callees are recorded either way.
check "-F retval==8: one call" "[[ \$(filtered 'retval/d32==8') == 1 ]]"
check "-F retval: the callee still traced, all $n_inner" \
	"[[ \$($pk report --raw c.trace | awk '\$(NF-1) == \"inner\" {print \$1}') == $n_inner ]]"
check "-F retval: the call kept shows its callee inside it" \
	"$pk replay c.trace | grep -A2 'pick(7, (null)) {' | sed -n 2p | grep -q '|   inner();'"
check "-F retval>990: 10 calls" "[[ \$(filtered 'retval/d32>990') == 10 ]]"
check "-F arguments && retval: $n_get_lo calls" \
	"[[ \$(filtered 'arg2==\"GET*\" && retval/d32<=100') == $n_get_lo ]]"
for mode in --ring=1M --drop; do
	run -o c.trace $mode -F 'pick@if:retval/d32==8' -- "$demo" cond 1000
	check "-F retval with $mode: one call, the callee's $n_inner" \
		"[[ $rc == 0 && \$($pk report --raw c.trace | awk '\$(NF-1) == \"pick\" {print \$1}') == 1 &&
		   \$($pk report --raw c.trace | awk '\$(NF-1) == \"inner\" {print \$1}') == $n_inner ]]"
done
run -o c.trace -R 'pick@retval/d32' -F 'pick@if:retval/d32==8' -- "$demo" cond 1000
check "-F retval with -R: the value at the exit" "[[ \$(calls c.trace | grep -c '^} = 8; /\\* pick \\*/') == 1 ]]"
run -o c.trace -F 'tagged@if:retval/d32<1000000' -A 'tagged@arg1/d32,arg2/s' -R 'tagged@retval/d32' \
	-- "$demo" threads 8 3000
sed -n 's/^want //p' out | awk -F'[(,]' '$2 < 1000000' | sort >twant
calls c.trace | sort >tgot
check "-F retval, 8 threads: thread 0's calls in the order it made them" \
	"diff -q <(calls c.trace | awk -F'[(,]' '{print \$2}') <(seq 0 2999)"
check "-F retval, 8 threads: exactly thread 0's 3000 calls, each with its values" \
	"[[ \$(wc -l <twant) == 3000 ]] && cmp -s twant tgot"
rm -f h.trace*
run -o h.trace -F 'deep@if:retval/d32>=3' -F 'big@if:retval/d32>=0' -F 'jumpy@if:retval/d32==1' \
	-F 'raiser@if:retval/d32>=0' -F 'forker@if:retval/d32==1' -F 'quitter@if:retval/d32==1' \
	-R 'deep@retval/d32' -- "$demo" held
"$pk" replay h.trace >h.replay 2>&1
count() { # FILE FUNCTION: its calls in report of FILE alone
	"$pk" report --raw "$(alone "$1")" 2>/dev/null | awk -v f="$2" '$(NF-1) == f {print $1}'
}
check "-F retval, recursion: deep(5..3) kept, nested, deep(2..0) not" \
	"grep -qF '|     deep() = 3;' h.replay && grep -qF '| } = 5; /* deep */' h.replay"
check "-F retval: a signal handler's held calls inside a held call (deep(4), deep(3)) decided alone" \
	"[[ \$(count h.trace deep) == 5 && -z \$(count h.trace raiser) ]]"
check "-F retval: a thread that ends inside a held call keeps it" "[[ \$(count h.trace quitter) == 1 ]]"
check "-F retval: a call that forks: not kept in the parent (it returns 0)" "[[ -z \$(count h.trace forker) ]]"
hchild=$(ls h.trace.* 2>/dev/null | head -1)
check "-F retval: the fork child's file (${hchild:-none}) has its callee, no held entry of the parent's" \
	"[[ -n '$hchild' && \$(count $hchild inner) == 1 ]] && ! $pk replay $hchild 2>&1 | grep -q 'forker() {'"

n_held_inner=$(sed -n 's/^inner //p' out)
check "-F retval: a call whose callees overflow the hold is kept, every callee ($n_held_inner) too" \
	"[[ \$(count h.trace inner) == $n_held_inner && \$(count h.trace big) == 1 ]]"
check "-F retval: a call left by longjmp is kept (no value to decide on)" "[[ \$(count h.trace jumpy) == 1 ]]"
rm -f hr.trace*
run -o hr.trace --ring=4M -F 'deep@if:retval/d32>=3' -F 'big@if:retval/d32>=0' -- "$demo" held
check "-F retval with --ring: a hold that fills goes on whole (every inner call, $n_held_inner), deep kept 3 + 2 (the handler's)" \
	"[[ $rc == 0 && \$(count hr.trace inner) == $n_held_inner && \$(count hr.trace deep) == 5 && \$(count hr.trace big) == 1 ]]"
check "-F retval: nothing lost" "$pk report --raw \$(alone h.trace) | head -1 | grep -q ', 0 lost,'"
# The settings go on to a program exec'd: its -F and -A hold there too.
rm -f x.trace*
run -o x.trace -A 'pick@arg1/d32' -F 'pick@if:arg1/d32==7' -- sh -c "exec '$demo' cond 1000"
xfile=$(grep -l . x.trace* 2>/dev/null | while read -r f; do
	"$pk" report "$f" 2>/dev/null | grep -q ' pick ' && echo "$f"; done | head -1)
check "-F through exec: the exec'd program's file (${xfile:-none}) has the one call" \
	"[[ -n '$xfile' && \$(calls $xfile | grep -c '^pick(7) {') == 1 && \$(calls $xfile | grep -c '^pick') == 1 ]]"
# std::string (S), libstdc++'s and, where clang++ builds with it, libc++'s.
# twice() returns one by value: its hidden result pointer is rdi, so its
# string is arg2, and rax points at the result at the exit.
strs_check() { # LABEL PROG
	run -o s.trace -A 'slen@arg1/S' -R 'slen@retval/u' -A 'twice@arg2/S' -R 'twice@retval/S' -- "$2"
	check "$1: rc $rc" "[[ $rc == 0 ]]"
	sed -n 's/^want //p' out | grep -v '^byval' >swant # (byval: -a's, below)
	calls s.trace | grep -v '^byval' >sgot
	check "$1: each std::string as the program sees it" "[[ -s swant ]] && diff -u swant sgot"
}
strs_check "S (libstdc++)" "$strs"
run -o sa.trace -a -- "$strs"
check "-a, g++: a std::string passed by value goes by reference, the int after it right" \
	"[[ $rc == 0 ]] && $pk replay sa.trace | grep -qF 'byval(\"by value\", 7) = 15;'"
if command -v clang++ >/dev/null &&
	env -u LD_PRELOAD clang++ -stdlib=libc++ -O2 -o strs_llvm "$here/strs_demo.cc" 2>/dev/null; then
	strs_check "S (libc++)" ./strs_llvm
else
	echo "SKIP (part): S with libc++: clang++ -stdlib=libc++ cannot build (apt-get install clang libc++-dev libc++abi-dev)"
fi

# -a: every traced function's arguments from DWARF, checked against gdb's
# `info args` at the same calls; the same through a separate debug file;
# an explicit -A wins over DWARF's.
afuncs=(f_int f_fp f_str f_struct f_bool f_ret_big many)
run -o au.trace -a -- "$auto"
check "-a: rc $rc" "[[ $rc == 0 ]]"
"$pk" replay au.trace >au.replay 2>&1
check "-a: structs by value by their members ('?': an array's), the arguments after them read right" \
	"grep -qF 'f_struct({x=1, y=2}, 10, ?, 20, {a=1.5, b=2.5}, 0.5) = 36;' au.replay"
check "-a: a pointer to a struct followed, NULL, unreadable" \
	"grep -qF 'f_ptr({x=1, y=2}) = 3;' au.replay && grep -qF 'f_ptr((null)) = -1;' au.replay &&
	 grep -qF 'f_ptr(0x10 <unreadable>) = -1;' au.replay"
check "-a: the return value too" "grep -qF 'many(1, -2, 3, -4, 5, -6, 7, -8) = -4;' au.replay"
if command -v gdb >/dev/null; then
	# (not under a sanitizer's preloaded runtime: gdb would run with it too)
	env -u LD_PRELOAD timeout 120 python3 "$here/gdb_args.py" "$auto" au.replay "${afuncs[@]}" \
		>gdb.out 2>&1
	check "-a: the values gdb's info args shows ($(tail -1 gdb.out))" \
		"grep -qx '${#afuncs[@]} compared, 0 differ' gdb.out"
else
	echo "SKIP (part): -a against gdb: no gdb"
fi
if command -v objcopy >/dev/null; then
	cp "$auto" stripped && env -u LD_PRELOAD objcopy --only-keep-debug stripped stripped.debug &&
		env -u LD_PRELOAD strip --strip-all stripped && env -u LD_PRELOAD objcopy --add-gnu-debuglink=stripped.debug stripped
	run -o aus.trace -a -- ./stripped
	check "-a: DWARF from a separate debug file" \
		"[[ $rc == 0 ]] && $pk replay aus.trace | grep -qF 'f_str(\"hello\", GREEN) = 10;'"
fi
run -o auo.trace -a -A 'f_int@arg1/x32' -- "$auto"
check "-a: an explicit -A wins" "$pk replay auo.trace | grep -qF 'f_int(0xfffffffd);'"

# Bad specs: refused before PROG runs, with what is wrong.
bad_spec() { # LABEL WANT ARGS...
	local label=$1 want=$2
	shift 2
	"$pk" trace --no-libcall -o x.trace "$@" -- "$demo" >out 2>err
	rc=$?
	check "$label: refused (rc $rc)" "[[ $rc != 0 && ! -s out ]]"
	check "$label: says '$want'" "grep -qF -- \"$want\" err"
}
bad_spec "unknown format" "unknown format 'q'" -A 'add@arg1/q'
bad_spec "size of a string" "format s takes no size" -A 'slen@arg1/s32'
bad_spec "fparg with d" "fparg takes no format but f" -A 'scale@fparg1/d'
bad_spec "no spec" "GLOB@SPEC expected" -A 'add'
bad_spec "-R with arguments" "the return value only" -R 'add@arg1'
bad_spec "retval with --entry-only" "not with --entry-only" --entry-only -R 'add'
bad_spec "bad register" "unknown location" -A 'add@arg1%rax'
bad_spec "arg0" "arg takes N from 1" -A 'add@arg0'
bad_spec "-F without if:" "GLOB@if:COND expected" -F 'add@arg1==3'
bad_spec "-F on retval with --entry-only" "not with --entry-only" --entry-only -F 'add@if:retval<0'
bad_spec "-F on fparg" "a condition is on argN" -F 'add@if:fparg1<0'
bad_spec "-F string with <" "strings compare with == and != only" -F 'slen@if:arg1<"a"'
bad_spec "-F bad value" "the value is an integer or a quoted string" -F 'add@if:arg1==x'
bad_spec "-F empty term" "an empty term" -F 'add@if:arg1==3 &&'

echo "trace_args: $pass passed, $fail failed"
[[ $fail == 0 ]]
