#!/usr/bin/env python3
"""probekit's synopses, made from the built command's --help texts so that
none can drift from what the command says: the man page's SYNOPSIS and EXIT
STATUS, and the synopsis block of doc/tracing.md.

The synopsis is every command's "usage:" paragraph, in the order
'probekit --help' lists the commands, those with subcommands (bench) last
and each of their subcommands in full; under each usage, the options its
--help lists that the usage does not name.  The exit statuses are each
command's "Exit status:" paragraph.

usage: synopsis.py man PROBEKIT TEMPLATE > probekit.1
       synopsis.py readme PROBEKIT PAGE        rewrite PAGE's block (doc/tracing.md)
       synopsis.py check PROBEKIT PAGE         exit 1 if PAGE's block differs"""
import difflib
import re
import subprocess
import sys

# doc/tracing.md's block is the lines between these two.
BEGIN = "<!-- synopsis: made by doc/synopsis.py from the --help texts; " \
        "./dev synopsis rewrites it -->"
END = "<!-- end of synopsis -->"
WIDTH = 78
# The lists of subcommands a --help can have.
SUBLISTS = ("commands", "benchmarks")


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


def subcommands(text):
    return next((names for names in (listed(text, h) for h in SUBLISTS) if names), [])


def paragraph(text, start):
    """The lines of the paragraph of a --help text that starts with start."""
    lines = []
    for line in text.splitlines():
        if not lines and not line.startswith(start):
            continue
        if lines and not line.strip():
            break
        lines.append(line)
    return lines


def usage(text):
    """The usage paragraph, the 'usage: ' and the indent that aligns the lines
    after it taken off."""
    return [line[7:] if line.startswith(("usage: ", "       ")) else line
            for line in paragraph(text, "usage: ")]


def exit_status(text):
    """The "Exit status:" paragraph's text, on one line, or None."""
    lines = paragraph(text, "Exit status: ")
    return " ".join(" ".join(lines).split())[len("Exit status: "):] if lines else None


def options(text):
    """The options a --help lists, in order, as '-f|--function GLOB': each
    line that starts (indented a little) with options, then at most one
    argument, before the description.  The lines of one option with
    different arguments (export's --format) make one entry."""
    out = {}
    for line in text.splitlines():
        if not re.match(r"^ {2,8}-", line):
            continue
        names, arg = [], None
        for word in re.split(r" {2,}", line.strip())[0].split():
            if word.startswith("-") and arg is None:
                name, eq, value = word.rstrip(",").partition("=")
                names.append(name)
                arg = eq + value if eq else None
            elif arg is None:
                arg = " " + word
            else:
                break
        if "--help" in names:
            continue
        key = "|".join(names)
        args = out.setdefault(key, [])
        if arg and arg not in args:
            args.append(arg)
    return [key + (args[0][0] + "|".join(a[1:] for a in args) if args else "")
            for key, args in out.items()]


def names_in(opt, text):
    """Does text name one of the options of opt ('-f|--function GLOB')?"""
    return any(re.search(r"(?<![\w-])" + re.escape(n) + r"(?![\w-])", text)
               for n in re.split(r"[| =]", opt) if n.startswith("-"))


def wrapped(items, first, indent):
    """first, then items joined by spaces, in lines of at most WIDTH columns
    (the lines after the first start with indent)."""
    lines, line = [], first + items[0]
    for item in items[1:]:
        if len(line) + 1 + len(item) > WIDTH:
            lines.append(line)
            line = indent + item
        else:
            line += " " + item
    lines.append(line)
    return lines


def command_synopsis(text):
    """A command's usage lines, then the options its usage does not name."""
    lines = usage(text)
    extra = [f"[{o}]" for o in options(text) if not names_in(o, "\n".join(lines))]
    if extra:
        lines.extend(wrapped(extra, "  options: ", " " * len("  options: ")))
    return lines


def leaves(pk, args, text):
    """The --help texts of the commands under args (args's own if none)."""
    subs = subcommands(text)
    if not subs:
        return [text]
    return [t for s in subs for t in leaves(pk, args + [s], helptext(pk, *args, s))]


def commands(pk):
    """(name, --help text) of each command, in 'probekit --help' order, those
    with subcommands last."""
    cmds = [(c, helptext(pk, c)) for c in listed(helptext(pk), "commands")]
    return [c for c in cmds if not subcommands(c[1])] + \
           [c for c in cmds if subcommands(c[1])]


def synopsis(pk):
    """The synopsis, as lines of plain text."""
    out = usage(helptext(pk))
    for name, text in commands(pk):
        for t in leaves(pk, [name], text):
            out.append("")
            out.extend(command_synopsis(t))
    return out


def troff(line):
    line = line.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + line if line[:1] in (".", "'") else line


def man_exit_status(pk):
    """A tagged paragraph per command; one without "Exit status:" is left out
    (and named: tests/cli/test-man.sh fails on it)."""
    out = []
    for name, text in commands(pk):
        status = exit_status(text)
        if status is None:
            print(f"synopsis.py: probekit {name} --help: no 'Exit status:' paragraph",
                  file=sys.stderr)
            continue
        out.extend([".TP", ".B " + name, troff(status)])
    return out


def man(pk, template):
    body = open(template).read()
    parts = {"@SYNOPSIS@": [".nf", *map(troff, synopsis(pk)), ".fi"],
             "@EXIT_STATUS@": man_exit_status(pk)}
    for key, lines in parts.items():
        if key + "\n" not in body:
            sys.exit(f"{template}: no {key} line")
        body = body.replace(key + "\n", "\n".join(lines) + "\n")
    sys.stdout.write(body)


def page_with_block(pk, page):
    """The page's text, and that text with its block made anew."""
    text = open(page).read()
    begin, end = text.find(BEGIN + "\n"), text.find("\n" + END + "\n")
    if begin < 0 or end < begin:
        sys.exit(f"{page}: no '{BEGIN}' ... '{END}' lines")
    block = "\n".join(["```", *synopsis(pk), "```"])
    return text, text[:begin + len(BEGIN) + 1] + block + text[end:]


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("man", "readme", "check"):
        sys.exit(__doc__.split("\n\n")[-1])
    mode, pk, path = sys.argv[1:]
    if mode == "man":
        return man(pk, path)
    old, new = page_with_block(pk, path)
    if mode == "readme":
        if new != old:
            open(path, "w").write(new)
        return
    if new != old:
        sys.stdout.writelines(difflib.unified_diff(
            old.splitlines(True), new.splitlines(True), path, "from the --help texts"))
        sys.exit(f"{path}: its synopsis differs from the --help texts: "
                 "'./dev synopsis' rewrites it")


main()
