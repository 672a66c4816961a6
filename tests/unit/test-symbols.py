#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The library's ABI as the version script says it: every symbol
libprobekit.so exports is named in src/libprobekit.map under the node it
is exported with (no glob: a function added later must get a node of its
own), and every function include/probekit/ declares with PK_API is
exported under PROBEKIT_0.1 or a later PROBEKIT_ node.

usage: test-symbols.py LIBPROBEKIT_SO MAP INCLUDE_DIR
"""
import pathlib
import re
import subprocess
import sys


def map_nodes(text):
    """{symbol: node} from a version script; the globs found."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    nodes, globs = {}, []
    for node, body in re.findall(r"([A-Za-z0-9_.]+)\s*\{(.*?)\}", text, flags=re.S):
        glob = body.split("local:")[0].replace("global:", "")
        for name in re.findall(r"[^\s;]+", glob):
            if any(c in name for c in "*?["):
                globs.append(f"{node}: {name}")
            nodes[name] = node
    return nodes, globs


def exported(lib):
    """{symbol: version} of the defined dynamic symbols (nm -D)."""
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    syms = {}
    for line in out.splitlines():
        name = line.split()[-1]
        if "@" not in name:
            continue  # the version nodes' own symbols are absolute ones
        sym, ver = name.split("@@") if "@@" in name else name.split("@", 1)
        if sym != ver:
            syms[sym] = ver
    return syms


def declared(include):
    """The functions include/probekit/ declares with PK_API."""
    names = set()
    for h in pathlib.Path(include).rglob("*.h"):
        text = re.sub(r"/\*.*?\*/", "", h.read_text(), flags=re.S)
        for decl in re.findall(r"\bPK_API\b[^;{]*", text):
            m = re.search(r"\b(pk_[a-z0-9_]+)\s*\(", decl)
            if m:
                names.add(m.group(1))
    return names


def main():
    lib, mapfile, include = sys.argv[1:4]
    nodes, globs = map_nodes(pathlib.Path(mapfile).read_text())
    syms = exported(lib)
    api = declared(include)
    problems = [f"the map has a glob ({g}): name each symbol" for g in globs]
    for sym, ver in sorted(syms.items()):
        if sym not in nodes:
            problems.append(f"{sym}@{ver} is exported but not named in the map")
        elif nodes[sym] != ver:
            problems.append(f"{sym} is exported as @{ver}, the map says {nodes[sym]}")
    for name in sorted(api):
        if name not in syms:
            problems.append(f"{name} is declared PK_API but not exported")
        elif not syms[name].startswith("PROBEKIT_"):
            problems.append(f"{name} is exported as @{syms[name]}, not a PROBEKIT_ node")
    for sym, ver in sorted(syms.items()):
        if ver.startswith("PROBEKIT_") and sym.startswith("pk_") and sym not in api:
            problems.append(f"{sym} is exported but include/probekit/ does not declare it")
    for p in problems:
        print("FAIL:", p)
    print(f"abi: {len(syms)} symbols exported, {len(api)} declared PK_API, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
