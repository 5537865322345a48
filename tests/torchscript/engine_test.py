#!/usr/bin/python3
"""ctest torchscript_engine: examples/torchscript_engine (C++, libtorch)
runs TorchScript blocks exported without weights, with weights sluice
reads on demand.

  1. equal to eager torch, bit for bit (the SHA-256 of the logits at the
     prompt and at each of 3 greedy decode steps), tiny preset, a pool
     smaller than the model;
  2. a flipped byte in layer 1's weight: exit 1, the message names the
     tensor and both digests, and only the embedding and layer 0 ran;
  3. a plan naming a missing tensor, or one whose shape differs from the
     parameter's: exit 1 naming both, before any block ran;
  4. peak RSS with a 32 MiB pool and 110 MB of weights within the pool
     above the same blocks run with zero weights that hold no memory
     (--baseline: libtorch's own size, the compute's working memory
     included).
  5. the vocabulary in pieces (plan version 2, export --vocab-parts 8) on
     the tiny-tied preset (float32 values, a tied embedding of 88% of
     the weights): in a pool under a quarter of the weights, the logits
     of the whole-weight blocks with every weight resident, and of eager
     torch, bit for bit at the prompt and 3 decode steps, every part
     checked by its part digest; the whole-weight blocks refused in that
     pool (the embedding is larger than it); a byte flipped in vocab part
     5 of 8: exit 1 naming the tensor, the part and both digests, after
     the rows, the layers and the norm ran, not the head.
  6. a "gather" only where the block's first input is used as
     aten::embedding's indices and otherwise only for its shape: an
     embedding that also masks the pad id's rows (the positions among the
     distinct rows would be masked instead) runs whole, equal to eager;
     the plan marking it "gather": exit 1 before any block ran.
  6b. a torch.nn.Embedding with a padding_idx (its scripted F.embedding
     reads the table's row count): not marked "gather", runs whole equal
     to eager on one token repeated; the plan marking it: exit 1 before
     any block ran.
  7. a part count whose product with the part's rows wraps to the
     tensor's (2**54 + 8 parts of 1024 rows: 8192 mod 2**64): exit 1 before
     any block ran, naming the part, no signed overflow.

The plans are exported here by sluice.torch.export_blocks, loaded from
bindings/python/sluice/torchscript.py by path (it needs torch alone: the
Python binding is built later in tools/test.sh). Exit 77 (skip) when
/usr/bin/python3 has no torch.

usage: engine_test.py ENGINE SLUICE_CLI REPO
"""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import torch  # noqa: F401
    import numpy as np
except ImportError as e:
    print(f"skip: {e} (Debian: python3-torch python3-numpy)")
    sys.exit(77)

ENGINE, CLI, REPO = sys.argv[1:4]
sys.path.insert(0, os.path.join(REPO, "examples", "python"))
sys.path.insert(0, os.path.join(REPO, "bindings", "python", "tests"))
import torchscript_blocks as tb  # noqa: E402
import stfile  # noqa: E402

spec = importlib.util.spec_from_file_location(
    "sluice_torchscript", os.path.join(REPO, "bindings", "python", "sluice", "torchscript.py"))
ts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ts)

# glibc's mmap threshold grows with each large block freed; a fixed one
# makes peak RSS measure live memory, not the allocator's history.
ENV = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def engine(*args, asan_extra=""):
    env = dict(ENV)
    if asan_extra:
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":" + asan_extra).lstrip(":")
    return subprocess.run([ENGINE, *args], capture_output=True, text=True, timeout=600, env=env)


def ran(out):
    return re.findall(r"^ran (\S+)$", out, re.M)


def edited(src, dst, block, param, **change):
    shutil.copytree(src, dst)
    path = os.path.join(dst, "plan.json")
    with open(path) as f:
        plan = json.load(f)
    b = next(b for b in plan["blocks"] if b["name"] == block)
    next(p for p in b["params"] if p["name"] == param).update(change)
    with open(path, "w") as f:
        json.dump(plan, f)
    return dst


