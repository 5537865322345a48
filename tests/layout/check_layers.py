"""Checks src/'s layers (docs/layout.md, the table after the
`<!-- layers: ... -->` marker): every file of src/ (*.c, *.h) sits in the
folder of one layer of the table (src/<layer>/), and each quoted include
names a header by its folder ("engine/pool.h") in the file's own layer or
in one its row allows. A bare "pool.h" for a header of src/ is refused: the
include line is where a reader sees which layer a file reaches into.
usage: check_layers.py SRC_DIR LAYOUT_MD     (exit 1 with each violation)
"""
import os
import re
import sys

src, layout = sys.argv[1], sys.argv[2]
text = open(layout, encoding="utf-8").read()
table = text[text.index("<!-- layers:"):].split("\n")[1:]
allowed = {}
for row in table:
    if not row.startswith("|"):
        break
    cells = [c.strip() for c in row.strip("|").split("|")]
    if cells[0] in ("layer", "---"):
        continue
    name, may = cells[0].strip("`"), cells[-1]
    allowed[name] = {m.strip() for m in may.split(",")}
headers = {}  # a header's bare name -> its layer
files = []
errors = []
for dirpath, _, names in os.walk(src):
    rel = os.path.relpath(dirpath, src)
    for f in sorted(names):
        if not f.endswith((".c", ".h")):
            continue
        if rel == "." or "/" in rel or rel not in allowed:
            errors.append("%s: not in the folder of a layer of %s (src/<layer>/)"
                          % (os.path.join(rel, f), layout))
            continue
        files.append((rel, f))
        if f.endswith(".h"):
            headers[f] = rel
for layer, f in sorted(files):
    ok = allowed[layer]
    for n, line in enumerate(open(os.path.join(src, layer, f), encoding="utf-8"), 1):
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if not m or m.group(1) == "sluice.h":
            continue
        inc = m.group(1)
        where = "%s/%s" % (layer, f)
        if "/" not in inc:
            if inc in headers:
                errors.append('%s:%d: include "%s/%s", naming its folder'
                              % (where, n, headers[inc], inc))
            continue
        theirs = inc.split("/")[0]
        if theirs not in allowed or not os.path.exists(os.path.join(src, inc)):
            errors.append("%s:%d: %s is no header of a layer" % (where, n, inc))
            continue
        if theirs != layer and "every layer" not in ok and theirs not in ok:
            errors.append("%s:%d: includes %s: layer %s may not include layer %s (allowed: %s)"
                          % (where, n, inc, layer, theirs, ", ".join(sorted(ok))))
for e in errors:
    print("FAIL -", e)
print("%d files in %d layers, %d violations" % (len(files), len(allowed), len(errors)))
sys.exit(1 if errors else 0)
