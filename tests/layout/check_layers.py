"""Checks src/'s #include "..." lines against the layer table of
docs/layout.md (the table after the `<!-- layers: ... -->` marker): every
file of src/ (*.c, *.h) is in exactly one layer, and each quoted include
names a file of src/ in the file's own layer or in one its row allows.
usage: check_layers.py SRC_DIR LAYOUT_MD     (exit 1 with each violation)
"""
import os
import re
import sys

src, layout = sys.argv[1], sys.argv[2]
text = open(layout, encoding="utf-8").read()
table = text[text.index("<!-- layers:"):].split("\n")[1:]
layer_of, allowed = {}, {}
for row in table:
    if not row.startswith("|"):
        break
    cells = [c.strip() for c in row.strip("|").split("|")]
    if cells[0] in ("layer", "---"):
        continue
    name, files, may = cells
    for f in files.split():
        if f in layer_of:
            sys.exit("%s: %s is in layers %s and %s" % (layout, f, layer_of[f], name))
        layer_of[f] = name
    allowed[name] = {m.strip() for m in may.split(",")}
errors = []
for f in sorted(os.listdir(src)):
    if not f.endswith((".c", ".h")):
        continue
    if f not in layer_of:
        errors.append("%s: in no layer of %s" % (f, layout))
        continue
    mine = layer_of[f]
    ok = allowed[mine]
    for n, line in enumerate(open(os.path.join(src, f), encoding="utf-8"), 1):
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if not m or m.group(1) == "sluice.h":
            continue
        inc = os.path.basename(m.group(1))
        if inc not in layer_of:
            if os.path.exists(os.path.join(src, inc)):
                errors.append("%s:%d: %s is in no layer" % (f, n, inc))
            continue
        theirs = layer_of[inc]
        if theirs != mine and "every layer" not in ok and theirs not in ok:
            errors.append("%s:%d: includes %s: layer %s may not include layer %s (allowed: %s)"
                          % (f, n, inc, mine, theirs, ", ".join(sorted(ok))))
for e in errors:
    print("FAIL -", e)
print("%d files in %d layers, %d violations" % (len(layer_of), len(allowed), len(errors)))
sys.exit(1 if errors else 0)
