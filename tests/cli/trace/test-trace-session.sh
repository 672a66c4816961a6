#!/usr/bin/env bash
# A trace session's files read as one: a shell runs trace_modes --fork (its
# file and its child's), then execs trace_modes --exec (which execs itself
# again); report, replay, graph and export (chrome, folded, speedscope,
# perfetto) read every file of the session, --pid keeps some processes, a
# file named directly is read alone, and a file an earlier run left under a
# session name is not read.
#
# usage: test-trace-session.sh PROBEKIT TRACE_MODES PROTO_DIR
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2") protodir=$(realpath "$3")
. "$(dirname "$(realpath "$0")")/lib.sh"

# rows FILE [ARGS...]: "NAME OBJECT CALLS" of report --raw's table, sorted.
rows() {
	"$pk" report --raw "$@" 2>/dev/null | awk '
		/^#/ || $1 == "calls" || NF < 7 {next}
		{print $7, (NF > 7 ? $8 : "-"), $1}' | sort
}
# sum: "NAME OBJECT CALLS" lines of several files added up by NAME OBJECT.
sum() {
	awk '{n[$1 " " $2] += $3} END {for (k in n) print k, n[k]}' | sort
}
# fsum ARGS...: the values of export --format folded --value calls ARGS, added up.
fsum() {
	"$pk" export --format folded --value calls "$@" 2>/dev/null | awk '!/^#/ {n += $NF} END {print n + 0}'
}
# gsum ARGS...: the calls of every path of graph ARGS, added up.
gsum() {
	"$pk" graph "$@" 2>/dev/null | sed -n 's/^.* : [ +-]*(\([0-9]*\)) .*/\1/p' | awk '{n += $1} END {print n + 0}'
}
# tids ARGS...: the thread id of each line of replay ARGS.
tids() {
	"$pk" replay "$@" 2>/dev/null | sed -n 's/^ *[^[]*\[ *\([0-9]*\)\] |.*/\1/p'
}

