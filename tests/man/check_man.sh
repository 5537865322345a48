#!/bin/bash
# The man pages (man/*.scd, built by man/gen.py into BUILD/man): every
# SLUICE_API function of sluice.h has a page in man3 (its own or a .so
# alias of its group's), every subcommand `sluice --help` lists has
# sluice-CMD(1), sluice(1) and sluice(3) exist, and `man --warnings -l`
# renders each page at 80 columns without a warning.
# usage: check_man.sh MAN_DIR SLUICE_H SLUICE_BIN
set -u
M=$1
H=$2
S=$3
command -v man >/dev/null || { echo "skip: man is not installed (man-db, groff-base)"; exit 77; }
fails=0
bad() { fails=$((fails + 1)); echo "FAIL - $*"; }
fns=$(tr '\n' ' ' <"$H" | grep -oE 'SLUICE_API [^;(]*\(' | grep -oE 'sluice_[a-z0-9_]+ *\($' | tr -d ' (')
n=0
for f in $fns; do
    n=$((n + 1))
    [ -f "$M/man3/$f.3" ] || bad "no man page for $f (man/*.scd: name it in a {{synopsis: ...}})"
done
[ "$n" -ge 60 ] || bad "found only $n SLUICE_API functions in $H"
cmds=$(ASAN_OPTIONS=detect_leaks=0 "$S" --help | sed -n '/^commands:/,/^$/p' | awk 'NR > 1 && NF { print $1 }')
m=0
for c in $cmds; do
    m=$((m + 1))
    [ -f "$M/man1/sluice-$c.1" ] || bad "no man page for 'sluice $c' (man/sluice-$c.1.scd)"
done
[ "$m" -ge 10 ] || bad "found only $m subcommands in sluice --help"
for p in man1/sluice.1 man3/sluice.3; do
    [ -f "$M/$p" ] || bad "no $p"
done
pages=0
warnings=$(mktemp)
trap 'rm -f "$warnings"' EXIT
cd "$M" || exit 1
for p in man1/*.1 man3/*.3; do
    pages=$((pages + 1))
    # one rendering gives both the page and its warnings (two were too
    # slow on a loaded 2-core machine: over 120 s for 95 pages)
    out=$(MANWIDTH=80 man --warnings -l "$p" 2>"$warnings")
    w=$(cat "$warnings")
    [ -z "$w" ] || bad "$p: $w"
    for s in NAME SYNOPSIS EXAMPLE; do
        grep -q "^$s" <<<"$out" || bad "$p has no $s section"
    done
done
echo "$n functions, $m subcommands, $pages pages checked, $fails failures"
[ $fails -eq 0 ]
