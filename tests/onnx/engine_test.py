#!/usr/bin/python3
"""ctest onnx_engine: examples/onnx_engine (C, ONNX Runtime's C API) runs
ONNX blocks whose weights are external and absent, with weights sluice
reads, verifies and hands to ONNX Runtime in place.

  1. bit-equal to ONNX Runtime running the same graphs with the weights
     embedded (--embedded), same ONNX Runtime, same session options: the
     SHA-256 of the logits at the prompt and at each of 3 greedy decode
     steps, with a pool under half the model (weights released after each
     block);
  2. zero copy: --test-poke changes one byte of a verified handle after
     the block's session was created; the logits change, so ONNX Runtime
     reads the handle's memory, not a copy;
  3. a flipped byte in layer 1's weight: exit 1, the message names the
     tensor and both digests, only the blocks before layer 1 ran;
  4. weights lacking a tensor, or holding it in another dtype or shape
     than the plan's; a plan that disagrees with its graph (an
     initializer the graph lacks, another dtype, an external initializer
     the plan leaves out); a block file changed after export: exit 1
     naming both values, before any block ran.

  5. where examples/python/onnx_blocks.py is in the tree (sluice.onnx's
     export of a Llama-style transformer, with eager torch's logits) and
     torch is importable: that export too, bit-equal to its embedded
     graphs at the prompt and 3 steps with a pool under half the model,
     and within the documented tolerance of eager torch (docs/onnx.md:
     |onnx - eager| <= 1e-4 * max(1, max |eager|), the same tokens).

The graphs of 1-4 are hand-made with python3-onnx (tests/onnx/make_blocks.py).
Exit 77 (skip) with the reason when ONNX Runtime was not found at
configure time (--absent REASON) or python3-onnx or NumPy is missing.

usage: engine_test.py ENGINE SLUICE_CLI REPO
       engine_test.py --absent REASON
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

if sys.argv[1:2] == ["--absent"]:
    print(f"skip: {sys.argv[2]}")
    sys.exit(77)
try:
    import numpy as np
    import onnx  # noqa: F401
except ImportError as e:
    print(f"skip: {e} (Debian: python3-onnx python3-numpy)")
    sys.exit(77)

ENGINE, CLI, REPO = sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_blocks  # noqa: E402

# ONNX Runtime leaks 14 bytes of its own in CreateEnv/ReleaseEnv (a
# stripped library: no symbol to name): suppressed for it alone.
ENV = dict(os.environ)
ENV["LSAN_OPTIONS"] = (ENV.get("LSAN_OPTIONS", "") + ":suppressions=" +
                       os.path.join(HERE, "lsan.supp")).lstrip(":")
failures = []
STEP = re.compile(r"^step (\d+) token (\d+) logits_sha256 ([0-9a-f]{64})$", re.M)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def engine(*args):
    return subprocess.run([ENGINE, *args, "--threads", "2", "--trace"], capture_output=True,
                          text=True, timeout=600, env=ENV)


def ran(out):
    return re.findall(r"^ran (\S+) ", out, re.M)


def edited(src, dst, block, initializer, change):
    """A copy of src whose plan has block's initializer changed (a dict of
    keys to set, or a function of the block and the initializer's name)."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, "plan.json")
    with open(path) as f:
        plan = json.load(f)
    b = next(b for b in plan["blocks"] if b["name"] == block)
    if callable(change):
        change(b, initializer)
    else:
        next(i for i in b["initializers"] if i["name"] == initializer).update(change)
    with open(path, "w") as f:
        json.dump(plan, f)
    return dst


