#!/usr/bin/env bash
# probekit trace against trace_modes (tests/targets/), which prints its own call
# counts ("calls NAME N"): the report's counts must be exactly those; every
# entry has its exit; a crash, fork children, exec, system() and popen()
# children, fexecve/execveat, longjmp, too-deep
# recursion, backtrace() in a signal handler; PROG's stdout and exit status unchanged; the errors.
#
# usage: test-trace-cmd.sh PROBEKIT TRACE_MODES NO_SITES_PROG AGENT BT_SIGNAL
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2") nosites=$(realpath "$3") agent=$(realpath "$4") btsig=$(realpath "$5")
sigview=$(realpath "$6")
. "$(dirname "$(realpath "$0")")/lib.sh"

# 1. The demo: 4 threads, ~200k calls.  Output identical to a plain run;
#    counts exact; every call has its exit.
vs_plain demo demo.trace "$demo"
check "demo: stderr has more than probekit's lines" "! grep -v '^probekit: ' err | grep -q ."
check "demo: summary line" "grep -q '^probekit: wrote .*/demo.trace: [0-9]* events, 5 thread(s), ended at exit' err"
check "demo: nothing lost" "! grep -q 'lost' err"
counts demo.trace >got
want out >exp
check "demo: report counts != the demo's own" "diff -u exp got >diff.out"
[[ -s diff.out ]] && cat diff.out
check "demo: unmatched entries/exits: $(footnote demo.trace)" "[[ '$(footnote demo.trace)' == '0 0 0' ]]"
check "demo: main traced" "$pk report --raw demo.trace | grep -q ' main \[trace_modes\]$'"

# 2. -f / -N select functions.
run -o sel.trace -f 'demo_*' -N demo_leaf -- "$demo"
check "-f/-N: rc $rc" "[[ $rc == 0 ]]"
check "-f/-N: selection" "[[ \$($pk report --raw sel.trace | awk 'NR > 2 {print \$NF == \"[trace_modes]\" ? \$(NF-1) : \$NF}' | sort | tr '\n' ' ') == 'demo_fib demo_stage demo_worker ' ]]"
# As many globs as a command line holds (a script's generated list): 300 -f, one matching.
many=()
for i in $(seq 1 299); do many+=(-f "no_such_fn_$i"); done
run -o many.trace "${many[@]}" -f demo_fib -- "$demo"
check "300 -f globs: rc $rc" "[[ $rc == 0 ]]"
check "300 -f globs: demo_fib alone" "[[ \$($pk report --raw many.trace | awk 'NR > 2 {print \$(NF-1)}' | sort -u) == demo_fib ]]"
check "300 -f globs: the last unmatched one said" "grep -q \"^probekit: -f 'no_such_fn_299' matched no traced function\" err"

# 3. A crash: same death, and the trace holds everything up to it.
vs_plain crash crash.trace "$demo" --crash
if [[ -z ${PKT_SAN_PRELOAD:-} ]]; then # ASan turns the SIGSEGV into exit(1)
	check "crash: rc 139" "[[ $rc == 139 ]]"
	check "crash: ended by signal 11" "$pk report crash.trace 2>/dev/null | grep -q 'ended by signal 11'"
	# ASan's own SIGSEGV handler ends PROG before the recorder's could flush.
	counts crash.trace >got
	want out >exp
	check "crash: counts" "diff -u exp got"
fi

# 4. fork: the child writes crash.trace.PID with its own calls; --no-children none.
rm -f fork.trace*
vs_plain fork fork.trace "$demo" --fork
check "fork: rc $rc" "[[ $rc == 3 ]]"
child=$(ls fork.trace.* 2>/dev/null)
check "fork: one child file ($child)" "[[ \$(echo $child | wc -w) == 1 && $child =~ ^fork.trace.[0-9]+$ ]]"
counts "$child" >got
want out child >exp
check "fork: child counts" "diff -u exp got"
counts fork.trace >got
want out parent >exp
check "fork: parent counts" "diff -u exp got"
check "fork: summary names the child file" "grep -q \"wrote .*/$child:\" err"
rm -f nofork.trace*
run -o nofork.trace --no-children -- "$demo" --fork
check "--no-children: rc $rc" "[[ $rc == 3 ]]"
check "--no-children: no child file" "! ls nofork.trace.* >/dev/null 2>&1"

