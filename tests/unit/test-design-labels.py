#!/usr/bin/env python3
"""Check that design-note labels cited in code and notes resolve.

1. Every "doc/design/NAME.md" a source file names exists.
2. Citations "doc/design/NAME.md[,:] L1, L2-L4", "L1 of/in doc/design/NAME.md"
   (and the same with a bare `NAME.md` inside doc/design/) name labels that
   NAME.md defines.
3. Every label of a prefix only the notes use (HK, TP, AL, ...) that a
   comment names is defined in some note.
4. Every label a note defines is used by the code or by a note (besides its
   definition).
Run from the top of the tree (the meson test design_labels does).  Exit
status 1 if anything fails.
"""
import os, re, sys

ROOT = '.'
NOTES = 'doc/design'
SRC_DIRS = ['src', 'agent', 'cli', 'include', 'tests', 'tools', 'bench', 'fuzz']
EXTS = ('.c', '.h', '.S', '.cc', '.sh', '.py', '.map', '.build', '.ld')
LBL = r'[A-Z]{1,3}\d+[a-z]?'
UNIQUE = ('HK', 'TP', 'AL', 'TX', 'TF', 'TW', 'TD', 'TR', 'DL', 'PW', 'RS', 'SO', 'LC')

def expand(tok):
    m = re.fullmatch(r'([A-Z]{1,3})(\d+)([a-z]?)-([A-Z]{1,3})(\d+)([a-z]?)', tok)
    if m and m.group(1) == m.group(4) and not m.group(3) and not m.group(6):
        return ['%s%d' % (m.group(1), i) for i in range(int(m.group(2)), int(m.group(5)) + 1)]
    return tok.split('-')

def labels_in(listtext):
    out = []
    for t in re.findall(r'%s(?:-%s)?' % (LBL, LBL), listtext):
        out += expand(t)
    return out

# definitions
defs, notes_text = {}, {}
for f in sorted(os.listdir(NOTES)):
    if not f.endswith('.md'):
        continue
    text = open(os.path.join(NOTES, f)).read()
    notes_text[f] = text
    d = {}
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r'^(?:#+\s+|\s*-\s+)?\*{0,2}(%s|[A-Z])(?=[:.,]|\*\*)' % LBL, line)
        if m:
            d.setdefault(m.group(1), n)
    defs[f] = d

fail = 0
def bad(msg):
    global fail
    fail = 1
    print(msg)

LIST = r'((?:%s(?:-%s)?)(?:(?:,\s*|\s+and\s+|-)%s(?:-%s)?)*)' % (LBL, LBL, LBL, LBL)
after = re.compile(r'(?:doc/design/)?([a-z0-9-]+)\.md`?[,:]?\s+(?:labels\s+)?' + LIST + r'\b')
before = re.compile(LIST + r'\s+(?:of|in)\s+`?(?:doc/design/)?([a-z0-9-]+)\.md')

def check_citations(where, text, bare_ok):
    flat = re.sub(r'\n\s*(?:\*|//|#)?\s*', ' ', text)
    for m in re.finditer(r'doc/design/([a-z0-9-]+)\.md', flat):
        if m.group(1) + '.md' not in defs:
            bad('%s: names doc/design/%s.md, which does not exist' % (where, m.group(1)))
    cites = [(m.group(1), m.group(2), m.group(0)) for m in after.finditer(flat)]
    cites += [(m.group(2), m.group(1), m.group(0)) for m in before.finditer(flat)]
    n = 0
    for note, lst, ctx in cites:
        if not bare_ok and 'doc/design/' not in ctx:
            continue
        note += '.md'
        if note not in defs:
            continue
        for l in labels_in(lst):
            n += 1
            if l not in defs[note]:
                bad('%s: cites %s %s, not defined there  [%s]' % (where, note, l, ctx))
    return n

total = 0
seen_unique = {}
code_text = {}
for d in SRC_DIRS:
    for dp, dn, fn in os.walk(d):
        for f in fn:
            if f.endswith(EXTS):
                p = os.path.join(dp, f)
                try:
                    t = open(p, errors='replace').read()
                except OSError:
                    continue
                code_text[p] = t
                total += check_citations(p, t, False)
                for m in re.finditer(r'\b((?:%s)\d+[a-z]?)\b' % '|'.join(UNIQUE), t):
                    seen_unique.setdefault(m.group(1), p)
for f, t in notes_text.items():
    total += check_citations(NOTES + '/' + f, t, True)

alldefs = {l for d in defs.values() for l in d}
for l, p in sorted(seen_unique.items()):
    if l not in alldefs:
        bad('%s: names %s, which no note defines' % (p, l))

code_all = '\n'.join(code_text.values())
for f, d in defs.items():
    for l, line in d.items():
        pat = re.compile(r'(?<![A-Za-z0-9_])%s(?![0-9A-Za-z_])' % re.escape(l))
        in_code = bool(pat.search(code_all))
        uses = sum(len(pat.findall(t)) for t in notes_text.values())
        if len(l) == 1:   # a one-letter label: look in its own note only
            in_code = False
            uses = len(pat.findall(notes_text[f]))
        if not in_code and uses < 2:
            bad('%s:%d: defines %s, which neither the code nor a note uses' % (f, line, l))

print('%d citations checked, %d labels defined in %d notes' % (total, len(alldefs), len(defs)))
sys.exit(fail)
