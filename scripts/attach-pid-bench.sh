#!/usr/bin/env bash
# Attaching to a running server, measured (doc/benchmarks.md; doc/tracing.md,
# "Trace a process that is already running"): a generated server of 8 threads and FUNCS functions
# (each request runs 16 of them through a table, so every one is called),
# loaded by a client of 4 threads that checks every answer against its own
# computation, then CYCLES attach/trace/detach cycles of
# `probekit trace -p SERVER` with every function selected.  Prints, as a
# Markdown table: the command's time to recording (attach, hooks in place),
# the time a thread of the server was stopped, the detach time, the
# client's throughput during the cycles against before them, its errors;
# and, side by side in the same run, `gdb -p PID -batch` attach+detach and
# bpftrace attaching uprobes to 100 of the functions then exiting (each only
# if installed).
#
# usage: scripts/attach-pid-bench.sh [-n FUNCS] [-c CYCLES] [-d SECONDS]
#   -n FUNCS   functions in the server (default 10000)
#   -c CYCLES  attach/trace/detach cycles (default 100)
#   -d SECONDS each cycle's --duration (default 0.05)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
pk=${PROBEKIT:-$repo/build/cli/probekit}
funcs=10000 cycles=100 dur=0.05
while getopts n:c:d: o; do
	case $o in
	n) funcs=$OPTARG ;;
	c) cycles=$OPTARG ;;
	d) dur=$OPTARG ;;
	*) sed -n '2,/^set/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
	esac
done
[[ -x $pk ]] || { echo "no $pk: build first (./dev build)" >&2; exit 1; }
dir=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	rm -rf "$dir"
}
trap cleanup EXIT

# The server and its client, one program: `server SOCKET` or `client SOCKET SECONDS`.
python3 - "$funcs" >"$dir/srv.c" <<'EOF'
import sys
n = int(sys.argv[1])
print("#include <pthread.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>")
print("#include <sys/socket.h>\n#include <sys/un.h>\n#include <time.h>\n#include <unistd.h>")
print("typedef unsigned long (*fn_t)(unsigned long);")
for i in range(n):
    print(f"__attribute__((noinline)) unsigned long f{i}(unsigned long x) "
          f"{{ return x * {2 * i + 3}ul + {i}ul; }}")
print(f"static const fn_t fns[{n}] = {{" + ",".join(f"f{i}" for i in range(n)) + "};")
print(f"#define N {n}")
print(r'''
static unsigned long answer(unsigned long k)
{
	unsigned long x = k;

	for (unsigned long j = 0; j < 16; j++)
		x = fns[(k * 16 + j) % N](x);
	return x;
}

static int lsock;

static void *serve(void *arg)
{
	(void)arg;
	for (;;) {
		int c = accept(lsock, NULL, NULL);
		unsigned long k, r;

		if (c < 0)
			continue;
		while (read(c, &k, 8) == 8) {
			r = answer(k);
			if (write(c, &r, 8) != 8)
				break;
		}
		close(c);
	}
	return NULL;
}

static volatile long ok, bad;
static const char *path;

static void *load(void *arg)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	unsigned long k = (unsigned long)arg * 1000003ul, r;
	int s = socket(AF_UNIX, SOCK_STREAM, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	if (connect(s, (struct sockaddr *)&a, sizeof(a)))
		exit(3);
	for (;; k++) {
		if (write(s, &k, 8) != 8 || read(s, &r, 8) != 8) {
			__atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
			exit(4);
		}
		__atomic_fetch_add(r == answer(k) ? &ok : &bad, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t t;
	struct timespec ts;

	if (argc < 3)
		return 2;
	path = argv[2];
	if (!strcmp(argv[1], "server")) {
		struct sockaddr_un a = {.sun_family = AF_UNIX};

		lsock = socket(AF_UNIX, SOCK_STREAM, 0);
		snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
		if (bind(lsock, (struct sockaddr *)&a, sizeof(a)) || listen(lsock, 64))
			return 3;
		for (int i = 0; i < 8; i++)
			pthread_create(&t, NULL, serve, NULL);
		printf("ready %d\n", getpid());
		fflush(stdout);
		pause();
	}
	for (long i = 0; i < 4; i++)
		pthread_create(&t, NULL, load, (void *)i);
	/* Every 10 ms: monotonic ms, answers right so far, wrong so far. */
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		printf("%lld %ld %ld\n", (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000, ok, bad);
		fflush(stdout);
		usleep(10000);
	}
}
''')
EOF
gcc -O1 -pthread -fpatchable-function-entry=5 "$dir/srv.c" -o "$dir/srv" || exit 1
"$dir/srv" server "$dir/sock" >"$dir/srv.out" &
srv=$!
pids+=("$srv")
for ((k = 0; k < 500; k++)); do grep -q ready "$dir/srv.out" && break; sleep 0.01; done
"$dir/srv" client "$dir/sock" >"$dir/cli.out" &
pids+=("$!")
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# The client's last line: "MS RIGHT WRONG" (its clock, answers so far).
last() { tail -1 "$dir/cli.out"; }
sleep 2
b0=$(last)
sleep 2
b1=$(last)

