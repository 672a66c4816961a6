#!/usr/bin/env bash
# probekit report / export on a crafted trace (trace_gen.c): exact numbers,
# exact folded stacks, Chrome JSON that parses and holds the right events,
# and clear errors for bad input.
set -euo pipefail
pk=$1
gen=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$gen" "$tmp/t.trace"

# report: everything but the '#' lines is deterministic
"$pk" report "$tmp/t.trace" --raw | grep -v '^#' | grep . >"$tmp/report"
cat >"$tmp/want" <<'END'
     calls        total(ns)         self(ns)          avg(ns)          min(ns)          max(ns)  function
         2              200              150              100              100              100  alpha [libdemo.so]
         6              200              200               50               10              100  gamma
         2               60               20               30               30               30  g
         4               50               50               12                5               20  beta [libdemo.so]
         2               40               40               20               20               20  0x80
         2               20               20               10               10               10  phi
         1                7                7                7                7                7  delta
         2                -                -                -                -                -  ep"s
END
diff -u "$tmp/want" "$tmp/report" || fail "report numbers"

"$pk" report "$tmp/t.trace" --raw --sort calls | awk 'NR==3 {print $1, $NF}' | grep -qx '6 gamma' ||
	fail "--sort calls"
"$pk" report "$tmp/t.trace" --sort name | awk 'NR==3 {print $NF}' | grep -qx '0x80' || fail "--sort name"
"$pk" report "$tmp/t.trace" --threads >"$tmp/threads"
grep -q '^# thread 1 (tid [0-9]*, main): 19 events, 0 lost$' "$tmp/threads" || fail "--threads main"
grep -q '^# thread 2 (tid [0-9]*, worker): 21 events, 0 lost$' "$tmp/threads" || fail "--threads worker"
grep -q '2 exits without an entry (ignored), 2 calls closed by an outer exit, 2 calls still open' \
	"$tmp/threads" || fail "replay footnote"

# folded: self time in ns per stack, both threads merged
"$pk" export "$tmp/t.trace" --format folded -o "$tmp/folded" 2>/dev/null
cat >"$tmp/want" <<'END'
# probekit folded stacks: VALUE = self time in nanoseconds (flamegraph.pl --countname=ns)
alpha 150
alpha;beta 50
ep"s 30
ep"s;delta 7
ep"s;phi 20
g 20
g;0x80 40
gamma 120
gamma;gamma 60
gamma;gamma;gamma 20
END
diff -u "$tmp/want" "$tmp/folded" || fail "folded"
"$pk" export "$tmp/t.trace" --format folded --value calls --threads |
	sed -E 's#^(main|worker)/[0-9]+#\1#' >"$tmp/folded"
cat >"$tmp/want" <<'END'
# probekit folded stacks: VALUE = number of calls (flamegraph.pl --countname=calls)
main;alpha 1
main;alpha;beta 2
main;ep"s 1
main;ep"s;phi 1
main;g 1
main;g;0x80 1
main;gamma 1
main;gamma;gamma 1
main;gamma;gamma;gamma 1
worker;alpha 1
worker;alpha;beta 2
worker;ep"s 1
worker;ep"s;delta 1
worker;ep"s;phi 1
worker;g 1
worker;g;0x80 1
worker;gamma 1
worker;gamma;gamma 1
worker;gamma;gamma;gamma 1
END
diff -u "$tmp/want" "$tmp/folded" || fail "folded --value calls --threads"

# chrome: valid JSON with the right events
"$pk" export "$tmp/t.trace" --format chrome >"$tmp/t.json"
python3 -m json.tool "$tmp/t.json" >/dev/null || fail "chrome export is not valid JSON"
python3 - "$tmp/t.json" <<'END' || fail "chrome events"
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
x = [e for e in ev if e["ph"] == "X"]
m = {e["args"]["name"] for e in ev if e["ph"] == "M"}
assert m == {"/usr/bin/demo", "main", "worker"}, m
assert len(x) == 20, len(x)
assert len({e["tid"] for e in x}) == 2
a = [e for e in x if e["name"] == "alpha"]
assert all(e["ts"] == 0.001 and e["dur"] == 0.1 and e["cat"] == "libdemo.so" for e in a), a
eps = sorted((e["dur"], e.get("args")) for e in x if e["name"] == 'ep"s')
assert eps == [(0.04, {"open": True})], eps
# the worker's, open when its thread exited: no end known, no duration
i = [(e["ts"], e["s"], e["args"]) for e in ev if e["ph"] == "i"]
assert i == [(0.6, "t", {"open": True, "end": "unknown"})], i
h = [e for e in x if e["name"] == "0x80"]
assert all(e.get("args") == {"unwound": True} and e["dur"] == 0.02 for e in h), h
assert d["otherData"]["complete"] is True and d["otherData"]["events"] == 40
# per thread, each event starts no earlier than the one before (parents first)
for tid in {e["tid"] for e in x}:
    ts = [e["ts"] for e in x if e["tid"] == tid]
    assert ts == sorted(ts)
