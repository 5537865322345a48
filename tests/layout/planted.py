"""Proves that check_layers.py's calls check catches what it is for: small C
files in fake layer folders (top > mid > low) are compiled and checked
against a layer table of their own.

- clean: every use goes down, no two files use each other: the check passes;
- planted: low/up.c calls mid_c() of mid/c.c (an upward call) and mid/b.c
  and mid/d.c call each other (a loop): the check fails, naming exactly
  those two and nothing else;
- the same two listed as exceptions: passes; an exception that matches
  nothing: fails, naming it;
- an object that is not there: fails.
usage: planted.py CHECK_LAYERS_PY CC NM     (exit 1 with what went wrong)
"""
import os
import subprocess
import sys
import tempfile

check, cc, nm = sys.argv[1], sys.argv[2].split(), sys.argv[3]

TABLE = """# fake layout
<!-- layers: -->
| layer | may include |
| --- | --- |
| top | every layer |
| mid | low |
| low | low |
"""

CLEAN = {
    "top/main.c": "int mid_b(void);\nint top_main(void) { return mid_b(); }\n",
    "mid/b.c": "int low_a(void);\nint mid_b(void) { return low_a(); }\n",
    "mid/c.c": "int low_a(void);\nint mid_c(void) { return low_a() + 1; }\n",
    "low/a.c": "int low_a(void) { return 1; }\n",
    "low/up.c": "int low_a(void);\nint low_up(void) { return low_a() + 2; }\n",
}
PLANTED = dict(CLEAN)
PLANTED["low/up.c"] = "int mid_c(void);\nint low_up(void) { return mid_c() + 2; }\n"
PLANTED["mid/b.c"] = ("int low_a(void);\nint mid_d(int);\n"
                      "int mid_b(void) { return low_a() + mid_d(0); }\n")
PLANTED["mid/d.c"] = "int mid_b(void);\nint mid_d(int n) { return n ? mid_b() : 0; }\n"

failures = []


def build(tmp, name, files):
    src = os.path.join(tmp, name, "src")
    objs = []
    for rel, code in sorted(files.items()):
        path = os.path.join(src, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(code)
        obj = os.path.join(tmp, name, "obj", rel + ".o")
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        subprocess.run(cc + ["-c", path, "-o", obj], check=True)
        objs.append(obj)
    return src, objs


def run(tmp, src, objs, exceptions=""):
    layout = os.path.join(tmp, "layout%d.md" % len(os.listdir(tmp)))
    with open(layout, "w", encoding="utf-8") as f:
        f.write(TABLE)
        if exceptions:
            f.write("\n<!-- layer exceptions: -->\n| from | to | reason |\n| --- | --- | --- |\n")
            f.write(exceptions)
    p = subprocess.run([sys.executable, check, src, layout, "--nm", nm, "--objects"] + objs,
                       capture_output=True, text=True)
    return p.returncode, [l for l in p.stdout.splitlines() if l.startswith("FAIL")], p.stdout


def expect(what, cond, out):
    if not cond:
        failures.append(what)
        print("NOT OK -", what, "\n" + out)
    else:
        print("ok -", what)


with tempfile.TemporaryDirectory() as tmp:
    src, objs = build(tmp, "clean", CLEAN)
    rc, fails, out = run(tmp, src, objs)
    expect("clean objects pass", rc == 0 and not fails, out)

    src, objs = build(tmp, "planted", PLANTED)
    rc, fails, out = run(tmp, src, objs)
    up = [l for l in fails if "low/up.c uses mid_c of mid/c.c: an upward call" in l]
    loop = [l for l in fails if "a loop of calls: mid/b.c uses mid_d of mid/d.c, "
            "and mid/d.c uses mid_b of mid/b.c" in l]
    expect("the planted upward call fails the check", rc == 1 and len(up) == 1, out)
    expect("the planted loop fails the check", rc == 1 and len(loop) == 1, out)
    expect("nothing else fails", len(fails) == 2, out)

    rows = ("| low/up.c | mid/c.c | planted |\n"
            "| mid/d.c | mid/b.c | planted, listed the other way round |\n")
    rc, fails, out = run(tmp, src, objs, rows)
    expect("both listed as exceptions: passes", rc == 0 and not fails, out)

    rc, fails, out = run(tmp, src, objs, rows + "| low/a.c | mid/b.c | stale |\n")
    expect("an exception that matches nothing fails",
           rc == 1 and len(fails) == 1 and "low/a.c -> mid/b.c (stale) matches no" in fails[0],
           out)

    rc, fails, out = run(tmp, src, objs + [os.path.join(tmp, "gone.c.o")])
    expect("a missing object fails", rc == 1 and any("no such object" in l for l in fails), out)

sys.exit(1 if failures else 0)
