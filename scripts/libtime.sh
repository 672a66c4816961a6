#!/usr/bin/env bash
# Library calls timed: `probekit trace --relocate-all --int3` against
# uftrace's library-call tracing (its PLT hooks, `uftrace record -P main`) on
# the same runs of Debian's sqlite3, xz and python3.  probekit is given the library
# functions uftrace saw (-f each), so both time the same functions; probekit
# also sees the calls a library makes to its own exported functions, uftrace
# only the program's calls through the PLT.  An alias (fopen64) is reported
# under the name probekit gives the address (fopen); glibc's IFUNC functions
# (strlen, memcpy) under the IFUNC's name where the object's relocations
# say which implementation it chose.  Prints, per function: both counts and
# total times, and the ratio of the times where the counts are equal.
# Checks that every run gives the plain run's output and that probekit
# counts at least uftrace's calls of every function.  The times are
# figures, not a verdict (both tools add their own cost to each call).
#
# usage: scripts/libtime.sh [PROG...]   (sqlite3 xz python3; default all)
# Exit status: 0 when outputs and counts hold; 1 otherwise; 77 without
# uftrace.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PROBEKIT=$(realpath "${PROBEKIT:-$repo/build/cli/probekit}")
command -v uftrace >/dev/null || { echo "libtime: no uftrace: nothing to compare"; exit 77; }
W=$(mktemp -d)
[[ ${KEEP:-} ]] || trap 'rm -rf "$W"' EXIT
cd "$W" || exit 1
progs=("$@")
((${#progs[@]})) || progs=(sqlite3 xz python3)
bad=0

workload() { # PROG: the command line, its stdin in in.$PROG
	case $1 in
	sqlite3)
		cat >in.sqlite3 <<'SQL'
create table t(a integer primary key, b text);
with recursive c(x) as (select 1 union all select x+1 from c where x < 20000)
  insert into t select x, hex(x * 2654435761 % 4294967296) from c;
select count(*), sum(length(b)) from t where b like '%AB%';
create index ib on t(b);
select count(*) from t where b > '8';
SQL
		echo /usr/bin/sqlite3 :memory: ;;
	xz)
		seq 1 200000 >in.xz
		echo /usr/bin/xz -T2 -c ;;
	python3)
		cat >in.python3 <<'PY'
import json, re
rows = [{"k": i, "v": hex(i * 2654435761 % 4294967296)} for i in range(20000)]
text = json.dumps(rows)
print(len(text), len(re.findall(r"[A-F]{3}", text.upper())), len(json.loads(text)))
PY
		echo /usr/bin/python3.11 -I - ;;
	esac
}

for p in "${progs[@]}"; do
	cmd=$(workload "$p")
	[[ -x ${cmd%% *} ]] || { echo "libtime: $p: not installed"; continue; }
	$cmd <in.$p >plain.out 2>/dev/null
	rm -rf u.data
	uftrace record -P main -d u.data $cmd <in.$p >u.out 2>u.err
	uftrace report -d u.data >u.rep 2>/dev/null
	fns=$(awk 'NR > 2 && $NF !~ /:/ && $NF != "main" {print $NF}' u.rep | sort -u)
	args=()
	for f in $fns; do args+=(-f "$f"); done
	"$PROBEKIT" trace --relocate-all --int3 "${args[@]}" -o p.trace -- $cmd <in.$p >p.out 2>p.err
	"$PROBEKIT" report p.trace >p.rep 2>&1
	for o in u p; do
		cmp -s plain.out $o.out || { echo "libtime: $p: the $o run's output differs"; bad=1; }
	done
	python3 - "$p" u.rep p.rep <<'PY' || bad=1
import re, sys
name, urep, prep = sys.argv[1:]
unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
def t(v, u): return float(v) * unit[u]
uf = {}
for line in open(urep):
    m = re.match(r"\s*([\d.]+) (\w+)\s+([\d.]+) (\w+)\s+(\d+)\s+(\S+)$", line)
    if m and m.group(6) != "main" and ":" not in m.group(6):
        uf[m.group(6)] = (int(m.group(5)), t(m.group(1), m.group(2)))
pk = {}
for line in open(prep):
    m = re.match(r"\s*(\d+)\s+([\d.]+) (\w+)\s+.*\s(\S+) \[", line)
    if m:
        c, tot = int(m.group(1)), t(m.group(2), m.group(3))
        old = pk.get(m.group(4), (0, 0.0))
        pk[m.group(4)] = (old[0] + c, old[1] + tot)
ok, ratios = True, []
print(f"{name}: {'function':28} {'uftrace calls':>13} {'probekit':>9} {'uftrace time':>13} {'probekit':>12} {'ratio':>6}")
for f in sorted(uf, key=lambda f: -uf[f][1]):
    uc, ut = uf[f]
    pc, pt = pk.get(f, (0, 0.0))
    r = pt / ut if uc == pc and ut > 0 else None
    if r is not None: ratios.append(r)
    print(f"{name}: {f:28} {uc:13} {pc:9} {ut*1e6:11.1f}us {pt*1e6:10.1f}us {r if r is None else round(r, 2)!s:>6}")
    if pc < uc:
        print(f"{name}: {f}: probekit counted fewer calls than uftrace"); ok = False
ratios.sort()
if ratios:
    print(f"{name}: {len(ratios)} functions with equal counts; time ratio probekit/uftrace median {ratios[len(ratios)//2]:.2f}")
sys.exit(0 if ok else 1)
PY
done
exit $bad