END

# a file cut short: a warning, and the data before the cut
size=$(stat -c %s "$tmp/t.trace")
head -c $((size - 30)) "$tmp/t.trace" >"$tmp/cut.trace"
"$pk" report "$tmp/cut.trace" >"$tmp/out" 2>"$tmp/err" || fail "report on a cut file failed"
grep -q "warning: .*cut.trace: offset [0-9]*: truncated END record" "$tmp/err" || fail "cut warning"
grep -q 'INCOMPLETE' "$tmp/out" || fail "cut file not marked incomplete"
"$pk" export "$tmp/cut.trace" --format chrome 2>/dev/null | python3 -m json.tool >/dev/null ||
	fail "chrome export of a cut file"

# errors
expect_err() { # STATUS PATTERN CMD...
	local want=$1 pat=$2 st=0
	shift 2
	"$@" >/dev/null 2>"$tmp/err" || st=$?
	[[ $st == "$want" ]] || fail "'$*' exited $st, not $want"
	grep -q -- "$pat" "$tmp/err" || fail "'$*': no '$pat' in: $(cat "$tmp/err")"
}
expect_err 1 "$tmp/none: No such file or directory" "$pk" report "$tmp/none"
head -c 20 "$tmp/t.trace" >"$tmp/short.trace"
expect_err 1 "not a readable trace: offset 16: truncated record frame" "$pk" report "$tmp/short.trace"
expect_err 1 "not a probekit trace file" "$pk" export "$gen" --format chrome
expect_err 2 "unknown key 'bogus'" "$pk" report "$tmp/t.trace" --sort bogus
expect_err 2 "--format perfetto|chrome|folded|speedscope is required" "$pk" export "$tmp/t.trace"
expect_err 2 "unknown format 'svg'" "$pk" export "$tmp/t.trace" --format svg
expect_err 2 "unexpected argument" "$pk" report a b
(cd "$tmp" && { "$pk" report 2>&1 || true; } | grep -q "probekit.trace: No such file") ||
	fail "default FILE"
"$pk" report --help | grep -q 'usage: probekit report' || fail "report --help"

# An END record whose end_mono_ns is 2^64 - 1 (checksum valid) would make
# the refined TSC rate 0 and report/export die of SIGFPE: the rate refined
# from an implausible END pair is not used.
"$gen" "$tmp/badend.trace" --bad-end
for cmd in "report" "export --format chrome" "export --format folded"; do
	# shellcheck disable=SC2086
	"$pk" $cmd "$tmp/badend.trace" >"$tmp/out" 2>"$tmp/err" ||
		fail "$cmd on a damaged END record exited $?: $(cat "$tmp/err")"
done
"$pk" report "$tmp/badend.trace" | grep -q 'alpha' || fail "report of a damaged END record"

# Report and export check the prefix and each record before reading on,
# never the whole input first (/dev/zero: 16 GB in 20 s), and keep memory
# bounded whatever the input: run them
# in 100 MB of address space (a small report needs ~20 MB), where a reader
# that holds the file fails at once instead of swapping.
# (Not under ASan or TSan, whose shadow memory needs terabytes of address
# space: there the timeout alone bounds an unbounded reader.)
if [[ $(ldd "$pk") == *lib[at]san* ]]; then
	limited() { timeout 60 "$@"; }
else
	limited() { (ulimit -v 100000 && exec timeout 60 "$@"); }
fi
expect_err 1 "/dev/zero: not a readable trace: not a regular file (a character device)" \
	limited "$pk" report /dev/zero
expect_err 1 "not a regular file (a character device)" \
	limited "$pk" export /dev/zero --format chrome