def pieces(tmp, toks):
    """Plan version 2: the embedding's rows read by the engine (a "gather"
    block) and the head's weight in vocab parts, with a pool under 1/4 of
    the weights, which the whole embedding alone does not fit."""
    vocab, parts, head = 4096, 8, "lm_head.weight"
    w, x, xw, emb = (os.path.join(tmp, d) for d in ("pw", "px", "pxw", "pemb"))
    weights = make_blocks.weights(vocab=vocab)
    os.makedirs(w)
    make_blocks.write_safetensors(os.path.join(w, "model.safetensors"), weights)
    make_blocks.export(x, weights, embedded=False, parts=parts)
    make_blocks.export(xw, weights, embedded=False)
    make_blocks.export(emb, weights, embedded=True)
    rules = os.path.join(tmp, "rules")
    with open(rules, "w") as f:
        f.write(f"{head} 1\nmodel.embed_tokens.weight 0\n")
    r = subprocess.run([CLI, "manifest", w, "-o", os.path.join(w, "sluice.manifest.json"), "-q",
                        "--chunk", "4K", "--parts", rules, "--worlds", str(parts)],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"a manifest with chunk and part digests ({r.stderr.strip()})")
    total = os.path.getsize(os.path.join(w, "model.safetensors"))
    pool = total // 4 - 4096
    emb_bytes = weights["model.embed_tokens.weight"].nbytes
    check(pool < emb_bytes, f"the pool ({pool}) is under 1/4 of the weights ({total}) and under "
          f"the embedding ({emb_bytes})")
    base = engine("--embedded", emb, "--tokens", toks, "--steps", "3")
    want = STEP.findall(base.stdout)
    check(base.returncode == 0 and len(want) == 4,
          f"parts: the embedded run exits 0 with 4 steps ({base.stderr.strip()[-300:]})")
    r = engine(x, w, "--tokens", toks, "--steps", "3", "--pool", str(pool))
    got = STEP.findall(r.stdout)
    check(r.returncode == 0 and got == want,
          f"rows and {parts} vocab parts: logits bit-equal to the embedded run at the prompt and "
          f"3 steps ({r.stderr.strip()[-300:]})")
    nparts = re.findall(rf"^part lm_head (\d+)/{parts} ", r.stdout, re.M)
    check(nparts == [str(k) for k in range(parts)] * 4 and len(ran(r.stdout)) == 4 * 6,
          f"the head ran once per part, in order, at each step ({len(nparts)} part runs)")
    m = re.search(r"pool_high_water (\d+) tensors_verified (\d+)", r.stdout)
    check(m is not None and 0 < int(m.group(1)) <= pool,
          f"the pool's high water within the pool ({m and m.group(0)}, pool {pool})")
    r = engine(xw, w, "--tokens", toks, "--pool", str(pool))
    check(r.returncode == 1 and "model.embed_tokens.weight" in r.stderr,
          f"the whole-tensor plan does not run in that pool ({r.stderr.strip()[-200:]})")

    axis = os.path.join(tmp, "paxis")  # the plan joins the head's parts along the tokens
    shutil.copytree(x, axis)
    with open(os.path.join(axis, "plan.json")) as f:
        plan = json.load(f)
    joined = [b for b in plan["blocks"] if "join_axis" in b]
    check(len(joined) == 1 and joined[0]["join_axis"] == 2, "the head joins on axis 2")
    joined[0]["join_axis"] = 1
    with open(os.path.join(axis, "plan.json"), "w") as f:
        json.dump(plan, f)
    r = engine(axis, w, "--tokens", toks, "--pool", str(pool))
    check(r.returncode == 1 and "join_axis 1" in r.stderr and "512 rows" in r.stderr
          and not STEP.findall(r.stdout),
          f"a join_axis other than the parted one fails, not wrong logits ({r.stderr.strip()[-200:]})")

    bad = os.path.join(tmp, "pbad")
    shutil.copytree(w, bad)
    path = os.path.join(bad, "model.safetensors")
    with open(path, "r+b") as fh:
        n = int.from_bytes(fh.read(8), "little")
        begin = json.loads(fh.read(n))[head]["data_offsets"][0]
        col = 5 * (vocab // parts) + 7  # in part 5 of 8 along the vocab
        fh.seek(8 + n + begin + (3 * vocab + col) * 4 + 1)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 1]))
    r = engine(x, bad, "--tokens", toks, "--pool", str(pool))
    done = re.findall(rf"^part lm_head (\d+)/{parts} ", r.stdout, re.M)
    check(r.returncode == 1 and head in r.stderr and not STEP.findall(r.stdout)
          and done == [str(k) for k in range(5)],
          f"a flipped byte in part 5 of {head}: exit 1 naming the tensor, parts 0-4 ran "
          f"({done}; {r.stderr.strip()[-300:]})")


