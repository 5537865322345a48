"""Writes the runnable code blocks of a Markdown file into a directory.

A block is runnable when the line before its opening fence is
`<!-- runnable -->` or `<!-- runnable: server -->`; the fence's info string
(sh, c, python) says how it runs. Writes NN.KIND (NN in file order) and
NN.KIND.server for server blocks, and prints one line per block:
NN KIND plain|server LINE (LINE: where the fence opens, for messages).
usage: extract.py README.md OUTDIR
"""
import os
import re
import sys

src, out = sys.argv[1], sys.argv[2]
lines = open(src, encoding="utf-8").read().split("\n")
n = 0
i = 0
while i < len(lines):
    m = re.fullmatch(r"<!-- runnable(: server)? -->", lines[i].strip())
    if m and i + 1 < len(lines) and lines[i + 1].startswith("```"):
        kind = lines[i + 1][3:].strip()
        if kind not in ("sh", "c", "python"):
            sys.exit("%s:%d: a runnable block must be sh, c or python, not %r" % (src, i + 2, kind))
        j = i + 2
        body = []
        while j < len(lines) and not lines[j].startswith("```"):
            body.append(lines[j])
            j += 1
        if j == len(lines):
            sys.exit("%s:%d: runnable block never closed" % (src, i + 2))
        n += 1
        mode = "server" if m.group(1) else "plain"
        with open(os.path.join(out, "%02d.%s" % (n, kind)), "w", encoding="utf-8") as f:
            f.write("\n".join(body) + "\n")
        print("%02d %s %s %d" % (n, kind, mode, i + 2))
        i = j
    i += 1
if n == 0:
    sys.exit("%s: no runnable block" % src)