# 5. exec: the first file ends at exec, the exec'd program writes FILE.PID.1.
"$demo" --exec >plain.out
run -o exec.trace -- "$demo" --exec
check "exec: rc $rc" "[[ $rc == 0 ]]"
check "exec: stdout" "cmp -s out plain.out"
check "exec: first file ended by exec" "$pk report exec.trace 2>/dev/null | grep -q 'ended at exec'"
counts exec.trace >got
want out 'before exec' >exp
check "exec: counts before exec" "diff -u exp got"
next=$(ls exec.trace.*.1 2>/dev/null)
check "exec: FILE.PID.1 written ($next)" "[[ -n '$next' ]]"
counts "$next" >got
want out trace_modes >exp
check "exec: counts after exec" "diff -u exp got"

# 5b. system() and popen(): the agent starts their shell itself, with its
#    settings (glibc's own spawn is out of reach).  dash has no patchable
#    function: it writes no file and says nothing; the commands it runs are
#    traced, into FILE.PID when it vforks them, FILE.SHELLPID.1 when it execs
#    them itself ("exec PROG").  Output, statuses, signal handling (SIGINT
#    and SIGQUIT sent to the caller during system(), its blocked SIGCHLD)
#    and popen's streams exactly as with glibc's own functions.
rm -f sys.trace*
vs_opts=(--no-libcall) # the shell untraced: the program it runs is system()'s child
vs_plain "system" sys.trace "$demo" --system
check "system: rc $rc" "[[ $rc == 5 ]]"
check "system: stderr has more than probekit's lines" "! grep -v '^probekit: ' err | grep -q ."
# (The bits themselves, not the whole masks: a parent that ignores SIGHUP,
# nohup, adds its own; the masks must be the plain run's.)
ign=$(sed -n 's/^SigIgn:[[:space:]]*//p' out | head -1) blk=$(sed -n 's/^SigBlk:[[:space:]]*//p' out | head -1)
check "system: SIGINT/SIGQUIT ignored, SIGCHLD blocked (SigIgn $ign, SigBlk $blk)" \
	"[[ -n '$ign' && \$(( 0x$ign & 6 )) == 6 && \$(( 0x$blk & 0x10000 )) != 0 ]] && grep -q '^SigIgn:[[:space:]]*$ign\$' plain.out && grep -q '^SigBlk:[[:space:]]*$blk\$' plain.out"
child=$(ls sys.trace.* 2>/dev/null)
check "system: one child file ($child)" "[[ \$(echo '$child' | wc -w) == 1 && '$child' =~ ^sys.trace.[0-9]+$ ]]"
counts "$child" >got
want out trace_modes >exp
check "system: child counts" "[[ -s exp ]] && diff -u exp got"
counts sys.trace >got
want out 'before system' >exp
check "system: parent counts" "diff -u exp got"
rm -f nsys.trace*
run -o nsys.trace --no-children -- "$demo" --system
check "system --no-children: rc $rc" "[[ $rc == 5 ]]"
check "system --no-children: stdout" "cmp -s out plain.out"
check "system --no-children: no child file" "! ls nsys.trace.* >/dev/null 2>&1"

rm -f pop.trace*
vs_plain "popen" pop.trace "$demo" --popen
vs_opts=()
check "popen: rc $rc" "[[ $rc == 7 ]]"
check "popen: stderr has more than probekit's lines" "! grep -v '^probekit: ' err | grep -q ."
check "popen: statuses" "grep -q '^pclose(w): 0x600$' out && grep -q '^pclose(b): 0x900$' out && grep -q '^pclose(a): 0x800$' out"
check "popen: earlier stream closed in a later child" "grep -q 'later child: closed' out"
check "popen: bad modes" "[[ \$(grep -c '^popen(..*): NULL Invalid argument$' out) == 2 ]]"
child=$(ls pop.trace.* 2>/dev/null)
check "popen: one child file ($child)" "[[ \$(echo '$child' | wc -w) == 1 && '$child' =~ ^pop.trace.[0-9]+.1$ ]]"
sed -n 's/^popen> //p' out >pout
counts "$child" >got
want pout trace_modes >exp
check "popen: child counts" "[[ -s exp ]] && diff -u exp got"
rm -f npop.trace*
run -o npop.trace --no-children -- "$demo" --popen
check "popen --no-children: rc $rc" "[[ $rc == 7 ]]"
check "popen --no-children: stdout" "cmp -s out plain.out"
check "popen --no-children: no child file" "! ls npop.trace.* >/dev/null 2>&1"

