#!/usr/bin/env bash
# The CI-sized run of scripts/realprog.sh: lua (and the other programs named
# in $PKT_REALPROG, default "lua") from Debian's sources, at scale 1, with
# uftrace left out (-q: it is not judged, and it crashes lua).  Passes when
# the traced runs' exit status, stdout and files are the plain runs', and
# every function's call count in `probekit report` equals the
# -finstrument-functions counter's.  Skips (77) when the sources cannot be
# had, saying why.  The builds are cached in BUILD/realprog.
#
# usage: test-realprog.sh PROBEKIT BUILD_ROOT
set -uo pipefail
pk=$(realpath "$1") root=$(realpath "$2")
if [[ -n ${PKT_SAN_PRELOAD:-} ]]; then
	echo "SKIP: realprog does not run under the sanitizers (the programs would need their runtime)"
	exit 77
fi
unset LD_PRELOAD
read -ra progs <<<"${PKT_REALPROG:-lua}"
PROBEKIT=$pk RP_DIR=$root/realprog \
	"$(dirname "$(realpath "$0")")/../../scripts/realprog.sh" -q -s 1 "${progs[@]}"
rc=$?
((rc == 77)) && echo "SKIP: no program could be built (reason above)"
exit $rc
