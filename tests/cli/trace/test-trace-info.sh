#!/usr/bin/env bash
# probekit info: each field of a trace file against the truth (the command
# line given, uname, hostname, the CPUs online, the exit status the program
# returned, probekit --version, report --raw's counts, the session of a
# run's files); the exit statuses of
# _exit(), _Exit(), syscall(SYS_exit_group) and a main that leaves by
# syscall(SYS_exit); report's header naming the command line and the
# duration; a file of an older format (no INFO record): "unknown"; a
# missing or corrupt file: a clear error.
#
# usage: test-trace-info.sh PROBEKIT TRACE_MODES LOSSLESS EXIT_DEMO TRACE_GEN
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2") lossless=$(realpath "$3") exitdemo=$(realpath "$4")
gen=$(realpath "$5")
. "$(dirname "$(realpath "$0")")/lib.sh"

# field FILE NAME: the value of "NAME:" in `probekit info FILE`.
field() { "$pk" info "$1" 2>/dev/null | sed -n "s/^$2: *//p"; }

# 1. A run with arguments, every field checked.
before=$(date +%s)
run -o i.trace -- "$demo" --threads 2 --iters 50
after=$(date +%s)
"$pk" info i.trace >info 2>info.err
irc=$?
check "info: exit 0, nothing on stderr (rc $irc: $(cat info.err))" "[[ $irc == 0 && ! -s info.err ]]"
check "info: command line is argv ($(field i.trace 'command line'))" \
	"[[ '$(field i.trace 'command line')' == '$demo --threads 2 --iters 50' ]]"
check "info: program" "[[ '$(field i.trace program)' == '$demo' ]]"
check "info: host is hostname ($(field i.trace host))" "[[ '$(field i.trace host)' == '$(hostname)' ]]"
check "info: kernel is uname's ($(field i.trace kernel))" \
	"[[ '$(field i.trace kernel)' == '$(uname -s) $(uname -r) $(uname -v)' ]]"
check "info: machine is uname -m" "[[ '$(field i.trace machine)' == '$(uname -m)' ]]"
check "info: cpus online ($(field i.trace cpus))" \
	"[[ '$(field i.trace cpus)' == '$(getconf _NPROCESSORS_ONLN) online' ]]"
model=$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo | head -1)
check "info: cpu is /proc/cpuinfo's model name ($(field i.trace cpu))" \
	"[[ -z '$model' || '$(field i.trace cpu)' == '$model' ]]"
check "info: probekit version ($(field i.trace probekit))" \
	"[[ 'probekit $(field i.trace probekit)' == '$("$pk" --version)' ]]"
check "info: options are the trace command line ($(field i.trace options))" \
	"[[ '$(field i.trace options)' == 'probekit trace -o i.trace -- $demo --threads 2 --iters 50' ]]"
check "info: exit status ($(field i.trace ended), rc $rc)" \
	"[[ $rc == 0 && '$(field i.trace ended)' == 'exit status 0' ]]"
check "info: pid is the threads' first tid" \
	"[[ '$(field i.trace pid)' == \$(field i.trace 'thread 1' | sed 's/tid \([0-9]*\),.*/\1/') ]]"
# started: local time, then ISO 8601, the same moment, during the run
iso=$(field i.trace started | sed -n 's/.*(\(.*\))$/\1/p')
t=$(date -d "$iso" +%s 2>/dev/null || echo 0)
check "info: started during the run ($iso: $t in [$before, $after])" "(( t >= before && t <= after ))"
check "info: started in local time too" \
	"[[ '$(field i.trace started)' == \"\$(date -d '$iso' '+%a %b %e %T %Y %Z') (\"* ]]"
ns=$(field i.trace duration | sed -n 's/.*(\([0-9]*\) ns)$/\1/p')
check "info: duration > 0 ($(field i.trace duration))" "[[ -n '$ns' ]] && (( ns > 0 ))"
head=$("$pk" report --raw i.trace 2>/dev/null | head -1)
ev=$(sed -n 's/.*, \([0-9]*\) events, .*/\1/p' <<<"$head")
th=$(sed -n 's/.*, \([0-9]*\) threads, .*/\1/p' <<<"$head")
lo=$(sed -n 's/.* events, \([0-9]*\) lost, .*/\1/p' <<<"$head")
check "info: events, threads, lost are report's ($ev $th $lo)" \
	"[[ -n '$ev' && '$(field i.trace events)' == '$ev' && '$(field i.trace threads)' == '$th' && '$(field i.trace lost)' == '$lo' ]]"
sum=$(grep '^thread [0-9]*:' info | sed 's/.*: \([0-9]*\) events, .*/\1/' | awk '{s += $1} END {print s + 0}')
check "info: one row per thread, their events add up ($sum)" \
	"[[ \$(grep -c '^thread [0-9]*:' info) == '$th' && '$sum' == '$ev' ]]"
"$pk" report --threads --raw i.trace 2>/dev/null | sed -n 's/^# thread \([0-9]*\) (tid \([0-9]*\), \(.*\)): \([0-9]*\) events, \([0-9]*\) lost$/thread \1: tid \2, \3: \4 events, \5 lost/p' >want.threads
grep '^thread [0-9]*:' info | sed 's/:  */: /; s/, exited before the end$//' >got.threads
check "info: per-thread rows are report --threads' ($(wc -l <got.threads))" \
	"[[ -s want.threads ]] && diff -u want.threads got.threads"

# 2. report's header: the command line and the duration.
check "report: header names the command line and the duration ($head)" \
	"grep -Eq '^# $demo --threads 2 --iters 50: pid [0-9]+, [0-9.]+ (ns|us|ms|s), $th threads, $ev events' <<<\"\$head\""

