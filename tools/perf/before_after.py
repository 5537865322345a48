#!/usr/bin/python3
"""Summarises tools/perf/before_after.sh's OUTDIR: per round and build,
the medians of the verified stream, sluice_verify, `sluice verify` and
baseline (e) (from `sluice bench --csv`), the wall of the separate
`sluice verify` runs, the local part loads (`sluice bench --world 4`),
and the load average (uptime) before and after; then, over the rounds,
the medians and the after/before ratios. GB/s over (e) is (e)'s wall over
the run's wall, both measured in the same `sluice bench` process.

usage: before_after.py OUTDIR
"""
import csv, glob, os, re, statistics, sys

def med(xs):
    return statistics.median(xs) if xs else float("nan")

ROWS = {  # csv (config, mode) -> short name
    ("pread-sha256-parallel", "baseline"): "e",
    ("sluice", "stream"): "stream",
    ("sluice", "stream*"): "stream*",
    ("sluice_verify", "verify"): "sluice_verify",
    ("sluice verify", "verify*"): "verify*",
}

def one(prefix):
    r = {}
    walls, cpus = {}, {}
    with open(prefix + ".stream.csv") as f:
        for row in csv.DictReader(f):
            k = ROWS.get((row["config"], row["mode"]))
            if k and row["ok"] == "1":
                walls.setdefault(k, []).append(float(row["wall_s"]))
                if row["cpu_s"]:
                    cpus.setdefault(k, []).append(float(row["cpu_s"]))
    for k, v in walls.items():
        r[k] = med(v)
    for k, v in cpus.items():
        r["cpu " + k] = med(v)
    with open(prefix + ".verify.txt") as f:
        v = [float(x) for x in f.read().split() if re.match(r"^[0-9.]+$", x)]
    r["verify_cmd"] = med(v)
    with open(prefix + ".parts.txt") as f:
        t = f.read()
    m = re.search(r"^shard rank\s+([0-9.]+)", t, re.M)
    r["shard"] = float(m.group(1)) if m else float("nan")
    m = re.search(r"^4 ranks at once\s+([0-9.]+)", t, re.M)
    r["ranks4"] = float(m.group(1)) if m else float("nan")
    m = re.search(r"^whole\+slice rank\s+([0-9.]+)", t, re.M)
    r["whole"] = float(m.group(1)) if m else float("nan")
    with open(prefix + ".uptime") as f:
        loads = re.findall(r"load average: ([0-9.]+)", f.read())
    r["load"] = "%s..%s" % (loads[0], loads[-1]) if loads else "?"
    r["loadmax"] = max(float(x) for x in loads) if loads else float("nan")
    return r

def main(out):
    rounds = sorted({int(re.search(r"round-(\d+)-", p).group(1))
                     for p in glob.glob(os.path.join(out, "round-*-*.uptime"))})
    data = {}
    for k in rounds:
        for b in ("before", "after"):
            p = os.path.join(out, "round-%d-%s" % (k, b))
            if os.path.exists(p + ".parts.txt"):
                data[(k, b)] = one(p)
    rounds = [k for k in rounds if (k, "before") in data and (k, "after") in data]
    cols = ["e", "stream", "stream*", "sluice_verify", "verify*", "verify_cmd", "shard", "ranks4"]
    print("| round | build | load (1-min, first..last) | (e) s | stream s | stream* s | sluice_verify s | `sluice verify`* s | `sluice verify` x5 s | stream/(e) | verify*/(e) | shard rank 0 s | 4 ranks s |")
    print("| --- |" * 1 + " --- |" * 12)
    for k in rounds:
        for b in (("before", "after") if k % 2 else ("after", "before")):
            d = data[(k, b)]
            print("| %d | %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.3f | %.3f |" % (
                k, b, d["load"], d["e"], d["stream"], d["stream*"], d["sluice_verify"], d["verify*"],
                d["verify_cmd"], d["e"] / d["stream"], d["e"] / d["verify*"], d["shard"], d["ranks4"]))
    print()
    print("Over %d rounds (medians):" % len(rounds))
    print()
    print("| measure | before | after | after/before (of medians) | per-round after/before, median [min-max] |")
    print("| --- | --- | --- | --- | --- |")
    def row(name, f, higher_better):
        bv = [f(data[(k, "before")]) for k in rounds]
        av = [f(data[(k, "after")]) for k in rounds]
        pr = [a / b for a, b in zip(av, bv)]
        mb, ma = med(bv), med(av)
        print("| %s | %.3f | %.3f | %.3f | %.3f [%.3f-%.3f] |" % (name, mb, ma, ma / mb, med(pr), min(pr), max(pr)))
    row("stream GB/s over (e) (higher is better)", lambda d: d["e"] / d["stream"], True)
    row("stream* (whole process) over (e)", lambda d: d["e"] / d["stream*"], True)
    row("sluice_verify over (e)", lambda d: d["e"] / d["sluice_verify"], True)
    row("`sluice verify`* (whole process) over (e)", lambda d: d["e"] / d["verify*"], True)
    row("(e) wall s", lambda d: d["e"], False)
    row("stream wall s", lambda d: d["stream"], False)
    row("`sluice verify`* wall s", lambda d: d["verify*"], False)
    row("`sluice verify` separate, wall s (median of 5)", lambda d: d["verify_cmd"], False)
    row("(e) CPU s (user+sys)", lambda d: d["cpu e"], False)
    row("stream CPU s (user+sys, every thread)", lambda d: d["cpu stream"], False)
    row("`sluice verify`* CPU s", lambda d: d["cpu verify*"], False)
    row("shard rank 0 wall s", lambda d: d["shard"], False)
    row("4 ranks at once wall s", lambda d: d["ranks4"], False)
    row("whole+slice rank 0 wall s", lambda d: d["whole"], False)

if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1])