mkfifo "$tmp/fifo"
expect_err 1 "not a regular file (a pipe or FIFO)" limited "$pk" report "$tmp/fifo"
expect_err 1 "not a regular file (a pipe or FIFO)" \
	limited "$pk" report /dev/stdin < <(cat "$tmp/t.trace")
# A 12 KB trace followed by a 3 GB hole: stops at the first zero frame.
cp "$tmp/t.trace" "$tmp/sparse.trace"
truncate -s 3G "$tmp/sparse.trace"
limited "$pk" report "$tmp/sparse.trace" >"$tmp/out" 2>"$tmp/err" ||
	fail "report of a trace followed by a hole: $(cat "$tmp/err")"
grep -q "offset $size: data after the END record" "$tmp/err" || fail "hole after END: $(cat "$tmp/err")"
grep -q 'alpha' "$tmp/out" || fail "report of a trace followed by a hole"
cp "$tmp/cut.trace" "$tmp/sparse.trace"
truncate -s 3G "$tmp/sparse.trace"
limited "$pk" export "$tmp/sparse.trace" --format folded >"$tmp/out" 2>"$tmp/err" ||
	fail "export of a cut trace followed by a hole: $(cat "$tmp/err")"
grep -q "warning: .*sparse.trace: offset [0-9]*: checksum mismatch in END record" "$tmp/err" ||
	fail "hole after a cut: $(cat "$tmp/err")"
# A 48 MB trace (3 M events) in the same 100 MB: streamed, not loaded.
"$gen" "$tmp/long.trace" --long 1500000
limited "$pk" report "$tmp/long.trace" --raw >"$tmp/out" 2>"$tmp/err" ||
	fail "report of a 48 MB trace: $(cat "$tmp/err")"
grep -Eq '^ +1500000 +1500000 +1500000 +1 +1 +1  beta' "$tmp/out" || fail "long report: $(cat "$tmp/out")"
limited "$pk" export "$tmp/long.trace" --format folded >"$tmp/out" 2>"$tmp/err" ||
	fail "folded export of a 48 MB trace: $(cat "$tmp/err")"
printf '# probekit folded stacks: VALUE = self time in nanoseconds (flamegraph.pl --countname=ns)\nalpha 1500009\nalpha;beta 1500000\ngamma 5\n' |
	diff -u - "$tmp/out" || fail "long folded"
limited "$pk" export "$tmp/long.trace" --format chrome -o /dev/null 2>"$tmp/err" ||
	fail "chrome export of a 48 MB trace: $(cat "$tmp/err")"
# The Chrome export writes a thread's calls within a bounded buffer: an outer
# frame still open when it fills (alpha around 10000 calls) becomes B/E.
# Its program name holds a byte that is not UTF-8: written as U+FFFD.
"$gen" "$tmp/long.trace" --long 10000
"$pk" export "$tmp/long.trace" --format chrome -o "$tmp/long.json" 2>/dev/null
python3 - "$tmp/long.json" <<'END' || fail "chrome B/E events"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
ph = [e["ph"] for e in ev if e["ph"] != "M"]
assert ph.count("X") == 10001 and ph.count("B") == 1 and ph.count("E") == 1, ph[:3]
b = next(e for e in ev if e["ph"] == "B")
e = next(e for e in ev if e["ph"] == "E")
assert b["name"] == "alpha" and b["ts"] == 0.0 and e["ts"] == 20.009, (b, e)
ts, depth = [], 0
for x in ev:
    if x["ph"] == "M":
        continue
    ts.append(x["ts"])
    depth += {"B": 1, "E": -1}.get(x["ph"], 0)
    assert depth in (0, 1)
    if x["ph"] == "X" and x["name"] == "beta":
        assert depth == 1, x
assert ts == sorted(ts) and depth == 0
# names are not trusted to be UTF-8: JSON text must be (json.load decodes it)
p = [x["args"]["name"] for x in ev if x.get("name") == "process_name"]
assert p == ["/usr/bin/d\ufffdmo\u20ac"], p
g = [x for x in ev if x.get("name") == "gamma"]
assert len(g) == 1 and g[0]["args"] == {"open": True}, g
END