def exported(tmp):
    script = os.path.join(REPO, "examples", "python", "onnx_blocks.py")
    if not os.path.exists(script):
        print("note: no examples/python/onnx_blocks.py: the exported model's checks not run")
        return
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"note: {e} (Debian: python3-torch): the exported model's checks not run")
        return
    d = os.path.join(tmp, "tiny-onnx")
    r = subprocess.run(["/usr/bin/python3", script, "make", d, "--sluice", CLI, "--steps", "3",
                        "--vocab-parts", "4"],
                       capture_output=True, text=True, timeout=600)
    check(r.returncode == 0, f"onnx_blocks.py make exits 0 ({r.stderr.strip()[-400:]})")
    if r.returncode:
        return
    with open(os.path.join(d, "eager.json")) as f:
        eager = json.load(f)
    toks = ",".join(map(str, eager["prompt"]))
    total = os.path.getsize(os.path.join(d, "weights", "model.safetensors"))
    pool = total // 2 - (64 << 10)
    base = engine("--embedded", os.path.join(d, "embedded"), "--tokens", toks, "--steps", "3")
    r = engine(os.path.join(d, "blocks"), os.path.join(d, "weights"), "--tokens", toks,
               "--steps", "3", "--pool", str(pool), "--dump-logits", os.path.join(d, "got"))
    want, got = STEP.findall(base.stdout), STEP.findall(r.stdout)
    check(base.returncode == 0 and r.returncode == 0 and len(got) == 4 and got == want,
          f"sluice.onnx's export: bit-equal to its embedded graphs at the prompt and 3 steps, "
          f"pool {pool} of {total} bytes ({r.stderr.strip()[-300:]})")
    worst = 0.0
    for s in eager["steps"]:
        a = np.fromfile(os.path.join(d, s["logits"]), dtype=np.float32)
        path = os.path.join(d, f"got-{s['step']:03d}.f32")
        b = np.fromfile(path, dtype=np.float32) if os.path.exists(path) else np.zeros(0, np.float32)
        ok = a.shape == b.shape
        err = float(np.abs(a - b).max()) if ok else float("inf")
        worst = max(worst, err)
        tol = 1e-4 * max(1.0, float(np.abs(a).max()))
        tok_ok = s["step"] < len(got) and int(got[s["step"]][1]) == s["token"]
        check(ok and err <= tol and tok_ok,
              f"step {s['step']}: within {tol:.2g} of eager torch (max |diff| {err:.3g}), "
              f"token {s['token']} as eager's")
    print(f"     max |onnx - eager| {worst:.3g}")
    quarter = total // 4
    r = engine(os.path.join(d, "pieces"), os.path.join(d, "weights"), "--tokens", toks,
               "--steps", "3", "--pool", str(quarter))
    got = STEP.findall(r.stdout)
    m = re.search(r"pool_high_water (\d+)", r.stdout)
    check(r.returncode == 0 and got == want and len(re.findall(r"^part lm_head ", r.stdout, re.M))
          == 16 and m is not None and int(m.group(1)) <= quarter,
          f"sluice.onnx's export in pieces (the embedding's rows, the head in 4 vocab parts): "
          f"bit-equal to the embedded graphs at the prompt and 3 steps, pool {quarter} of "
          f"{total} bytes, high water {m and m.group(1)} ({r.stderr.strip()[-300:]})")