def pieces(tmp):
    cfg, parts, embed = tb.PRESETS["tiny-tied"], 8, "model.embed_tokens.weight"
    w = os.path.join(tmp, "tied")
    rng = np.random.default_rng(5)
    meta = tb.build(tb.config("tiny-tied", "F32", True), "meta")
    tensors = {k: ("F32", list(v.shape),
                   (rng.standard_normal(v.numel()) * 0.02).astype(np.float32).tobytes())
               for k, v in meta.state_dict().items()}
    stfile.write_sharded(w, [tensors])
    total = sum(len(t[2]) for t in tensors.values())
    # chunk digests of 64 KiB (the rows verify alone), part digests for 8
    subprocess.run([CLI, "manifest", w, "-o", os.path.join(w, "sluice.manifest.json"), "-q",
                    "--chunk", "64K", "--parts", "builtin", "--worlds", str(parts)], check=True)
    whole, piece = os.path.join(tmp, "tied-whole"), os.path.join(tmp, "tied-pieces")
    tb.export("tiny-tied", whole, ts.export_blocks, dtype="F32", values=True)
    tb.export("tiny-tied", piece, ts.export_blocks, dtype="F32", values=True, vocab_parts=parts)
    pool = 512 << 10
    check(pool * 4 < total and len(tensors[embed][2]) > pool,
          f"the pool is under a quarter of the weights ({total}) and smaller than the embedding")
    toks = tb.prompt(cfg)
    tok_arg = ",".join(map(str, toks))
    eager = [(str(i), str(t), tb.digest(lg)) for i, (t, lg) in
             enumerate(tb.greedy(tb.eager_model("tiny-tied", w, "F32", True), toks, 3))]
    steps = r"^step (\d+) token (\d+) logits_sha256 ([0-9a-f]{64})$"

    rw = engine(whole, w, "--tokens", tok_arg, "--steps", "3", "--pool", "8M")
    want = re.findall(steps, rw.stdout, re.M)
    check(rw.returncode == 0 and "resident 1" in rw.stdout.splitlines()[0],
          f"whole-weight blocks, every weight resident, exit 0 ({rw.stderr.strip()[-300:]})")
    rp = engine(piece, w, "--tokens", tok_arg, "--steps", "3", "--pool", "512K", "--trace")
    got = re.findall(steps, rp.stdout, re.M)
    check(rp.returncode == 0 and "resident 0" in rp.stdout.splitlines()[0],
          f"pieces in a quarter pool exit 0 ({rp.stderr.strip()[-300:]})")
    check(len(got) == 4 and got == want and got == eager,
          "pieces: the logits of the whole-weight blocks and of eager torch, bit for bit, at the "
          "prompt and 3 decode steps")
    check(len(re.findall(r"^part lm_head \d+/8$", rp.stdout, re.M)) == 4 * parts,
          "the head ran once per vocab part at each step")
    times = re.findall(r"^time (\S+) bind_ms ([0-9.]+) run_ms ([0-9.]+)$", rp.stdout, re.M)
    check([t[0] for t in times] == ran(rp.stdout) and all(float(t[2]) > 0 for t in times),
          f"--trace times each block's binding and forward ({len(times)} lines)")
    last = re.search(r"pool_high_water (\d+) .*part_fallback_bytes (\d+)", rp.stdout)
    check(last is not None and int(last.group(1)) <= pool and int(last.group(2)) == 0,
          f"within the pool, every part checked by its own digest ({last and last.group(0)})")

    axis = os.path.join(tmp, "tied-axis")  # the plan joins the head's parts along the tokens
    shutil.copytree(piece, axis)
    with open(os.path.join(axis, "plan.json")) as f:
        plan = json.load(f)
    head = [b for b in plan["blocks"] if "join_axis" in b]
    check(len(head) == 1 and head[0]["join_axis"] == -1, "the head joins on the last axis")
    head[0]["join_axis"] = 1
    with open(os.path.join(axis, "plan.json"), "w") as f:
        json.dump(plan, f)
    ra = engine(axis, w, "--tokens", tok_arg, "--pool", "512K")
    check(ra.returncode == 1 and "join_axis 1" in ra.stderr
          and f"part's {cfg['vocab'] // parts} rows" in ra.stderr and "step 0" not in ra.stdout,
          f"a join_axis other than the parted one fails, not wrong logits ({ra.stderr.strip()[-300:]})")

    rr = engine(whole, w, "--tokens", tok_arg, "--pool", "512K", "--trace")
    check(rr.returncode == 1 and embed in rr.stderr and not ran(rr.stdout),
          f"the whole-weight blocks are refused in that pool ({rr.stderr.strip()[-300:]})")

    bad = os.path.join(tmp, "tied-bad")
    shutil.copytree(w, bad)
    path = os.path.join(bad, "model-00001-of-00001.safetensors")
    _dt, _shape, raw, offset = stfile.parse(path)[2][embed]
    rows_per_part, row = cfg["vocab"] // parts, cfg["hidden"] * 4
    check(max(toks) < rows_per_part, "the prompt's rows are in part 0")
    at = (5 * rows_per_part + 17) * row + 3
    with open(path, "r+b") as fh:
        fh.seek(offset + at)
        fh.write(bytes([raw[at] ^ 1]))
    rb = engine(piece, bad, "--tokens", tok_arg, "--pool", "512K", "--trace")
    check(rb.returncode == 1 and embed in rb.stderr and "'lm_head' part 5/8" in rb.stderr
          and len(re.findall(r"\b[0-9a-f]{64}\b", rb.stderr)) >= 2,
          f"a byte flipped in vocab part 5: exit 1 naming the tensor, the part and both digests "
          f"({rb.stderr.strip()[-400:]})")
    check(ran(rb.stdout) == ["model.embed_tokens", "model.layers.0", "model.layers.1",
                             "model.norm"],
          f"the rows, the layers and the norm ran, not the head ({ran(rb.stdout)})")


