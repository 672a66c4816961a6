# Shared by the probekit trace test scripts, sourced once their arguments are
# absolute paths ($pk, the command, among them): makes the scratch directory
# $tmp (removed at exit) and enters it.  Sets pass/fail and rc.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
# Sanitizer builds: their runtime must be preloaded before the agent.
if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then export LD_PRELOAD=$PKT_SAN_PRELOAD; else unset LD_PRELOAD; fi
pass=0 fail=0

ok() { pass=$((pass + 1)); }
bad() {
	echo "FAIL: $*"
	for f in out err rep; do
		[[ -s $tmp/$f ]] && { echo "  --- $f:"; sed 's/^/    /' "$tmp/$f" | head -30; }
	done
	fail=$((fail + 1))
}
check() { if eval "$2"; then ok; else bad "$1"; fi; }

# vs_plain's trace options, if any
vs_opts=()
# run ARGS...: probekit trace ARGS, stdout to out, stderr to err; sets rc.
run() {
	"$pk" trace "$@" >out 2>err
	rc=$?
}
# vs_plain LABEL TRACE PROG ARGS...: PROG ARGS run plain (plain.out,
# plain.err, plain_rc), then traced into TRACE (out, err, rc); checks that
# the exit status and stdout are the plain run's.
vs_plain() {
	local label=$1 file=$2
	shift 2
	"$@" >plain.out 2>plain.err
	plain_rc=$?
	run -o "$file" "${vs_opts[@]}" -- "$@"
	check "$label: rc $rc, plain $plain_rc" "[[ $rc == $plain_rc ]]"
	check "$label: stdout differs from a plain run" "cmp -s out plain.out"
}
# alone FILE: the name of a copy of FILE in a directory of its own (no file
# of its session beside it), for a command to read FILE alone.
alone() {
	local d
	d=$(dirname "$1")/alone.$(basename "$1")
	mkdir -p "$d" && cp "$1" "$d/" 2>/dev/null && echo "$d/$(basename "$1")"
}
# counts FILE [PREFIX]: "NAME N" lines of the report of FILE alone, sorted
# (only the functions whose name starts with PREFIX, default demo_, which
# the programs count themselves).
counts() {
	local a
	a=$(alone "$1") || return
	"$pk" report --raw "$a" 2>/dev/null | awk -v pre="${2:-demo_}" '
		NF < 2 {next}
		index($NF, pre) == 1 || index($(NF-1), pre) == 1 {
		n = $NF; if (n ~ /^\[/) n = $(NF-1); print n, $1 }' | sort
}
# want FILE [WHO]: the program's own "calls NAME N" lines (after the line "WHO: ..."), sorted.
want() {
	if [[ -n ${2:-} ]]; then
		awk -v who="$2" '/^[a-z_ ]+: [0-9]+ calls$/ {on = index($0, who ":") == 1; next}
			on && /^calls / {print $2, $3}' "$1" | sort
	else
		awk '/^calls /{print $2, $3}' "$1" | sort
	fi
}
# footnote FILE: "exits-without-entry unwound open" from report --threads
# (the report prints the footnote only when one of them is not 0).
footnote() {
	local f
	f=$("$pk" report --threads "$1" 2>/dev/null | sed -n 's/^# \([0-9]*\) exits without an entry.*, \([0-9]*\) calls closed by an outer exit, \([0-9]*\) calls still open.*/\1 \2 \3/p')
	echo "${f:-0 0 0}"
}