run -o s.trace -- sh -c "'$demo' --fork >/dev/null; exec '$demo' --exec >/dev/null"
check "trace: rc $rc" "[[ $rc == 0 ]]"
sh=$(ls s.trace.*.1 2>/dev/null | sed 's/^s\.trace\.\([0-9]*\)\.1$/\1/')
kids=$(ls s.trace.* | grep -E '^s\.trace\.[0-9]+$' | sed 's/^s\.trace\.//' | sort -n | xargs)
check "trace: the shell's exec'd program wrote s.trace.PID.1 ($sh)" "[[ -n '$sh' && -s s.trace.$sh.2 ]]"
check "trace: two children (fork parent and child: $kids)" "[[ \$(echo $kids | wc -w) == 2 ]]"
# The fork parent's file has main's call; the child's begins inside it.
parent=${kids%% *} child=${kids##* }
if ! rows "s.trace.$parent" | grep -q '^main '; then
	parent=${kids##* } child=${kids%% *}
fi
cp s.trace alone.trace # the first file under a name of its own: no session beside it

# 1. A file named directly is read alone; FILE reads the session.
"$pk" report "s.trace.$child" >one 2>one.err
check "FILE.PID alone: one process in the header" \
	"[[ \$(grep -c '^# .*: pid [0-9]*,' one) == 1 ]] && grep -q \": pid $child,\" one && ! grep -q 'processes' one"
"$pk" report s.trace >all 2>all.err
check "session: 5 processes listed" "grep -q '^# 5 processes (the session of s.trace)' all && [[ \$(grep -c '^# .*: pid [0-9]*,' all) == 5 ]]"
for p in "$sh" "$parent" "$child"; do
	check "session: header names pid $p" "grep -q \": pid $p,\" all"
done

# 2. The session's counts are the sum of each file's.
for f in alone.trace "s.trace.$parent" "s.trace.$child" "s.trace.$sh.1" "s.trace.$sh.2"; do
	rows "$f"
done | sum >exp
rows s.trace | sum >got
check "session: counts = the sum of the files' counts" "[[ -s exp ]] && diff -u exp got"
events=$(for f in alone.trace "s.trace.$parent" "s.trace.$child" "s.trace.$sh.1" "s.trace.$sh.2"; do
	"$pk" report "$f" 2>/dev/null | sed -n 's/^# .*, \([0-9]*\) events, .*/\1/p'
done | awk '{n += $1} END {print n}')
check "session: events = the sum ($events)" "grep -q \"^# 5 processes.*: $events events\" all"

# 3. --pid keeps one process's files: exactly FILE.PID's figures.
rows "s.trace.$child" >exp
rows s.trace --pid "$child" >got
check "--pid $child: the child's file alone" "[[ -s exp ]] && diff -u exp got"
"$pk" report s.trace --pid "$child" >pid1 2>&1
check "--pid $child: the child's header only" "[[ \$(grep -c '^# .*: pid [0-9]*,' pid1) == 1 ]]"
{ rows "s.trace.$child"; rows "s.trace.$parent"; } | sum >exp
rows s.trace --pid "$parent,$child" | sum >got
check "--pid P,C: both" "diff -u exp got"
rows s.trace --pid "$parent" --pid "$child" | sum >got
check "--pid P --pid C: both" "diff -u exp got"
"$pk" report s.trace --pid 1 >/dev/null 2>err
check "--pid of no process: an error" "[[ \$? == 1 ]] && grep -q 'no process of the session' err"
"$pk" report s.trace --pid x >/dev/null 2>err
check "--pid x: a usage error" "[[ \$? == 2 ]] && grep -q \"'x' is not a process id\" err"

# 4. replay: the parent's main opens, the child's lines come while the
# parent is in fork() or waitpid(), then the parent's: in time order. (Which
# runs first after fork() is the scheduler's choice: the parent may enter
# waitpid() between two of the child's lines.)
seq=$(tids s.trace | grep -E "^($parent|$child)\$" | uniq | tr '\n' ' ')
check "replay: parent, child, parent in time order ($seq)" \
	"[[ '$seq' == '$parent $child '*'$parent ' ]]"
"$pk" replay s.trace >rp 2>&1
check "replay: the processes listed" "grep -q \"^# pid $child .*(s.trace.$child): tid $child\" rp"
"$pk" replay s.trace --pid "$child" | grep -v '^#' >got 2>&1
"$pk" replay "s.trace.$child" | grep -v '^#' >exp 2>&1
check "replay --pid: the child's lines alone" "[[ -s exp ]] && diff -u exp got"
n_all=$(grep -vc '^#' rp)
n_sum=$(for f in alone.trace "s.trace.$parent" "s.trace.$child" "s.trace.$sh.1" "s.trace.$sh.2"; do
	"$pk" replay "$f" 2>/dev/null | grep -vc '^#'
done | awk '{n += $1} END {print n}')
check "replay: every file's lines ($n_all, $n_sum)" "[[ $n_all == $n_sum ]]"

# 5. graph: main's paths over the processes that ran it, their calls added up.
gall=$(gsum main s.trace)
gone=$(for f in alone.trace "s.trace.$parent" "s.trace.$child" "s.trace.$sh.1" "s.trace.$sh.2"; do
	gsum main "$f"
done | awk '{n += $1} END {print n}')
check "graph: every process's calls ($gall, $gone)" "[[ $gall -gt \$(gsum main s.trace.$parent) && $gall == $gone ]]"
"$pk" graph main s.trace >g 2>&1
check "graph: one path per function sequence" "[[ \$(grep -c '(3) main\$' g) == 1 && \$(grep -c '^[^+]*  +-([0-9]*) waitpid\$' g) == 1 ]]"
"$pk" graph main s.trace --pid "$parent" | grep -v '^#' >got 2>&1
"$pk" graph main "s.trace.$parent" | grep -v '^#' >exp 2>&1
check "graph --pid: the parent's paths alone" "[[ -s exp ]] && diff -u exp got"
"$pk" graph main s.trace --pid 1 >/dev/null 2>err
check "graph --pid of no process: an error" "[[ \$? == 1 ]] && grep -q 'graph: s.trace: no process of the session' err"

# 6. export chrome: a pid per process, each named.
"$pk" export --format chrome s.trace >c.json 2>/dev/null
pids=$(python3 -c '
import json, sys
ev = json.load(open("c.json"))["traceEvents"]
print(" ".join(sorted({str(e["pid"]) for e in ev if e["ph"] != "M"}, key=int)))')
want=$(echo "$sh $parent $child" | tr ' ' '\n' | sort -n | tr '\n' ' ')
check "chrome: one pid per process ($pids)" "[[ '$pids ' == '$want' ]]"
check "chrome: processes named" "[[ \$(grep -c '\"process_name\"' c.json) == 3 ]]"
"$pk" export --format folded --value calls s.trace >f.txt 2>/dev/null
fpids=$(grep -v '^#' f.txt | sed 's|^[^;/]*/\([0-9]*\);.*|\1|' | sort -nu | xargs)
check "folded: each stack under its process's PROGRAM/PID ($fpids)" \
	"[[ '$fpids ' == '$want' ]] && grep -q '^trace_modes/$child;' f.txt"
fall=$(fsum s.trace)
fone=$(for f in alone.trace "s.trace.$parent" "s.trace.$child" "s.trace.$sh.1" "s.trace.$sh.2"; do
	fsum "$f"
done | awk '{n += $1} END {print n}')
check "folded: every process's calls ($fall, $fone)" "[[ $fall -gt 0 && $fall == $fone ]]"
check "folded --pid: the child's stacks, no process frame" \
	"[[ \$(fsum s.trace --pid $child) == \$(fsum s.trace.$child) ]] && ! \"$pk\" export --format folded s.trace --pid $child | grep -q '^trace_modes/'"
"$pk" export --format speedscope s.trace >ss.json 2>/dev/null
profiles=$(python3 -c '
import json
d = json.load(open("ss.json"))
n = len(d["shared"]["frames"])
assert all(0 <= e["frame"] < n for p in d["profiles"] for e in p["events"])
print(" ".join(sorted({p["name"].split(": ")[0].split("/")[-1] for p in d["profiles"]}, key=int)))')
check "speedscope: profiles of every process, frames in the table ($profiles)" "[[ '$profiles ' == '$want' ]]"
"$pk" export --format perfetto s.trace -o s.pftrace 2>/dev/null
protoc --decode=perfetto.protos.Trace -I "$protodir" "$protodir/probekit-perfetto.proto" <s.pftrace >p.txt 2>err
ppids=$(awk '/^ *process \{/ {p = 1} p && /pid:/ {print $2; p = 0}' p.txt | sort -n | xargs)
check "perfetto: decodes, a process track per pid ($ppids)" "[[ ! -s err && '$ppids ' == '$want' ]]"
python3 "$(dirname "$(realpath "$0")")/perfetto_check.py" <p.txt >p.chk 2>err
check "perfetto: every sequence consistent ($(tail -1 p.chk))" "[[ \$? == 0 ]] && grep -q '^packets' p.chk"
"$pk" export --format chrome "s.trace.$child" >c1.json 2>/dev/null
check "chrome: FILE.PID alone" "grep -q '\"pid\":$child,' c1.json && ! grep -q '\"pid\":$parent,' c1.json"

# 7. A file an earlier run left under a session name is not read.
"$pk" trace -o old.trace -- "$demo" --exec >/dev/null 2>&1
old=$(ls old.trace.*.1)
cp "$old" s.trace.4194304.1
cp old.trace s.trace.4194305
rows s.trace | sum >got
{ for f in alone.trace "s.trace.$parent" "s.trace.$child" "s.trace.$sh.1" "s.trace.$sh.2"; do
	rows "$f"
done; } | sum >exp
"$pk" report s.trace >/dev/null 2>err
check "stale: not read" "diff -u exp got"
check "stale: said" "grep -q 's.trace.4194304.1 is not of s.trace.s session' err && grep -q 's.trace.4194305 is not of' err"
check "stale: named directly, read" "\"$pk\" report s.trace.4194304.1 2>/dev/null | grep -q 'events'"

echo "trace session: $pass passed, $fail failed"
[[ $fail == 0 ]]