def main():
    tmp = tempfile.mkdtemp(prefix="sluice-onnx-")
    try:
        w, x, emb = (os.path.join(tmp, d) for d in ("weights", "export", "embedded"))
        make_blocks.main(["make_blocks", w, x, emb])
        subprocess.run([CLI, "manifest", w, "-o", os.path.join(w, "sluice.manifest.json"), "-q"],
                       check=True, capture_output=True)
        with open(os.path.join(x, "plan.json")) as f:
            plan = json.load(f)
        total = os.path.getsize(os.path.join(w, "model.safetensors"))
        nblocks = len(plan["blocks"])
        toks = "3,14,15,9,26,5,35,8,9,7,9,3"

        base = engine("--embedded", emb, "--tokens", toks, "--steps", "3")
        want = STEP.findall(base.stdout)
        check(base.returncode == 0 and len(want) == 4,
              f"the embedded-weight run exits 0 with 4 steps ({base.stderr.strip()[-400:]})")
        pool = "256K"
        check(256 << 10 < total // 2, f"the pool ({pool}) is under half the model ({total} bytes)")
        r = engine(x, w, "--tokens", toks, "--steps", "3", "--pool", pool)
        got = STEP.findall(r.stdout)
        check(r.returncode == 0, f"the on-demand run exits 0 ({r.stderr.strip()[-400:]})")
        check(got == want, "logits bit-equal to the embedded run at the prompt and 3 decode steps")
        check(len(ran(r.stdout)) == 4 * nblocks, f"{nblocks} blocks ran at each of the 4 steps")
        check(" resident 0" in r.stdout.splitlines()[0], "weights released after each block")
        m = re.search(r"pool_high_water (\d+) tensors_verified (\d+)", r.stdout)
        check(m is not None and int(m.group(1)) <= 256 << 10 and int(m.group(2)) > 0,
              f"the pool's high water within the pool, tensors verified ({m and m.group(0)})")
        r = engine(x, w, "--tokens", toks, "--steps", "1", "--resident")
        check(r.returncode == 0 and STEP.findall(r.stdout) == want[:2]
              and len(ran(r.stdout)) == 2 * nblocks,
              f"--resident: the same logits, sessions kept ({r.stderr.strip()[-300:]})")

        poked = "model.layers.1.mlp.down_proj.weight"
        r = engine(x, w, "--tokens", toks, "--pool", pool, "--test-poke", poked)
        got = STEP.findall(r.stdout)
        check(r.returncode == 0 and len(got) == 1 and got[0][2] != want[0][2],
              "a byte of the handle changed after session creation changes the logits: "
              "ONNX Runtime reads the handle in place")

        bad = os.path.join(tmp, "bad")
        shutil.copytree(w, bad)
        tensor = "model.layers.1.mlp.up_proj.weight"
        path = os.path.join(bad, "model.safetensors")
        with open(path, "r+b") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
            begin, end = header[tensor]["data_offsets"]
            fh.seek(8 + n + (begin + end) // 2)
            byte = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([byte[0] ^ 1]))
        r = engine(x, bad, "--tokens", toks, "--pool", pool)
        check(r.returncode == 1, "a flipped byte in layer 1: exit 1")
        check(tensor in r.stderr and len(set(re.findall(r"\b[0-9a-f]{64}\b", r.stderr))) >= 2,
              f"the message names the tensor and both digests ({r.stderr.strip()[-300:]})")
        check(ran(r.stdout) == ["model.embed_tokens", "model.layers.0"],
              f"only the blocks before layer 1 ran ({ran(r.stdout)})")

        up2 = "model.layers.2.mlp.up_proj.weight"
        weights = make_blocks.weights()
        variants = [
            ("lacking the tensor", {k: v for k, v in weights.items() if k != up2},
             [up2, "onnx::MatMul_120", "not in"]),
            ("holding it in F16", dict(weights, **{up2: weights[up2].astype(np.float16)}),
             ["F16 [64, 256] in the weights", "F32 [64, 256] in the plan", up2,
              "onnx::MatMul_120"]),
            ("holding it as [256, 64]", dict(weights, **{up2: weights[up2].reshape(256, 64)}),
             ["F32 [256, 64] in the weights", "F32 [64, 256] in the plan", up2,
              "onnx::MatMul_120"]),
        ]
        for name, tensors, words in variants:
            d = tempfile.mkdtemp(prefix="w-", dir=tmp)
            make_blocks.write_safetensors(os.path.join(d, "model.safetensors"), tensors)
            r = engine(x, d, "--tokens", toks)
            check(r.returncode == 1 and all(s in r.stderr for s in words) and not ran(r.stdout),
                  f"weights {name} fail before any block, naming both "
                  f"({r.stderr.strip()})")

        def drop(b, init):
            b["initializers"] = [i for i in b["initializers"] if i["name"] != init]

        plans = [
            ("an initializer the graph lacks", dict(name="onnx::MatMul_120x"),
             ["'onnx::MatMul_120x'", up2, "not an initializer of", "block-004.onnx"]),
            ("another dtype than the graph's", dict(dtype="F16"),
             ["'onnx::MatMul_120' is F32 [64, 256]", "the plan says F16 [64, 256]"]),
            ("another shape than the graph's", dict(shape=[256, 64]),
             ["'onnx::MatMul_120' is F32 [64, 256]", "the plan says F32 [256, 64]"]),
            ("an external initializer left out", drop,
             ["'onnx::MatMul_120'", "external data the plan does not hand over"]),
            ("a dimension past any count", dict(shape=[1e300, 256]),
             ['a dimension of "shape" is not a count']),
        ]
        for k, (name, change, words) in enumerate(plans):
            d = edited(x, os.path.join(tmp, f"plan-{k}"), "model.layers.2", "onnx::MatMul_120",
                       change)
            r = engine(d, w, "--tokens", toks)
            check(r.returncode == 1 and all(s in r.stderr for s in words) and not ran(r.stdout),
                  f"a plan with {name} fails before any block, naming both ({r.stderr.strip()})")

        tampered = os.path.join(tmp, "tampered")
        shutil.copytree(x, tampered)
        blk = plan["blocks"][-1]["file"]
        with open(os.path.join(tampered, blk), "ab") as fh:
            fh.write(b"\n")
        r = engine(tampered, w, "--tokens", toks)
        check(r.returncode == 1 and blk in r.stderr and plan["blocks"][-1]["sha256"] in r.stderr
              and len(set(re.findall(r"\b[0-9a-f]{64}\b", r.stderr))) == 2 and not ran(r.stdout),
              f"a block file changed after export fails before any block, both digests named "
              f"({r.stderr.strip()})")

        r = engine(x, w, "--tokens", "")
        check(r.returncode == 2 and "at least one id" in r.stderr and not ran(r.stdout),
              f"an empty prompt is a usage error, no block run ({r.stderr.strip()})")
        r = engine(x, w, "--tokens", toks, "--pool", "99999999999G")
        check(r.returncode == 2 and not ran(r.stdout),
              f"a pool past 2^64 is a usage error, not a wrapped small pool ({r.stderr.strip()})")
        for bad, why in ((["--tokens", toks, "--pool", " -1"], "a negative pool after a blank"),
                         (["--tokens", "-1"], "a negative id (Gather would read the last row)"),
                         (["--tokens", "+3"], "an id with a sign")):
            r = engine(x, w, *bad)
            check(r.returncode == 2 and not ran(r.stdout), f"{why} is a usage error ({r.stderr.strip()})")

        pieces(tmp, toks)
        exported(tmp)

        r = subprocess.run([ENGINE, "--help"], capture_output=True, text=True, env=ENV)
        check(r.returncode == 0 and "--embedded" in r.stdout and "--test-poke" in r.stdout,
              "--help documents the options")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
