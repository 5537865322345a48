"""Lists the facts of an old README that the new README and docs/ lost.

Splits OLD into units (each table row, each line of a code block, each
sentence of the prose, whitespace and Markdown emphasis normalised) and
prints those that appear in none of the NEW files (normalised the same
way, joined). Used once, for issue 26's move of the README into docs/:
  git show BASE:README.md > /tmp/old.md
  /usr/bin/python3 tools/docs_lost.py /tmp/old.md README.md docs/*.md
usage: docs_lost.py OLD NEW...
"""
import re
import sys


def norm(s):
    s = s.replace("**", "").replace("`", "")
    s = re.sub(r"\]\([^)]*\)", "]", s)      # links: their targets moved (../)
    s = s.replace("[", "").replace("]", "")
    return re.sub(r"\s+", " ", s).strip()


def units(text):
    out = []
    fence = False
    para = []

    def flush():
        if para:
            prose = norm(" ".join(para))
            for u in re.split(r"(?<=[.;:!?])\s+(?=[A-Z(`*])", prose):
                if len(u) > 3:
                    out.append(u)
            para.clear()

    for line in text.split("\n"):
        if line.startswith("```"):
            flush()
            fence = not fence
            continue
        if fence or line.startswith("|"):
            flush()
            if line.strip():
                out.append(norm(line))
            continue
        if not line.strip() or line.startswith("#") or re.match(r"\s*- ", line):
            flush()
            if line.startswith("#"):
                continue
        para.append(re.sub(r"^\s*- ", "", line))
    flush()
    return out


old = open(sys.argv[1], encoding="utf-8").read()
new = norm(" \n ".join(open(f, encoding="utf-8").read() for f in sys.argv[2:]))
new_lines = set(norm(l) for f in sys.argv[2:] for l in open(f, encoding="utf-8"))
lost = [u for u in units(old) if u not in new and u not in new_lines]
for u in lost:
    print("LOST:", u)
print("%d units, %d lost" % (len(units(old)), len(lost)), file=sys.stderr)
sys.exit(1 if lost else 0)