# Deep stacks: gamma recursing 200,000 deep (trace_gen --deep) through every
# reader, in the same 100 MB of address space.  Time and memory are linear in
# the depth (graph and replay took time growing with its square, graph's
# printer recursed until SIGSEGV, the folded export held every line: 430 MB
# at 10,000 deep).  The timeout is 100 times what they need here: only a
# quadratic reader (20 minutes for replay at this depth) reaches it.
deep=200000
"$gen" "$tmp/deep.trace" --deep $deep
deep_limited() { limited "$@"; }
if [[ $(ldd "$pk") != *lib[at]san* ]]; then
	deep_limited() { (ulimit -v 100000 && exec timeout 300 "$@"); }
fi
deep_limited "$pk" graph gamma "$tmp/deep.trace" >"$tmp/out" 2>"$tmp/err" ||
	fail "graph of a $deep-deep stack exited $?: $(cat "$tmp/err")"
[[ $(wc -l <"$tmp/out") == $((deep + 2)) ]] || fail "deep graph: $(wc -l <"$tmp/out") lines"
grep -Eqx ' +1 ns : {129}\+-\[200000\] \(1\) alpha' "$tmp/out" || fail "deep graph: $(tail -1 "$tmp/out")"
grep -Eqx ' +400.002 us : \(1\) gamma' "$tmp/out" || fail "deep graph: $(sed -n 2p "$tmp/out")"
awk 'length > 200 {exit 1}' "$tmp/out" || fail "deep graph: a line longer than 200 bytes"
deep_limited "$pk" replay "$tmp/deep.trace" >"$tmp/out" 2>"$tmp/err" ||
	fail "replay of a $deep-deep stack exited $?: $(cat "$tmp/err")"
[[ $(wc -l <"$tmp/out") == $((2 * deep + 2)) ]] || fail "deep replay: $(wc -l <"$tmp/out") lines"
grep -Eq '^ +1 ns \[ *[0-9]+\] \| {129}\[200001\] alpha\(\);$' "$tmp/out" || fail "deep replay: leaf"
tail -1 "$tmp/out" | grep -Eq '^ +400.002 us \[ *[0-9]+\] \| \} /\* gamma \*/$' ||
	fail "deep replay: $(tail -1 "$tmp/out")"
awk 'length > 200 {exit 1}' "$tmp/out" || fail "deep replay: a line longer than 200 bytes"
deep_limited "$pk" replay -t 3 -D 100000 "$tmp/deep.trace" >"$tmp/out" 2>"$tmp/err" ||
	fail "replay -t -D of a $deep-deep stack exited $?: $(cat "$tmp/err")"
[[ $(wc -l <"$tmp/out") == $((2 * 100000)) ]] || fail "deep replay -t -D: $(wc -l <"$tmp/out") lines"
deep_limited "$pk" report --raw "$tmp/deep.trace" >"$tmp/out" 2>"$tmp/err" ||
	fail "report of a $deep-deep stack exited $?: $(cat "$tmp/err")"
grep -Eq '^ +200000 +400002 +400001 .* gamma$' "$tmp/out" || fail "deep report: $(cat "$tmp/out")"
for fmt in chrome speedscope perfetto; do
	deep_limited "$pk" export "$tmp/deep.trace" --format $fmt -o "$tmp/deep.$fmt" 2>"$tmp/err" ||
		fail "$fmt export of a $deep-deep stack exited $?: $(cat "$tmp/err")"
done
python3 - "$tmp/deep.chrome" "$tmp/deep.speedscope" <<'END' || fail "deep chrome/speedscope"
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] != "M"]
assert sum(e.get("name") == "gamma" for e in ev) == 200000, len(ev)
p = json.load(open(sys.argv[2]))["profiles"][0]["events"]
assert len(p) == 2 * 200001, len(p)
END
# Folded: the stacks' lines themselves grow with the square of the depth
# (one line per level): 10,000 deep, 300 MB of output, in 100 MB.
"$gen" "$tmp/deep.trace" --deep 10000
deep_limited "$pk" export "$tmp/deep.trace" --format folded -o "$tmp/out" 2>"$tmp/err" ||
	fail "folded export of a 10000-deep stack exited $?: $(cat "$tmp/err")"
awk 'NR > 1 { n++; v += $NF; if (split($1, fr, ";") != NR - 1) exit 1 }
	END { if (n != 10001 || v != 20002) exit 1 }' "$tmp/out" ||
	fail "deep folded: $(wc -l <"$tmp/out") lines"