class PadMaskedEmbedding(torch.nn.Module):
    """Its one 2-D parameter read only by rows of its input, the input also
    compared with the pad id (which a gather's positions do not equal)."""

    def __init__(self, vocab, hidden, pad):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(vocab, hidden), requires_grad=False)
        self.pad = pad

    def forward(self, ids):
        return torch.nn.functional.embedding(ids, self.weight) * \
            (ids != self.pad).unsqueeze(-1).float()


class PadMasked(torch.nn.Module):
    def __init__(self, vocab, hidden, pad):
        super().__init__()
        self.embed = PadMaskedEmbedding(vocab, hidden, pad)

    def forward(self, ids):
        return self.embed(ids)


def gather_checked(tmp):
    vocab, hidden, pad, toks = 16, 4, 1, [3, 7, 5, 1]
    w, exp = os.path.join(tmp, "padmask"), os.path.join(tmp, "padmask-ts")
    table = (np.arange(vocab * hidden, dtype=np.float32) + 1).reshape(vocab, hidden)
    stfile.write_sharded(w, [{"embed.weight": table}])
    m = PadMasked(vocab, hidden, pad)
    plan = ts.export_blocks(m, ["embed"], exp, gather_rows=True)
    check("gather" not in plan["blocks"][0], "an embedding that also masks by its ids: no gather")
    m.embed.weight = torch.nn.Parameter(torch.from_numpy(table), requires_grad=False)
    with torch.no_grad():
        want = tb.digest(m(torch.tensor([toks])))
    r = engine(exp, w, "--tokens", ",".join(map(str, toks)))
    got = re.findall(r"^step 0 token \d+ logits_sha256 ([0-9a-f]{64})$", r.stdout, re.M)
    check(r.returncode == 0 and got == [want], f"it runs whole, equal to eager ({r.stderr[-300:]})")
    marked = os.path.join(tmp, "padmask-gather")
    shutil.copytree(exp, marked)
    with open(os.path.join(marked, "plan.json")) as f:
        p = json.load(f)
    p["version"] = 2
    p["blocks"][0]["gather"] = {"param": "weight"}
    with open(os.path.join(marked, "plan.json"), "w") as f:
        json.dump(p, f)
    r = engine(marked, w, "--tokens", ",".join(map(str, toks)), "--trace")
    check(r.returncode == 1 and "gather" in r.stderr and "'embed'" in r.stderr
          and not ran(r.stdout),
          f"the plan marking it \"gather\": exit 1 before any block ({r.stderr.strip()[-300:]})")


class PaddedEmbedding(torch.nn.Module):
    def __init__(self, vocab, hidden, padding_idx):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden, padding_idx=padding_idx)

    def forward(self, ids):
        return self.embed(ids)


