#!/usr/bin/env bash
# The test suite's part of scripts/distro.sh: Debian's own python3, git,
# bash, coreutils' sort and sqlite3 (whichever are installed; redis-server
# too when it is) traced with --relocate on their workloads, outputs and exit
# statuses compared with plain runs, call counts with uftrace -P .'s.
#
# usage: test-distro.sh PROBEKIT
set -uo pipefail
pk=$(realpath "$1")
if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then
	echo "SKIP: not under the sanitizers (the programs would need their runtime)"
	exit 77
fi
unset LD_PRELOAD
progs=(python3 sqlite3 git bash coreutils)
[[ -x /usr/bin/redis-server ]] && command -v redis-cli >/dev/null && progs+=(redis)
PROBEKIT=$pk "$(dirname "$(realpath "$0")")/../../scripts/distro.sh" "${progs[@]}"
rc=$?
((rc == 77)) && echo "SKIP: none of ${progs[*]} is installed"
exit $rc
