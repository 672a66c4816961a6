#!/usr/bin/env bash
# The man page and the --help texts agree: the built man page's SYNOPSIS is
# made from every command's usage (doc/synopsis.py), so each command and
# benchmark must be in it, in the order 'probekit --help' lists them with
# bench last; every option that a command's --help lists must be described
# in the man page too; every command's --help says its exit statuses, and
# the man page's EXIT STATUS carries them; groff renders the page without a
# warning.
#
# usage: test-man.sh PROBEKIT MANPAGE
set -uo pipefail
pk=$1 man=$2
pass=0 fail=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
# The page's text with troff's escapes for '-' undone; body: without the
# SYNOPSIS (made from the --help texts, it proves nothing about them).
text=$(sed 's/\\-/-/g; s/\\(em/--/g' "$man")
body=$(awk '/^\.SH SYNOPSIS/ { skip = 1; next } /^\.SH / { skip = 0 } !skip' <<<"$text")
# names HEADING TEXT: the names listed under "HEADING:" in a --help text.
names() { awk -v h="$1:" '$0 == h { on = 1; next } on && /^  [^ ]/ { print $1; next } on && NF { exit }'; }

cmds=$("$pk" --help | names commands)
[[ -n $cmds ]] || bad "no commands in probekit --help"
for c in $cmds; do
	helps=("$c")
	if [[ $c == bench ]]; then
		helps=()
		for b in $("$pk" bench --help | names benchmarks); do helps+=("bench $b"); done
	fi
	for h in "${helps[@]}"; do
		# shellcheck disable=SC2086 # "bench NAME": two words
		help=$("$pk" $h --help 2>&1) || { bad "probekit $h --help failed"; continue; }
		if grep -qF "probekit $h" <<<"$(awk '/^\.SH SYNOPSIS/,/^\.SH DESCRIPTION/' <<<"$text")"; then
			pass=$((pass + 1))
		else
			bad "'probekit $h' is not in the man page's SYNOPSIS"
		fi
		# Options: the words that start the lines of the help's option list.
		for o in $(grep -oE '^ +(-[A-Za-z0-9], )?--[a-z][a-z0-9-]*' <<<"$help" | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u); do
			if grep -qE -- "(^|[^a-z-])$o([^a-z-]|$)" <<<"$body"; then
				pass=$((pass + 1))
			else
				bad "probekit $h: option $o is not described in the man page"
			fi
		done
	done
done
# The commands in the order the SYNOPSIS first names them.
order=$(awk '/^\.SH SYNOPSIS/ { on = 1; next } /^\.SH / { on = 0 } on && $1 == "probekit" && $2 !~ /^</ && !seen[$2]++ { print $2 }' <<<"$text")
want=$(for c in $cmds; do "$pk" "$c" --help | grep -q '^benchmarks:$' || echo "$c"; done
       for c in $cmds; do "$pk" "$c" --help | grep -q '^benchmarks:$' && echo "$c"; done)
if [[ $order == "$want" ]]; then
	pass=$((pass + 1))
else
	bad "the SYNOPSIS names the commands in the order ${order//$'\n'/ }, not ${want//$'\n'/ }"
fi

# EXIT STATUS: each command's "Exit status:" paragraph, its words in the
# '.TP' paragraph tagged COMMAND.
status=$(awk '/^\.SH EXIT STATUS/ { on = 1; next } /^\.SH / { on = 0 } on' <<<"$text")
for c in $cmds; do
	said=$("$pk" "$c" --help | awk '/^Exit status: / { on = 1; sub(/^Exit status: /, "") } on && !NF { exit } on')
	if [[ -z $said ]]; then
		bad "probekit $c --help has no 'Exit status:' paragraph"
	elif awk -v c=".B $c" 'tp && $0 == c { on = 1; next } on { print; exit } { tp = $0 == ".TP" }' <<<"$status" |
		grep -qxF "$(tr '\n' ' ' <<<"$said" | tr -s ' ' | sed 's/ $//')"; then
		pass=$((pass + 1))
	else
		bad "probekit $c: its exit statuses are not the man page's EXIT STATUS"
	fi
done

warnings=$(groff -man -ww -z "$man" 2>&1)
if [[ -z $warnings ]]; then
	pass=$((pass + 1))
else
	bad "groff: $warnings"
fi
echo "man: $pass passed, $fail failed"
[[ $fail == 0 ]]