# The cycles.
: >"$dir/cycles"
c0=$(last)
for ((i = 0; i < cycles; i++)); do
	t0=$(date +%s%N)
	"$pk" trace -p "$srv" --duration "$dur" -o "$dir/t.trace" 2>"$dir/cmd"
	rc=$?
	t1=$(date +%s%N)
	att=$(sed -n 's/.*attached to process [0-9]* in \([0-9.]*\) ms (a thread stopped \([0-9.]*\) ms.*/\1 \2/p' "$dir/cmd")
	det=$(sed -n 's/.*detached from process [0-9]* in \([0-9.]*\) ms.*/\1/p' "$dir/cmd")
	echo "$rc ${att:-- -} ${det:--} $(((t1 - t0) / 1000000))" >>"$dir/cycles"
done
c1=$(last)
sleep 0.5
kill -0 "$srv" 2>/dev/null && alive=yes || alive=NO

# Throughput before and during, and errors, from the client's lines.
rate() { # FROM TO (two client lines): answers per second between them
	echo "$1 $2" | awk '{printf "%.0f", ($5 - $2) / (($4 - $1) / 1000)}'
}
before=$(rate "$b0" "$b1")
during=$(rate "$c0" "$c1")
errors=$(tail -1 "$dir/cli.out" | awk '{print $3}')

med() { sort -n | awk '{v[NR] = $1} END {if (NR) printf "%.2f (max %.2f)", v[int((NR + 1) / 2)], v[NR]; else printf "-"}'; }
failed=$(awk '$1 != 0' "$dir/cycles" | wc -l)
echo "| measure | $funcs functions, $cycles cycles of --duration $dur |"
echo "|---|---|"
echo "| attach to recording, ms (median, max) | $(awk '$1 == 0 {print $2}' "$dir/cycles" | med) |"
echo "| the first attach (the agent loaded, not reused), ms | $(awk 'NR == 1 && $1 == 0 {print $2}' "$dir/cycles") |"
echo "| a thread of the server stopped, ms | $(awk '$1 == 0 {print $3}' "$dir/cycles" | med) |"
echo "| detach with every function hooked, ms | $(awk '$1 == 0 {print $4}' "$dir/cycles" | med) |"
echo "| the whole command, ms | $(awk '$1 == 0 {print $5}' "$dir/cycles" | med) |"
echo "| cycles failed | $failed |"
echo "| server alive after | $alive |"
echo "| client: answers/s before, during the cycles | $before, $during (ratio $(awk -v a="$during" -v b="$before" 'BEGIN {printf "%.2f", b ? a / b : 0}')) |"
echo "| client: wrong answers or failed requests | $errors |"
if command -v gdb >/dev/null; then
	t0=$(date +%s%N)
	gdb -nx -p "$srv" -batch >/dev/null 2>&1
	t1=$(date +%s%N)
	echo "| gdb -p PID -batch (attach+detach), ms | $(((t1 - t0) / 1000000)) |"
else
	echo "| gdb -p PID -batch | not installed |"
fi
if command -v bpftrace >/dev/null; then
	probes=$(seq 0 99 | sed "s|^|uprobe:$dir/srv:f|" | paste -sd,)
	t0=$(date +%s%N)
	bpftrace -e "$probes { @n = count(); } interval:ms:100 { exit(); }" >/dev/null 2>&1
	t1=$(date +%s%N)
	echo "| bpftrace: 100 uprobes attached, 100 ms, exit; ms | $(((t1 - t0) / 1000000)) |"
else
	echo "| bpftrace, 100 uprobes | not installed (apt-get install bpftrace) |"
fi
