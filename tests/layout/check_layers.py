"""Checks src/'s layers (docs/layout.md, the table after the
`<!-- layers: ... -->` marker), by the includes and by the calls.

Includes: every file of src/ (*.c, *.h) sits in the folder of one layer of
the table (src/<layer>/), and each quoted include names a header by its
folder ("engine/pool.h") in the file's own layer or in one its row allows.
A bare "pool.h" for a header of src/ is refused: the include line is where
a reader sees which layer a file reaches into.

Calls (with --objects): the compiled objects of the library, each named
<layer>/<file>.c.o as CMake names them (the folder above the object is its
layer), are read with nm (defined and undefined external symbols). A
file that uses a symbol (a call, or a reference to a variable) defined in
another file makes an edge; an edge into a layer the file's row does not
allow is an upward call, and two files that use each other (A uses a
symbol of B and B one of A, within a layer or across) are a loop. Both
fail unless the table after `<!-- layer exceptions: ... -->` lists the
pair (from, to, reason; a loop's pair in either order); an exception that
no longer matches anything fails too, so the list only shrinks.
usage: check_layers.py SRC_DIR LAYOUT_MD [--nm NM] [--objects OBJ...]
       (exit 1 with each violation)
"""
import os
import re
import subprocess
import sys


def read_table(text, marker):
    """The rows of the Markdown table right after the line holding marker,
    as lists of cells (header and rule rows left out)."""
    if marker not in text:
        return None
    rows = []
    for row in text[text.index(marker):].split("\n")[1:]:
        if not row.startswith("|"):
            break
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if cells[0] in ("layer", "from") or set(cells[0]) <= set("-: "):
            continue
        rows.append(cells)
    return rows


def may_use(allowed, layer, theirs):
    ok = allowed[layer]
    return theirs == layer or "every layer" in ok or theirs in ok


def check_includes(src, allowed, errors):
    headers = {}  # a header's bare name -> its layer
    files = []
    for dirpath, _, names in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        for f in sorted(names):
            if not f.endswith((".c", ".h")):
                continue
            if rel == "." or "/" in rel or rel not in allowed:
                errors.append("%s: not in the folder of a layer (src/<layer>/)"
                              % os.path.join(rel, f))
                continue
            files.append((rel, f))
            if f.endswith(".h"):
                headers[f] = rel
    for layer, f in sorted(files):
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
            if not may_use(allowed, layer, theirs):
                errors.append("%s:%d: includes %s: layer %s may not include layer %s (allowed: %s)"
                              % (where, n, inc, layer, theirs, ", ".join(sorted(allowed[layer]))))
    return len(files)


def symbols(nm, obj):
    """(defined, undefined) external symbols of one object, by nm -P."""
    out = subprocess.run([nm, "-g", "-P", obj], check=True, capture_output=True,
                         text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind in "TDBRCGSVWi":
            defined.add(name)
    return defined, undefined


def object_file(obj):
    """'engine/engine.c' for .../src/engine/engine.c.o (CMake's naming)."""
    base = os.path.basename(obj)
    if base.endswith(".o"):
        base = base[:-2]
    return "%s/%s" % (os.path.basename(os.path.dirname(obj)), base)


def check_calls(nm, objects, allowed, exceptions, errors):
    defs = {}  # symbol -> files that define it
    uses = {}  # file -> undefined symbols
    for obj in objects:
        f = object_file(obj)
        layer = f.split("/")[0]
        if layer not in allowed:
            errors.append("%s: object of no layer (%s)" % (obj, f))
            continue
        d, u = symbols(nm, obj)
        uses[f] = u
        for s in d:
            defs.setdefault(s, set()).add(f)
    edges = {}  # file -> {file it uses: [symbols]}
    for f, u in uses.items():
        for s in u:
            owners = defs.get(s, set())
            if len(owners) != 1:  # outside the library, or weak/common in several
                continue
            (g,) = owners
            if g != f:
                edges.setdefault(f, {}).setdefault(g, []).append(s)
    used = set()
    for f in sorted(edges):
        layer = f.split("/")[0]
        for g in sorted(edges[f]):
            theirs = g.split("/")[0]
            if may_use(allowed, layer, theirs):
                continue
            if (f, g) in exceptions:
                used.add((f, g))
                continue
            errors.append("%s uses %s of %s: an upward call, layer %s may not use layer %s (allowed: %s)"
                          % (f, ", ".join(sorted(edges[f][g])), g, layer, theirs,
                             ", ".join(sorted(allowed[layer]))))
    for f in sorted(edges):
        for g in sorted(edges[f]):
            if not f < g or f not in edges.get(g, {}):
                continue
            pair = (f, g) if (f, g) in exceptions else (g, f)
            if pair in exceptions:
                used.add(pair)
                continue
            errors.append("a loop of calls: %s uses %s of %s, and %s uses %s of %s"
                          % (f, ", ".join(sorted(edges[f][g])), g,
                             g, ", ".join(sorted(edges[g][f])), f))
    for pair in sorted(set(exceptions) - used):
        errors.append("the exception %s -> %s (%s) matches no upward call or loop: "
                      "remove it from the table" % (pair[0], pair[1], exceptions[pair]))
    return len(uses), sum(len(g) for g in edges.values())


def main(argv):
    args = argv[1:]
    nm, objects = "nm", None
    if "--objects" in args:
        i = args.index("--objects")
        objects = args[i + 1:]
        args = args[:i]
    if "--nm" in args:
        i = args.index("--nm")
        nm = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    src, layout = args
    text = open(layout, encoding="utf-8").read()
    allowed = {}
    for cells in read_table(text, "<!-- layers:") or []:
        allowed[cells[0].strip("`")] = {m.strip() for m in cells[-1].split(",")}
    if not allowed:
        sys.exit("%s: no layer table after <!-- layers: -->" % layout)
    exceptions = {}
    for cells in read_table(text, "<!-- layer exceptions:") or []:
        if len(cells) != 3 or not cells[2]:
            sys.exit("%s: an exception is | from | to | reason |: %r" % (layout, cells))
        exceptions[(cells[0].strip("`"), cells[1].strip("`"))] = cells[2]
    errors = []
    nfiles = check_includes(src, allowed, errors)
    summary = "%d files in %d layers" % (nfiles, len(allowed))
    if objects is not None:
        if not objects:
            errors.append("--objects names no object")
        missing = [o for o in objects if not os.path.exists(o)]
        for o in missing:
            errors.append("%s: no such object (build the library first)" % o)
        if not missing and objects:
            nobj, nedges = check_calls(nm, objects, allowed, exceptions, errors)
            summary += ", %d objects, %d file-to-file uses, %d exceptions" % (
                nobj, nedges, len(exceptions))
    for e in errors:
        print("FAIL -", e)
    print("%s, %d violations" % (summary, len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
