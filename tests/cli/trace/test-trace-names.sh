#!/usr/bin/env bash
# C++ names in every view: tests/cli/trace/names_demo (a namespace, an
# overloaded method, a template instantiated twice, an operator, an extern
# "C" function) traced; the report shows the names demangled (simple by
# default, full or as spelt on request) with the program's own counts; -f
# and -N select by demangled name, with and without parameters; sites,
# replay and export say the same names.
#
# usage: test-trace-names.sh PROBEKIT NAMES_DEMO
set -uo pipefail
pk=$(realpath "$1") demo=$(realpath "$2")
. "$(dirname "$(realpath "$0")")/lib.sh"

# report --raw's rows of the demo's own functions (app::*, plain_c; not main,
# nor a sanitizer's module constructors) as "NAME CALLS", overloads summed.
named() {
	"$pk" report --raw "$@" 2>/dev/null | awk 'NR > 2 && NF > 1 {
		n = $NF; if (n ~ /^\[/) n = $(NF-1); if (n ~ /^app::/ || n == "plain_c") c[n] += $1 }
		END {for (n in c) print n, c[n]}' | sort
}

vs_plain names n.trace "$demo"
check "names: rc $rc" "[[ $rc == 0 ]]"
want out >exp
named n.trace >got
check "names: the report's demangled names and counts are the program's own" "diff -u exp got"
check "names: --no-demangle shows the mangled name" \
	"$pk report --no-demangle n.trace | grep -q ' _ZN3app6Parser5parseEi \\[names_demo\\]$'"
check "names: --demangle=full shows the parameters" \
	"$pk report --demangle=full n.trace | grep -q ' app::Parser::parse(int) \\[names_demo\\]$'"
check "names: --demangle=bad is refused" "! $pk report --demangle=bad n.trace 2>err && grep -q 'no, simple or full' err"
check "names: replay shows them demangled" "$pk replay n.trace | grep -qF 'app::twice<double>();'"
check "names: the Chrome export shows them demangled" \
	"$pk export --format chrome n.trace | grep -q '\"name\":\"app::Vec::operator+\"'"

# -f/-N by demangled name: a namespace glob, a full name with its parameters.
run -o f.trace -f 'app::Parser::*' -f 'app::twice<int>' -- "$demo"
check "-f demangled: rc $rc" "[[ $rc == 0 ]]"
check "-f demangled: the selection" \
	"[[ \"\$(named f.trace | tr '\\n' ' ')\" == 'app::Parser::parse 12 app::twice<int> 4 ' ]]"
run -o g.trace -f 'app::*(int)' -N 'app::twice*' -- "$demo"
check "-f with parameters, -N demangled: the selection" \
	"[[ \"\$(named g.trace | tr '\\n' ' ')\" == 'app::Parser::parse 5 ' ]]"
run -o h.trace -f '_ZN3app5twiceIdEET_S1_' -- "$demo"
check "-f by the mangled name still works" "[[ \"\$(named h.trace)\" == 'app::twice<double> 3' ]]"

# sites: listed and selected by demangled name.
check "sites -g demangled" \
	"[[ \"\$($pk sites -g 'app::twice*' "$demo" | awk '{print \$3}' | sort | tr '\\n' ' ')\" == 'app::twice<double> app::twice<int> ' ]]"
check "sites --demangle=full" "$pk sites --demangle=full \"$demo\" | grep -q ' int app::twice<int>(int)$'"

echo "trace_names: $pass passed, $fail failed"
[[ $fail == 0 ]]