# popen/pclose/system from 4 threads at once (the list and the signal
# count under their locks): every status is the caller's own child's.
rm -f thr.trace*
run -o thr.trace -- "$demo" --shell-threads
check "shell threads: rc $rc" "[[ $rc == 0 ]]"
check "shell threads: results" "grep -q '^shell threads: 0 wrong results$' out"

# A shell with its own setenv/unsetenv (bash) as the program the agent
# enters: it must start (the agent edits environ itself), stay silent (no
# sites), and pass the settings on to what it execs: FILE.PID.1.  (A hang
# here, as before that fix, ends in meson's timeout.)
if command -v bash >/dev/null; then
	rm -f sh.trace*
	(
		# As the command does: the user's LD_PRELOAD (ASan's runtime) saved.
		[[ -n ${LD_PRELOAD:-} ]] && export PROBEKIT_PRELOAD_SAVED=$LD_PRELOAD
		# (bash's own library calls left out: only what it execs is traced)
		export PROBEKIT_TRACE=$tmp/sh.trace PROBEKIT_TRACE_PID=1 PROBEKIT_TRACE_LIBCALL=0
		export LD_PRELOAD=${LD_PRELOAD:+$LD_PRELOAD:}$agent
		exec bash -c "exec '$demo' --threads 1 --iters 1"
	) >out 2>err
	rc=$?
	check "bash: rc $rc" "[[ $rc == 0 ]]"
	check "bash: nothing on stderr" "[[ ! -s err ]]"
	child=$(ls sh.trace.* 2>/dev/null)
	check "bash: FILE.PID.1 ($child)" "[[ \$(echo '$child' | wc -w) == 1 && '$child' =~ ^sh.trace.[0-9]+.1$ ]]"
	counts "$child" >got
	want out trace_modes >exp
	check "bash: counts" "[[ -s exp ]] && diff -u exp got"
fi

# 5c. fexecve and execveat: failed ones leave the trace going (the calls
#     after them are in the first file); a real fexecve ends it and the
#     program writes FILE.PID.1, whose execveat ends that and starts .2.
rm -f fx.trace*
vs_plain "fexecve" fx.trace "$demo" --fexecve
check "fexecve: rc $rc" "[[ $rc == 0 ]]"
check "fexecve: errors" "grep -q '^fexecve(-1): -1 Invalid argument$' out && grep -q '^execveat(missing): -1 No such file' out"
check "fexecve: first file ended by exec" "$pk report fx.trace 2>/dev/null | grep -q 'ended at exec'"
counts fx.trace >got
want out 'before fexecve' >exp
check "fexecve: counts before fexecve (after the failed ones)" "[[ -s exp ]] && diff -u exp got"
one=$(ls fx.trace.*.1 2>/dev/null) two=$(ls fx.trace.*.2 2>/dev/null)
check "fexecve: FILE.PID.1 and FILE.PID.2 ($one $two)" "[[ -n '$one' && '${one%.1}' == '${two%.2}' ]]"
check "fexecve: FILE.PID.1 ended by exec" "$pk report '$one' 2>/dev/null | grep -q 'ended at exec'"
counts "$one" >got
want out 'before execveat' >exp
check "fexecve: counts after fexecve" "[[ -s exp ]] && diff -u exp got"
counts "$two" >got
want out trace_modes >exp
check "execveat: counts after execveat" "[[ -s exp ]] && diff -u exp got"