# 3. Exit statuses: a quoted argument and status 2, a signal, _exit()
#    and the like, a fork child's own file, an exec'd program's.
run -o q.trace -- "$demo" 'x y'
check "status 2 ($(field q.trace ended)), argument quoted ($(field q.trace 'command line'))" \
	"[[ $rc == 2 && '$(field q.trace ended)' == 'exit status 2' && \"\$(field q.trace 'command line')\" == \"$demo 'x y'\" ]]"
if [[ -z ${PKT_SAN_PRELOAD:-} ]]; then # ASan's own SIGSEGV handler ends PROG first
	run -o c.trace -- "$demo" --crash
	check "crash: the signal ($(field c.trace ended))" \
		"[[ '$(field c.trace ended)' == 'killed by signal 11 (SIGSEGV)' ]]"
fi
for m in exit:3 Exit:4 sysexit:5; do
	run -o "l$m.trace" -f loss_leaf -- "$lossless" "${m%%:*}" 100
	check "${m%%:*}: status ${m#*:} ($(field "l$m.trace" ended))" \
		"[[ $rc == ${m#*:} && '$(field "l$m.trace" ended)' == 'exit status ${m#*:}' ]]"
done
run -o s.trace -f demo_leaf -- "$exitdemo" sysexit 0 10
check "main left by syscall(SYS_exit, 7): status 7 ($(field s.trace ended))" \
	"[[ $rc == 7 && '$(field s.trace ended)' == 'exit status 7' ]]"
run -o f.trace -- "$demo" --fork
child=$(ls f.trace.* 2>/dev/null | head -1)
check "fork: the child's file, its status and argv ($child: $(field "${child:-none}" ended))" \
	"[[ -n '$child' && '$(field "$child" ended)' == 'exit status 3' && '$(field "$child" 'command line')' == '$demo --fork' ]]"
check "fork: the child's file has the options" \
	"[[ '$(field "${child:-none}" options)' == 'probekit trace -o f.trace -- $demo --fork' ]]"
sid=$(field f.trace session)
check "fork: the first file's session, flagged first ($sid)" \
	"[[ '$sid' =~ ^[0-9a-f]{16}' (first process of the run)'\$ ]]"
check "fork: the child's file of the same session ($(field "${child:-none}" session))" \
	"[[ '$(field "${child:-none}" session)' == '${sid%% *} (another process of the run)' ]]"
check "another run: another session ($(field i.trace session))" \
	"[[ '$(field i.trace session)' != '${sid%% *} '* ]]"
run -o e.trace -- "$demo" --exec
next=$(ls e.trace.* 2>/dev/null | head -1)
check "exec: the first file ended at exec ($(field e.trace ended))" \
	"[[ '$(field e.trace ended)' == exec* ]]"
check "exec: the new program's argv and options ($(field "${next:-none}" 'command line'))" \
	"[[ -n '$next' && '$(field "$next" 'command line')' == '$demo --threads 1 --iters 1' && '$(field "$next" options)' == 'probekit trace -o e.trace -- $demo --exec' ]]"

# 4. A file the library wrote for a program of its own: its argv, no options;
#    an older file (1.7, no INFO record): "unknown", not an error.
"$gen" new.trace
check "library: argv, no probekit options ($(field new.trace options))" \
	"[[ '$(field new.trace 'command line')' == '$gen new.trace' && '$(field new.trace options)' == none* && '$(field new.trace host)' == '$(hostname)' ]]"
check "library: no session ($(field new.trace session))" "[[ '$(field new.trace session)' == none* ]]"
"$gen" old.trace --minor7
"$pk" info old.trace >info 2>info.err
irc=$?
check "1.7 file: read (rc $irc: $(cat info.err))" "[[ $irc == 0 ]] && grep -q '^file: .*(format 1.7,' info"
for f in 'command line' session host kernel machine cpu cpus probekit options; do
	check "1.7 file: $f unknown ($(field old.trace "$f"))" "[[ '$(field old.trace "$f")' == unknown ]]"
done
check "1.7 file: exit status unknown" "[[ '$(field old.trace ended)' == 'at exit (status unknown)' ]]"
check "1.7 file: counts still there" "[[ '$(field old.trace events)' == 40 && '$(field old.trace threads)' == 2 ]]"
check "1.7 file: report's header names the program" \
	"\"$pk\" report old.trace 2>/dev/null | head -1 | grep -q '^# /usr/bin/demo: pid [0-9]*, '"

# 5. Errors: a missing file, a corrupt one, a file cut short.
"$pk" info none.trace >out 2>err
check "missing file: exit 1, says so" "[[ $? == 1 ]] && grep -qx 'probekit: none.trace: No such file or directory' err"
head -c 40 i.trace >bad.trace
"$pk" info bad.trace >out 2>err
check "corrupt file: exit 1, says what is wrong" \
	"[[ $? == 1 ]] && grep -q '^probekit: bad.trace: not a readable trace: offset 16: truncated HEADER record' err"
size=$(stat -c %s i.trace)
head -c $((size - 100)) i.trace >cut.trace
check "cut file: read, the damage and the unknown end said" \
	"[[ \$(field cut.trace ended) == unknown:* ]] && \"$pk\" info cut.trace | grep -q '^damaged: *offset [0-9]*: ' && [[ \$(field cut.trace duration) == 'at least '* ]]"
"$pk" info a b >out 2>err
check "two files: usage error" "[[ $? == 2 ]] && grep -q 'unexpected argument' err"
"$pk" info --help >out
check "--help: usage" "grep -q '^usage: probekit info \[FILE\]' out"

echo "trace_info: $pass passed, $fail failed"
[[ $fail == 0 ]]
