#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What the shipped libraries leave out: the trace file's reader and
analysis (src/traceread/, libprobekit-traceread.a) are the command's, the
fuzzers' and the tests', so neither libprobekit.so nor the agent defines
any function or object of that archive (doc/conventions.md, "Layout").

usage: test-contents.py LIBPROBEKIT_TRACEREAD_A LIB.so...
"""
import subprocess
import sys


def defined(path):
    """The names of the functions and objects @path defines (its symtab)."""
    out = subprocess.run(["nm", "--defined-only", path], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "TtDdBbRr":
            names.add(f[2].split("@")[0])
    return names


def main():
    archive, libs = sys.argv[1], sys.argv[2:]
    # (the archive's own statics, such as "bad", may share a name with another file's)
    out = subprocess.run(["nm", "--defined-only", "-g", archive], check=True,
                         capture_output=True, text=True).stdout
    reader = {l.split()[2] for l in out.splitlines() if len(l.split()) == 3}
    problems = []
    if len(reader) < 10:
        problems.append(f"{archive}: {len(reader)} symbols, expected the reader's")
    for lib in libs:
        syms = defined(lib)
        if not any(s.startswith("pki_") for s in syms):
            problems.append(f"{lib}: no internal symbol seen (stripped?): cannot check")
        for s in sorted(reader & syms):
            problems.append(f"{lib} defines {s}, the trace reader's")
    for p in problems:
        print("FAIL:", p)
    print(f"contents: {len(reader)} symbols of the trace reader, {len(libs)} libraries "
          f"checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