# 5d. posix_spawn() from a thread with a 48 KiB stack, execv() from a
#    handler on a 16 KiB signal stack, each with PROT_NONE below: the
#    wrappers must not need more stack than glibc's own functions.
"$demo" --small-stacks >plain.out
run -o small.trace -- "$demo" --small-stacks
check "small stacks: rc $rc" "[[ $rc == 0 ]]"
check "small stacks: stdout" "cmp -s out plain.out"
check "small stacks: the exec'd program traced" "[[ -n \$(ls small.trace.*.1 2>/dev/null) ]]"

# 5e. backtrace(buf, 1000) in a handler on a signal stack, below traced
#    frames: the same depth as untraced, and no malloc() in the handler.
"$btsig" >plain.out
run -o bt.trace -- "$btsig"
check "backtrace in a handler: rc $rc" "[[ $rc == 0 ]]"
check "backtrace in a handler: stdout" "cmp -s out plain.out"

# 5d. The library's settings in PROG's environment reach the library inside
#     the agent: PROBEKIT_TEXT_ALIAS=0 keeps the text on its file mapping.
run -o maps.trace -- "$demo" --maps
check "text alias: on by default ($(cat out))" "grep -Eq '^aliased [1-9]' out"
PROBEKIT_TEXT_ALIAS=0 run -o maps.trace -- "$demo" --maps
check "text alias: PROBEKIT_TEXT_ALIAS=0 honoured ($(cat out))" "grep -qx 'aliased 0' out"

# 5e. PROG's environment is the user's: no variable of probekit's, whatever
#     the relocation asked (the settings still reach the programs it execs:
#     ls, run by a shell without patchable entries, is traced by relocation);
#     a user's own library setting stays.
for mode in "" --relocate-all --int3; do
	rm -f envp.trace*
	run $mode -o envp.trace -- /bin/sh -c 'env; exec /bin/ls /'
	check "environment${mode:+ ($mode)}: no PROBEKIT_ variable ($(grep -c '^PROBEKIT_' out))" "[[ $rc == 0 ]] && ! grep -q '^PROBEKIT_' out"
	check "environment${mode:+ ($mode)}: the exec'd ls traced" "grep -Eq '^probekit: wrote .*/envp.trace.[0-9]+.1: [1-9][0-9]* events' err"
done
PROBEKIT_TEXT_ALIAS=0 run -o envp.trace -- /bin/sh -c env
check "environment: the user's PROBEKIT_TEXT_ALIAS kept" "grep -qx PROBEKIT_TEXT_ALIAS=0 out"

# 5f. A script without "#!" runs under /bin/sh, as execvp(3) and env(1) run
#     it: traced, with its arguments, output and exit status; an ELF file
#     of another kind is refused.
printf 'echo "args: $*"\nexit 3\n' >nobang
chmod +x nobang
run -o nobang.trace -- ./nobang x 'y z'
check "no #!: exit status $rc of the script's" "[[ $rc == 3 ]]"
check "no #!: its output" "[[ \"\$(cat out)\" == 'args: x y z' ]]"
check "no #!: /bin/sh traced" "grep -Eq '^probekit: wrote .*/nobang.trace: [1-9][0-9]* events' err"
printf '\177ELF\002\001\001' >badelf
chmod +x badelf
run -o badelf.trace -- ./badelf
check "foreign ELF: refused ($rc)" "[[ $rc == 126 ]] && grep -q 'badelf: not an x86-64 ELF program' err"

# 5g. -f naming a library function PROG does not import (true calls no
# qsort): which library has it (libc, or a sanitizer runtime that
# intercepts it) and the flag that hooks it; with
# --no-libcall, a function PROG calls (malloc: libc's, or a sanitizer
# runtime's that PROG's malloc binds to), the same.
run -o libf.trace -f qsort -- /bin/true
check "-f qsort: which library and flag" "grep -Eq \"^probekit: -f 'qsort': qsort is a function of .*lib(c|asan)\\.so(\\.[0-9]+)? that PROG does not import .*--relocate-all\" err"
run -o libf.trace --no-libcall -f malloc -- /bin/true
check "--no-libcall -f malloc: which library and flags" "grep -Eq \"^probekit: -f 'malloc': malloc is a function of .*lib(c|asan)\\.so(\\.[0-9]+)?: PROG's calls of it are traced without --no-libcall, every caller's with --relocate-all\" err"

