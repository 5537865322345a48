"""Fails when README.md is longer than its limit (issue 37: the README stays
an overview; detail goes to docs/). Counts lines as wc -l does. First
checks itself on made-up text at the limit and one line over it, so that
a count that could never fail fails the test.
usage: check_length.py README.md MAX_LINES     (exit 1 when over)
"""
import sys


def lines(text):
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


path, limit = sys.argv[1], int(sys.argv[2])
if lines("x\n" * limit) > limit or lines("x\n" * (limit + 1)) <= limit \
        or lines("x\n" * limit + "x") <= limit:
    sys.exit("check_length.py: the line count itself is wrong")
n = lines(open(path, encoding="utf-8").read())
if n > limit:
    sys.exit("%s: %d lines, more than %d: move detail to docs/ and link it" % (path, n, limit))
print("%s: %d lines (at most %d)" % (path, n, limit))