def padded_gather(tmp):
    vocab, hidden = 16, 4
    w, exp = os.path.join(tmp, "padded"), os.path.join(tmp, "padded-ts")
    table = (np.arange(vocab * hidden, dtype=np.float32) + 1).reshape(vocab, hidden)
    stfile.write_sharded(w, [{"embed.weight": table}])
    m = PaddedEmbedding(vocab, hidden, 1)
    plan = ts.export_blocks(m, ["embed"], exp, gather_rows=True)
    check("gather" not in plan["blocks"][0], "an embedding with a padding_idx: no gather")
    m.embed.weight.data = torch.from_numpy(table)
    with torch.no_grad():
        want = tb.digest(m(torch.tensor([[3, 3, 3]])))
    r = engine(exp, w, "--tokens", "3,3,3")
    got = re.findall(r"^step 0 token \d+ logits_sha256 ([0-9a-f]{64})$", r.stdout, re.M)
    check(r.returncode == 0 and got == [want],
          f"it runs whole on one token repeated, equal to eager ({r.stderr[-300:]})")
    marked = os.path.join(tmp, "padded-gather")
    shutil.copytree(exp, marked)
    with open(os.path.join(marked, "plan.json")) as f:
        p = json.load(f)
    p["version"] = 2
    p["blocks"][0]["gather"] = {"param": "weight"}
    with open(os.path.join(marked, "plan.json"), "w") as f:
        json.dump(p, f)
    # three distinct rows: enough for padding_idx 1 (one would fail its assert)
    r = engine(marked, w, "--tokens", "3,7,5", "--trace")
    check(r.returncode == 1 and 'the plan says "gather"' in r.stderr and not ran(r.stdout),
          f"the plan marking it \"gather\": exit 1 before any block ({r.stderr.strip()[-300:]})")


def huge_parts(tmp):
    """After pieces(tmp): its export with the head in 2**54 + 8 parts."""
    w, src = os.path.join(tmp, "tied"), os.path.join(tmp, "tied-pieces")
    n = (1 << 54) + 8  # a double exactly; 1024 * n = 2**64 + 8192
    d = os.path.join(tmp, "tied-huge-n")
    shutil.copytree(src, d)
    with open(os.path.join(d, "plan.json")) as f:
        p = json.load(f)
    p["blocks"][-1]["params"][0]["part"]["n"] = n
    with open(os.path.join(d, "plan.json"), "w") as f:
        json.dump(p, f)
    r = engine(d, w, "--pool", "512K", "--trace")
    check(r.returncode == 1 and "lm_head" in r.stderr and str(n) in r.stderr
          and "runtime error" not in r.stderr and not ran(r.stdout),
          f"{n} parts of 1024 rows for 8192: exit 1 before any block ran "
          f"({r.stderr.strip()[-400:]})")