# 6. longjmp out of 6 traced frames: each gets its exit at the jump (the
#    agent wraps the longjmp family), none is left to an outer exit; counts exact.
run -o jmp.trace -- "$demo" --longjmp
check "longjmp: rc $rc" "[[ $rc == 0 ]]"
counts jmp.trace >got
want out >exp
check "longjmp: counts" "diff -u exp got"
check "longjmp: none closed by an outer exit ($(footnote jmp.trace))" "[[ '$(footnote jmp.trace)' == '0 0 0' ]]"

# 7. Deeper than the shadow stack (65,536 frames): counts still exact, the
# lost exits reported: main and 70,001 frames of demo_deep, 4,466 too deep.
run -o deep.trace -- "$demo" --deep 70000
check "deep: rc $rc" "[[ $rc == 0 ]]"
counts deep.trace >got
want out >exp
check "deep: counts" "diff -u exp got"
check "deep: lost reported, blamed on the depth" "grep -Eq '^probekit: 4466 events lost in 1 thread\(s\): 4466 exits of frames too deep for exit tracing \(depth limit\)$' err"
"$pk" report deep.trace 2>rep.err >/dev/null
check "deep: report's warning blames the depth, not full buffers" "grep -Eq 'deep.trace: 4466 events were lost \(4466 exits of frames too deep for exit tracing \(depth limit\)\);' rep.err && ! grep -q 'buffers full' rep.err"

# 8. Errors.  (Without --no-relocate, a program without sites is traced by relocation.)
run --no-relocate --no-libcall -- "$nosites"
check "no sites: rc $rc" "[[ $rc == 125 ]]"
check "no sites: message" "grep -q 'no patchable function entries in PROG.*-fpatchable-function-entry=5' err"
# A glob that matches nothing may be meant for a library loaded later: PROG
# runs, and the command says after the run that it never matched.
"$demo" >plain.out 2>/dev/null
plain_rc=$?
run -o glob.trace -f 'nothing_like_this*' -- "$demo"
check "glob: rc $rc, plain $plain_rc" "[[ $rc == $plain_rc ]]"
check "glob: stdout" "cmp -s out plain.out"
check "glob: message" "grep -q \"^probekit: -f 'nothing_like_this\\*' matched no traced function\" err"
check "glob: empty trace" "[[ \$(counts glob.trace) == '' ]]"
run -o glob.trace -f 'demo_*' -N 'demo_*' -- "$demo"
check "-N excludes all: rc $rc" "[[ $rc == 125 ]]"
check "-N excludes all: message" "grep -q 'no function left to trace' err"
cp "$demo" suid_demo && chmod u+s suid_demo
run -- ./suid_demo
check "setuid: rc $rc" "[[ $rc == 126 ]]"
check "setuid: message" "grep -q 'set-user-ID' err"
PROBEKIT_TRACE_ASSUME_SHSTK=1 run -o shstk.trace -- "$demo"
check "shstk: rc $rc" "[[ $rc == 125 ]]"
check "shstk: message" "grep -q 'CET shadow stack.*--entry-only' err"
PROBEKIT_TRACE_ASSUME_SHSTK=1 run -o entry.trace --entry-only -- "$demo"
check "entry-only: rc $rc" "[[ $rc == 0 ]]"
counts entry.trace >got
want out >exp
check "entry-only: counts" "diff -u exp got"
# An entry-only trace has counts, no durations and no nesting:
# the report prints '-' for the times and finds no open calls; the folded
# export of times is empty, of counts one frame deep per function; Chrome's
# has zero-length events.
"$pk" report --threads entry.trace >rep 2>&1
check "entry-only: report has no durations" "grep -q '^ *[0-9][0-9]* *- *- *- *- *-  demo_' rep && ! grep -q 'calls still open' rep"
"$pk" export entry.trace --format folded -o eo.folded >/dev/null 2>&1
check "entry-only: folded (time) has no stack, only the unit line" "[[ \$(grep -vc '^#' eo.folded) == 0 ]] && grep -q '^# probekit folded stacks: VALUE = self time in nanoseconds' eo.folded"
"$pk" export entry.trace --format folded --value calls -o eo.count >/dev/null 2>&1
check "entry-only: folded counts, not nested" "[[ -s eo.count ]] && ! grep -q ';demo_.*;demo_' eo.count"
"$pk" export entry.trace --format chrome -o eo.json >/dev/null 2>&1
check "entry-only: chrome, zero-length events" "grep -q '\"dur\":0' eo.json"
run -o x.trace -- /nonexistent/prog
check "missing PROG: rc $rc" "[[ $rc == 127 ]]"
run --bogus -- "$demo"
check "bad option: rc $rc" "[[ $rc == 125 ]]"

