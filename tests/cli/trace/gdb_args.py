#!/usr/bin/env python3
"""Compare the arguments `probekit trace -a` recorded with gdb's `info args`
at the same calls: gdb breaks at each function of the list, prints its
arguments; each value it shows is turned into probekit's display (an int
as is, a char as 'c', true/false as 1/0, a string without its address, a
function pointer as &name; an enum by its name, as both show it; a struct's
scalar members as {x=1, y=2}, one that nests arrays or structs as "?").  Prints one line per mismatch and "N compared".

usage: gdb_args.py PROG REPLAY_FILE FUNC...
"""
import re
import subprocess
import sys

prog, replay, funcs = sys.argv[1], sys.argv[2], sys.argv[3:]

# The program's calls as probekit's replay shows them: "name(a, b)".
seen = {}
for line in open(replay):
    m = re.search(r'\| +(\w+)\((.*)\)(?: = .*)?[;{]', line)
    if m and m.group(1) in funcs and m.group(1) not in seen:
        seen[m.group(1)] = m.group(2)

cmds = ['-batch', '-nx', '-ex', 'set print frame-arguments all', '-ex', 'set width 0']
for f in funcs:
    cmds += ['-ex', f'break {f}']
cmds += ['-ex', 'run']
for _ in funcs:
    cmds += ['-ex', 'info args', '-ex', 'continue']
out = subprocess.run(['gdb'] + cmds + ['--args', prog], capture_output=True, text=True).stdout

def ours(v):
    """gdb's display of a value as probekit shows it."""
    v = v.strip()
    if v.startswith('{'):  # a struct: its scalar members, or '?' if it nests
        inner = v[1:-1]
        if '{' in inner:
            return '?'
        members = re.findall(r'(\w+) = ([^,]+)', inner)
        return '{' + ', '.join(f'{n}={ours(x)}' for n, x in members) + '}' if members else '?'
    if v in ('true', 'false'):
        return '1' if v == 'true' else '0'
    m = re.match(r"^(-?\d+) '.*'$", v)  # a char: its number, shown as probekit shows bytes
    if m:
        c = int(m.group(1)) & 0xff
        return f"'{chr(c)}'" if 0x20 <= c < 0x7f and chr(c) not in "'\\" else f"'\\x{c:02x}'"
    m = re.match(r'^0x[0-9a-f]+ "(.*)"$', v)
    if m:
        return '"' + m.group(1) + '"'
    m = re.match(r'^(\(.*\) )?0x[0-9a-f]+ <(\w+)>$', v)
    if m:
        return '&' + m.group(2)
    return v


compared = bad = 0
for block in re.split(r'\nBreakpoint \d+, ', out)[1:]:
    m = re.match(r'(\w+) \(', block)
    if not m or m.group(1) not in funcs:
        continue
    name = m.group(1)
    args = re.findall(r'^(\w+) = (.*)$', block, re.M)
    want = [ours(v) for _, v in args]
    got = seen.get(name)
    # gdb cannot say what it calls <optimized out>: that argument is not compared
    if got is not None and '<optimized out>' in ', '.join(want):
        parts = re.split(r', (?![^{]*\})', got)
        got = ', '.join(p for p, w in zip(parts, want) if w != '<optimized out>')
        want = [w for w in want if w != '<optimized out>']
    want = ', '.join(want)
    compared += 1
    if got != want:
        bad += 1
        print(f'{name}: probekit ({got}), gdb ({want})')
print(f'{compared} compared, {bad} differ')