def main():
    tmp = tempfile.mkdtemp(prefix="sluice-ts-")
    try:
        tiny, exp = os.path.join(tmp, "tiny"), os.path.join(tmp, "tiny-ts")
        subprocess.run([CLI, "synth", "tiny", tiny], check=True, capture_output=True)
        tb.export("tiny", exp, ts.export_blocks)
        toks = tb.prompt(tb.PRESETS["tiny"])
        want = [(str(i), str(t), tb.digest(lg)) for i, (t, lg) in
                enumerate(tb.greedy(tb.eager_model("tiny", tiny), toks, 3))]
        tok_arg = ",".join(map(str, toks))

        r = engine(exp, tiny, "--tokens", tok_arg, "--steps", "3", "--pool", "256K", "--trace")
        got = re.findall(r"^step (\d+) token (\d+) logits_sha256 ([0-9a-f]{64})$", r.stdout, re.M)
        check(r.returncode == 0, f"tiny run exits 0 ({r.stderr.strip()[-400:]})")
        check(got == want, "logits equal eager torch's at the prompt and 3 decode steps")
        check(len(ran(r.stdout)) == 4 * 7, "7 blocks ran at each of the 4 steps")
        check(re.search(r"^resident 0|resident 0$", r.stdout.splitlines()[0]) is not None,
              "a 256K pool does not hold the model: weights released after each block")

        bad = os.path.join(tmp, "bad")
        shutil.copytree(tiny, bad)
        tensor = "model.layers.1.mlp.up_proj.weight"
        for f in sorted(os.listdir(bad)):
            path = os.path.join(bad, f)
            if f.endswith(".safetensors") and tensor in stfile.parse(path)[2]:
                _dt, _shape, raw, offset = stfile.parse(path)[2][tensor]
                with open(path, "r+b") as fh:  # one byte mid-tensor
                    fh.seek(offset + len(raw) // 2)
                    fh.write(bytes([raw[len(raw) // 2] ^ 1]))
        r = engine(exp, bad, "--tokens", tok_arg, "--pool", "256K", "--trace")
        check(r.returncode == 1, "a flipped byte in layer 1: exit 1")
        check(tensor in r.stderr and len(re.findall(r"\b[0-9a-f]{64}\b", r.stderr)) >= 2,
              f"the message names the tensor and both digests ({r.stderr.strip()[-300:]})")
        check(ran(r.stdout) == ["model.embed_tokens", "model.layers.0"],
              f"only the blocks before layer 1 ran ({ran(r.stdout)})")

        for bad_args, why in ((["--pool", "99999999999G"], "a pool past 2^64"),
                              (["--pool", "-1"], "a negative pool"),
                              (["--pool", " -1"], "a negative pool after a blank"),
                              (["--tokens", "-1"], "a negative token id"),
                              (["--tokens", " 3"], "a token id after a blank"),
                              (["--tokens", ""], "an empty prompt"),
                              (["--tokens", "3,x"], "a token that is not a number"),
                              (["--steps", "-1"], "negative steps"),
                              (["--pool"], "an option without its value")):
            r = engine(exp, tiny, *bad_args)
            check(r.returncode == 2 and "usage:" in r.stderr and not ran(r.stdout),
                  f"{why} is a usage error (exit 2), no block run ({r.stderr.strip()[:120]})")

        missing = edited(exp, os.path.join(tmp, "missing"), "model.layers.2", "mlp.up_proj.weight",
                         tensor="model.layers.2.mlp.up_proj.weight.missing")
        r = engine(missing, tiny, "--trace")
        check(r.returncode == 1 and "model.layers.2.mlp.up_proj.weight.missing" in r.stderr
              and "'mlp.up_proj.weight'" in r.stderr and not ran(r.stdout),
              f"a missing tensor fails before any block, naming both ({r.stderr.strip()})")
        shape = edited(exp, os.path.join(tmp, "shape"), "model.layers.0", "self_attn.q_proj.weight",
                       tensor="model.layers.0.mlp.gate_proj.weight")
        r = engine(shape, tiny, "--trace")
        check(r.returncode == 1 and "[256, 64]" in r.stderr and "[64, 64]" in r.stderr
              and "model.layers.0.mlp.gate_proj.weight" in r.stderr and not ran(r.stdout),
              f"a shape that differs fails before any block, naming both ({r.stderr.strip()})")

        mid, mexp = os.path.join(tmp, "mid"), os.path.join(tmp, "mid-ts")
        rng = np.random.default_rng(3)
        meta = tb.build(tb.PRESETS["mid"], "meta")
        tensors = {k: ("BF16", list(v.shape), rng.integers(0, 65535, v.numel(), dtype=np.uint16)
                       .tobytes()) for k, v in meta.state_dict().items()}
        stfile.write_sharded(mid, [tensors])
        total = sum(len(t[2]) for t in tensors.values())
        tb.export("mid", mexp, ts.export_blocks)
        pool = 32 << 20
        # ASan's quarantine would keep freed compute buffers resident.
        rb = engine(mexp, mid, "--baseline", asan_extra="quarantine_size_mb=0")
        rr = engine(mexp, mid, "--pool", "32M", asan_extra="quarantine_size_mb=0")
        check(rb.returncode == 0 and rr.returncode == 0, f"mid runs exit 0 ({rr.stderr.strip()})")
        base = int(re.search(r"peak_rss_kb (\d+)", rb.stdout).group(1))
        peak = int(re.search(r"peak_rss_kb (\d+)", rr.stdout).group(1))
        print(f"     libtorch alone {base} KiB, run {peak} KiB, pool {pool >> 10} KiB, "
              f"weights {total >> 10} KiB")
        check(total > pool + (64 << 20), "the weights exceed the pool and the slack")
        # slack: the pool's shadow under ASan (1/8), allocator rounding
        check(peak <= base + (pool >> 10) + (16 << 10),
              "peak RSS within libtorch's own plus the pool (16 MiB slack)")
        pieces(tmp)
        huge_parts(tmp)
        gather_checked(tmp)
        padded_gather(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