# After PROG ended, the command reads the trace back for its summary, and
# streams it: 4 M calls (8 M events, 128 MB unpacked) in 100 MB of address
# space.  (Not under the sanitizers, whose shadow
# memory needs terabytes of address space.)
if [[ -z ${PKT_SAN_PRELOAD:-} && $(ldd "$pk") != *lib[at]san* ]]; then
	(ulimit -v 100000 && exec "$pk" trace -o big.trace --no-libcall -- "$demo" --bench 4000000) >out 2>err
	rc=$?
	check "summary in bounded memory: rc $rc" "[[ $rc == 0 ]]"
	check "summary in bounded memory: $(head -c 300 err)" \
		"grep -q '^probekit: wrote .*/big.trace: [0-9]\{7\} events, 1 thread(s), ended at exit' err"
	check "summary in bounded memory: 8 M events" "grep -q 'big.trace: 800000[0-9] events' err"
	rm -f big.trace
fi

# The program's view of its signal dispositions is its own: the fatal
# signals the agent catches read as SIG_DFL, its handler replaces ours.
vs_plain sigview sv.trace "$sigview"
check "sigview: SIGTERM, caught by the agent, reads as SIG_DFL" "grep -q '^15: SIG_DFL' out"
# Setting a caught signal back to SIG_DFL changes nothing: the crash still ends the trace.
run -o svc.trace -- "$sigview" --crash
check "sigview --crash: rc $rc" "[[ $rc == 143 ]]"
check "sigview --crash: the trace ended by the signal" "grep -q 'svc.trace: [1-9][0-9]* events, 1 thread(s), ended by signal' err"

# A run that records nothing keeps the trace that was there (and says so);
# --force replaces it; a report of an empty trace warns.
run -o keep.trace -- "$demo" --threads 1
before=$(md5sum <keep.trace)
run -f 'nomatch_*' -o keep.trace -- "$demo" --threads 1
check "empty run: rc $rc, the previous trace kept" "[[ $rc == 0 && \$(md5sum <keep.trace) == '$before' ]]"
check "empty run: says so" "grep -q 'nothing was recorded: the previous .*keep.trace is kept (--force' err && grep -q 'no event was recorded in' err"
check "empty run: no file left aside" "[[ ! -e keep.trace.probekit-old ]]"
run --force -f 'nomatch_*' -o keep.trace -- "$demo" --threads 1
check "--force: replaced by the empty trace" "[[ \$(md5sum <keep.trace) != '$before' ]] && [[ ! -e keep.trace.probekit-old ]]"
"$pk" report keep.trace >/dev/null 2>rep
check "report of an empty trace warns" "grep -q 'keep.trace holds no event' rep"
# A copy left by an interrupted run is never overwritten.
run -o keep.trace -- "$demo" --threads 1
echo precious >keep.trace.probekit-old
run -f 'nomatch_*' -o keep.trace -- "$demo" --threads 1
check "an interrupted run's copy: left alone, said" "[[ \$(cat keep.trace.probekit-old) == precious ]] && grep -q 'keep.trace.probekit-old is there' err"
rm -f keep.trace.probekit-old

echo "trace_cmd: $pass passed, $fail failed"
[[ $fail == 0 ]]
