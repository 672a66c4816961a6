#!/usr/bin/env python3
"""Make probekit(1) from doc/probekit.1.in: its @SYNOPSIS@ line becomes the
"usage:" paragraph of every command's --help (and of every benchmark's),
as the built command prints them, so the two never disagree.

usage: man-synopsis.py PROBEKIT TEMPLATE > probekit.1"""
import re
import subprocess
import sys


def helptext(pk, *args):
    return subprocess.run([pk, *args, "--help"], capture_output=True, text=True,
                          check=True).stdout


def listed(text, heading):
    """The names in the '<heading>:' list of a --help text."""
    out, on = [], False
    for line in text.splitlines():
        if line.strip() == heading + ":":
            on = True
        elif on and re.match(r"^  \S", line):
            out.append(line.split()[0])
        elif on and line.strip():
            break
    return out


def usage(text):
    """The usage paragraph: from 'usage: ' to the first blank line, the
    'usage: ' and the indent that aligns the lines after it taken off."""
    lines = []
    for line in text.splitlines():
        if not lines and not line.startswith("usage: "):
            continue
        if lines and not line.strip():
            break
        lines.append(line[7:] if line.startswith(("usage: ", "       ")) else line)
    return lines


def troff(line):
    line = line.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + line if line[:1] in (".", "'") else line


def main():
    pk, template = sys.argv[1], sys.argv[2]
    top = helptext(pk)
    out = [".nf"]
    out.extend(troff(line) for line in usage(top))
    for cmd in listed(top, "commands"):
        text = helptext(pk, cmd)
        subs = listed(text, "benchmarks")
        groups = [helptext(pk, cmd, s) for s in subs] if subs else [text]
        for t in groups:
            out.append("")
            out.extend(troff(l) for l in usage(t))
    out.append(".fi")
    body = open(template).read()
    if "@SYNOPSIS@\n" not in body:
        sys.exit(f"{template}: no @SYNOPSIS@ line")
    sys.stdout.write(body.replace("@SYNOPSIS@\n", "\n".join(out) + "\n"))


main()
