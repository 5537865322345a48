"""Builds the man pages from their scdoc sources (man/*.scd).

Two placeholders keep the pages true to the code they describe:
  {{synopsis: sluice_open sluice_close ...}}  the prototypes of those
      functions, copied from include/sluice.h (a function the header does
      not declare is an error); every name but the page's own also gets an
      alias page `.so man3/PAGE.3`;
  {{help: CMD}}  the output of `sluice CMD --help` (for serve,
      `sluice-serve --help`, or a note when it was not built).
usage: gen.py MAN_SRC_DIR OUT_DIR SLUICE_H SLUICE_BIN SCDOC
Writes OUT_DIR/man1/*.1 and OUT_DIR/man3/*.3.
"""
import os
import re
import subprocess
import sys

src, out, header, sluice_bin, scdoc = sys.argv[1:6]

text = open(header, encoding="utf-8").read()
protos = {}
for m in re.finditer(r"^SLUICE_API\s+([^;]*?\b(sluice_\w+)\s*\([^;]*\))\s*;", text, re.M | re.S):
    protos[m.group(2)] = re.sub(r"\s+", " ", m.group(1)).replace("( ", "(").strip() + ";"


def helptext(cmd):
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    if cmd == "serve":
        exe = os.path.join(os.path.dirname(sluice_bin), "sluice-serve")
        if not os.path.exists(exe):
            return "(sluice-serve was not built here: sluice serve --help lists the options)"
        argv = [exe, "--help"]
    else:
        argv = [sluice_bin] if cmd == "" else [sluice_bin, cmd, "--help"]
        if cmd == "":
            argv = [sluice_bin, "--help"]
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    t = (r.stdout or r.stderr).rstrip("\n")
    if not t:
        sys.exit("gen.py: %s printed no help" % " ".join(argv))
    return t.replace("\t", "    ")


for d in ("man1", "man3"):
    os.makedirs(os.path.join(out, d), exist_ok=True)
for name in sorted(os.listdir(src)):
    if not name.endswith(".scd"):
        continue
    page = name[:-4]                       # sluice_open.3
    base, section = page.rsplit(".", 1)
    body = open(os.path.join(src, name), encoding="utf-8").read()
    aliases = []

    def synopsis(m):
        lines = []
        for fn in m.group(1).split():
            if fn not in protos:
                sys.exit("gen.py: %s names %s, which include/sluice.h does not declare" % (name, fn))
            lines.append(protos[fn])
            if fn != base:
                aliases.append(fn)
        return "```\n#include <sluice.h>\n\n" + "\n".join(lines) + "\n```"

    body = re.sub(r"\{\{synopsis:([^}]*)\}\}", synopsis, body)
    body = re.sub(r"\{\{help:\s*([\w-]*)\}\}", lambda m: "```\n" + helptext(m.group(1)) + "\n```", body)
    r = subprocess.run([scdoc], input=body, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("gen.py: scdoc %s: %s" % (name, r.stderr))
    with open(os.path.join(out, "man" + section, page), "w", encoding="utf-8") as f:
        f.write(r.stdout)
    for a in aliases:
        with open(os.path.join(out, "man" + section, a + "." + section), "w") as f:
            f.write(".so man%s/%s\n" % (section, page))