# (compared as a string: grep -E '(gamma;){10000}' builds an automaton that
# took 400 s under the MALLOC_PERTURB_ meson sets)
[[ $(tail -1 "$tmp/out") == "$(printf 'gamma;%.0s' $(seq 10000))alpha 1" ]] ||
	fail "deep folded: last line"

# The thread's name "deep;\nthr\xff": a ';' or a newline in a folded frame
# would split it; both are written as '_'.
"$gen" "$tmp/deep.trace" --deep 2
"$pk" export "$tmp/deep.trace" --format folded --threads 2>/dev/null | sed -E 's#/[0-9]+;#/TID;#' >"$tmp/out"
printf '# probekit folded stacks: VALUE = self time in nanoseconds (flamegraph.pl --countname=ns)\ndeep__thr\xff/TID;gamma 2\ndeep__thr\xff/TID;gamma;gamma 3\ndeep__thr\xff/TID;gamma;gamma;alpha 1\n' |
	diff -u - "$tmp/out" || fail "folded thread name with ';' and a newline"

# Perfetto's string fields must be UTF-8 (protoc warns, Perfetto rejects):
# the thread name's invalid byte is written as U+FFFD.
proto=$(dirname "$(realpath "$0")")/perfetto
if command -v protoc >/dev/null; then
	"$pk" export "$tmp/deep.trace" --format perfetto -o "$tmp/deep.pftrace" 2>/dev/null
	protoc --decode=perfetto.protos.Trace -I "$proto" "$proto/probekit-perfetto.proto" \
		<"$tmp/deep.pftrace" >"$tmp/out" 2>"$tmp/err" || fail "perfetto: protoc: $(cat "$tmp/err")"
	[[ ! -s $tmp/err ]] || fail "perfetto with a thread name not UTF-8: $(cat "$tmp/err")"
	grep -Fqx '      thread_name: "deep;\nthr\357\277\275"' "$tmp/out" ||
		fail "perfetto thread name: $(grep thread_name "$tmp/out")"
else
	echo "note: no protoc: the Perfetto export's UTF-8 not checked"
fi

# export -o opens its output as the trace file is opened: in a directory
# others can write to (/tmp), a symbolic link planted there is not followed
# (it overwrote its target, as root), nor a file of another user's
# overwritten; a file of ours there is, and elsewhere a link is followed.
mkdir -m 1777 "$tmp/shared"
echo victim >"$tmp/victim"
ln -s "$tmp/victim" "$tmp/shared/out.json"
expect_err 1 "out.json: a symbolic link in a directory other users can write to: not followed" \
	"$pk" export "$tmp/t.trace" --format chrome -o "$tmp/shared/out.json"
[[ $(cat "$tmp/victim") == victim ]] || fail "export -o through a planted link overwrote its target"
echo theirs >"$tmp/shared/theirs.json"
chown 65534 "$tmp/shared/theirs.json"
expect_err 1 "theirs.json: exists in a directory other users can write to and is not a regular file of ours" \
	"$pk" export "$tmp/t.trace" --format chrome -o "$tmp/shared/theirs.json"
[[ $(cat "$tmp/shared/theirs.json") == theirs ]] || fail "export -o overwrote another user's file"
echo old >"$tmp/shared/ours.json"
"$pk" export "$tmp/t.trace" --format chrome -o "$tmp/shared/ours.json" 2>/dev/null &&
	grep -q traceEvents "$tmp/shared/ours.json" || fail "export -o over a file of ours in /tmp"
ln -s "$tmp/victim" "$tmp/link.json"
"$pk" export "$tmp/t.trace" --format chrome -o "$tmp/link.json" 2>/dev/null &&
	grep -q traceEvents "$tmp/victim" || fail "export -o through a link in a private directory"

# A reader whose output cannot be written fails, and says so.
for cmd in "report" "replay" "graph gamma" "export --format folded" "export --format chrome"; do
	expect_err 1 "standard output: No space left on device" \
		sh -c "exec \"\$0\" $cmd \"\$1\" >/dev/full" "$pk" "$tmp/t.trace"
	expect_err 1 "standard output: Bad file descriptor" \
		sh -c "exec \"\$0\" $cmd \"\$1\" >&-" "$pk" "$tmp/t.trace"
done
"$pk" export --help | grep -q 'usage: probekit export' || fail "export --help"
echo "trace-cli: all checks passed"
