"""sluice.torch.export_blocks / ScriptedModel: TorchScript blocks exported
without weights, run with verified weights bound zero-copy, one block
ahead; equal to eager torch bit for bit; failures before the block that
would use a bad weight; a bad plan fails before any block; resident memory
within the pool above libtorch's own. Skipped when torch is absent."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")

import sluice  # noqa: E402
import sluice.torch as st  # noqa: E402
import sluice.torchscript as sts  # noqa: E402
import stfile  # noqa: E402
from conftest import REPO, sluice_cli  # noqa: E402
from test_torch import tiny  # noqa: E402,F401  (the fixture: `sluice synth tiny` or its stand-in)

sys.path.insert(0, os.path.join(REPO, "examples", "python"))
import torchscript_blocks as tb  # noqa: E402

EXAMPLE = os.path.join(REPO, "examples", "python", "torchscript_blocks.py")
CFG = tb.PRESETS["tiny"]
TOKENS = tb.prompt(CFG)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ts") / "tiny-ts")
    tb.export("tiny", d, st.export_blocks)
    return d


def copy_export(exported, tmp_path):
    d = str(tmp_path / "ts")
    shutil.copytree(exported, d)
    return d


def edit_plan(d, fn):
    path = os.path.join(d, "plan.json")
    with open(path) as f:
        plan = json.load(f)
    fn(plan)
    with open(path, "w") as f:
        json.dump(plan, f)


def param(plan, block, name):
    b = next(b for b in plan["blocks"] if b["name"] == block)
    return next(p for p in b["params"] if p["name"] == name)


def eager(tiny, steps=3):
    return tb.greedy(tb.eager_model("tiny", tiny), TOKENS, steps)


def test_export_small_and_weightless(exported, tiny):
    with open(os.path.join(exported, "plan.json")) as f:
        plan = json.load(f)
    assert plan["format"] == "sluice-torchscript-plan" and plan["version"] == 1
    assert [b["name"] for b in plan["blocks"]] == (
        ["model.embed_tokens"] + [f"model.layers.{i}" for i in range(4)] + ["model.norm", "lm_head"])
    with sluice.open(tiny) as m:
        names = set(m.keys())
        weights = sum(m.info(n).nbytes for n in names)
    assert {p["tensor"] for b in plan["blocks"] for p in b["params"]} == names
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(exported, "*")))
    assert size < 100_000 and size < weights / 6, (size, weights)
    for b in plan["blocks"]:
        mod = torch.jit.load(os.path.join(exported, b["file"]))
        slots = dict(mod.named_parameters())
        assert sorted(slots) == sorted(p["name"] for p in b["params"])
        assert all(t.device.type == "meta" for t in slots.values())  # no bytes saved


def test_export_leaves_the_model_alone(tmp_path, tiny):
    m = tb.eager_model("tiny", tiny)
    before = {k: (v.device.type, v.data_ptr()) for k, v in m.state_dict().items()}
    st.export_blocks(m, tb.blocks(m, CFG), str(tmp_path / "ts"))
    assert {k: (v.device.type, v.data_ptr()) for k, v in m.state_dict().items()} == before


@pytest.mark.parametrize("pool", ["256K", "8M"])
def test_scripted_equals_eager(exported, tiny, pool):
    want = eager(tiny)
    with st.ScriptedModel(exported, tiny, pool=pool) as sm:
        assert sm.resident == (pool == "8M")
        got = tb.greedy(sm, TOKENS, 3)
        s = sm.stats()
        assert sm.blocks_run == 7
    for (t, lg), (te, le) in zip(got, want):
        assert t == te and torch.equal(lg, le)
    assert got[0][1].isfinite().all()
    assert s["pool_high_water"] <= sluice.parse_size(pool)
    if pool == "256K":  # released after each block, read again at each step
        assert s["tensors_verified"] >= 4 * 39
    else:
        assert s["tensors_verified"] == 39


def test_weights_bound_zero_copy_and_released(exported, tiny):
    with st.ScriptedModel(exported, tiny, pool="8M") as sm:
        sm(torch.tensor([TOKENS]))
        for i in range(len(sm.blocks)):
            bound = sm.bound(i)
            assert bound
            for name, t in bound.items():
                assert t.data_ptr() == sm.model.get_handle(name).address
    with st.ScriptedModel(exported, tiny, pool="256K") as sm:
        sm(torch.tensor([TOKENS]))
        assert all(sm.bound(i) == {} for i in range(len(sm.blocks)))
        assert sm.model._m.live_handles == 0  # every handle released after its block
        sm._bind(2)
        for name, t in sm.bound(2).items():
            assert t.data_ptr() == sm.model.get_handle(name).address
        sm._unbind(2)


def flip_byte(src, dst, tensor):
    shutil.copytree(src, dst)
    with sluice.open(dst) as m:
        info = m.info(tensor)
    with open(info.file, "r+b") as f:
        f.seek(info.offset + info.nbytes // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))


def test_flipped_byte_fails_that_layer_only(exported, tiny, tmp_path):
    bad = str(tmp_path / "bad")
    tensor = "model.layers.1.mlp.up_proj.weight"
    flip_byte(tiny, bad, tensor)
    with st.ScriptedModel(exported, bad, pool="256K") as sm:
        with pytest.raises(sluice.ChecksumError) as ei:
            sm(torch.tensor([TOKENS]))
        assert sm.blocks_run == 2  # the embedding and layer 0; nothing from layer 1 on
        assert sm.model._m.live_handles == 0
    msg = str(ei.value)
    assert ei.value.name == tensor and tensor in msg and "model.layers.1" in msg
    assert len(re.findall(r"\b[0-9a-f]{64}\b", msg)) >= 2, msg  # expected and actual


def test_plan_missing_tensor_fails_before_running(exported, tiny, tmp_path):
    d = copy_export(exported, tmp_path)
    edit_plan(d, lambda p: param(p, "model.layers.2", "mlp.up_proj.weight").update(
        tensor="model.layers.2.mlp.up_proj.weight.missing"))
    with pytest.raises(st.PlanError) as ei:
        st.ScriptedModel(d, tiny, pool="256K")
    assert "model.layers.2.mlp.up_proj.weight.missing" in str(ei.value)
    assert "mlp.up_proj.weight" in str(ei.value)


def test_plan_shape_differs_fails_before_running(exported, tiny, tmp_path):
    d = copy_export(exported, tmp_path)
    edit_plan(d, lambda p: param(p, "model.layers.0", "self_attn.q_proj.weight").update(
        tensor="model.layers.0.mlp.gate_proj.weight"))
    with pytest.raises(st.PlanError) as ei:
        st.ScriptedModel(d, tiny, pool="256K")
    msg = str(ei.value)
    assert "model.layers.0.mlp.gate_proj.weight" in msg and "[256, 64]" in msg and "[64, 64]" in msg


def test_plan_dtype_differs_fails_before_running(exported, tmp_path):
    cli = sluice_cli()
    if not cli:
        pytest.skip("no sluice command built (it writes the F32 copy of the tiny preset)")
    f32 = str(tmp_path / "f32")
    subprocess.run([cli, "synth", "tiny", f32, "--dtype", "F32"], check=True, capture_output=True)
    with pytest.raises(st.PlanError) as ei:
        st.ScriptedModel(exported, f32, pool="1M")
    msg = str(ei.value)
    assert "F32" in msg and "BF16" in msg and "model.embed_tokens.weight" in msg


def test_plan_disagrees_with_module_or_file_changed(exported, tiny, tmp_path):
    d = copy_export(exported, tmp_path)
    edit_plan(d, lambda p: param(p, "model.norm", "weight").update(dtype="F32"))
    with pytest.raises(st.PlanError, match=r"parameter 'weight' is BF16 \[64\], the plan says F32"):
        st.ScriptedModel(d, tiny)
    d2 = copy_export(exported, tmp_path / "2")
    with open(os.path.join(d2, "block-003.pt"), "ab") as f:
        f.write(b"\0")
    with pytest.raises(st.PlanError, match="block-003.pt has SHA-256"):
        st.ScriptedModel(d2, tiny)


def engine():
    for c in sorted(glob.glob(os.path.join(REPO, "build*", "torchscript_engine"))):
        if os.access(c, os.X_OK):
            return c
    return None


def test_cpp_engine_agrees(exported, tiny):
    eng = engine()
    if not eng:
        pytest.skip("examples/torchscript_engine is not built (CMake did not find libtorch)")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    r = subprocess.run([eng, exported, tiny, "--tokens", ",".join(map(str, TOKENS)),
                        "--steps", "3", "--pool", "256K"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    got = re.findall(r"^step (\d+) token (\d+) logits_sha256 ([0-9a-f]{64})$", r.stdout, re.M)
    with st.ScriptedModel(exported, tiny, pool="256K") as sm:
        want = [(str(i), str(t), tb.digest(lg)) for i, (t, lg) in enumerate(tb.greedy(sm, TOKENS, 3))]
    assert got == want


def write_mid(d, seed=3):
    """The mid preset's weights (110 MB of pseudo-random BF16, one file
    and its manifest)."""
    rng = np.random.default_rng(seed)
    m = tb.build(tb.PRESETS["mid"], "meta")
    tensors = {k: ("BF16", list(v.shape), rng.integers(0, 65535, v.numel(), dtype=np.uint16).tobytes())
               for k, v in m.state_dict().items()}
    stfile.write_sharded(d, [tensors])
    return sum(len(t[2]) for t in tensors.values())


# glibc's mmap threshold grows with each large block freed, after which
# the compute's freed buffers stay in the heap: peak RSS would measure the
# allocator's history (1.3 GB for the zero-weight run), not live memory. A
# fixed threshold returns every large block to the system when freed.
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def peak_kb(way, export, weights, pool):
    r = subprocess.run([sys.executable, EXAMPLE, "bench-one", way, "mid", export, weights,
                        "--pool", pool, "--steps", "0"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **FIXED_MALLOC))
    assert r.returncode == 0, r.stdout + r.stderr
    return int(re.search(r"peak_rss_kb (\d+)", r.stdout).group(1))


def test_resident_memory_within_pool(tmp_path):
    """A run with a pool smaller than the model stays within the pool above
    the same blocks run with zero weights that hold no memory (libtorch's
    own size, the compute's working memory included)."""
    weights, export = str(tmp_path / "mid"), str(tmp_path / "mid-ts")
    total = write_mid(weights)
    tb.export("mid", export, st.export_blocks)
    pool = 32 << 20
    assert total > pool + (64 << 20)  # loading everything could not pass
    base = peak_kb("baseline", export, weights, "32M")
    run = peak_kb("scripted", export, weights, "32M")
    slack = 16 << 10  # KiB: allocator rounding, the plan, the sluice module
    assert run <= base + (pool >> 10) + slack, (run, base)


def test_traced_export_equals_eager(tiny, tmp_path):
    """method="trace": each block traced on the previous block's output
    (a CPU model, any weights), then run with the real ones."""
    d = str(tmp_path / "traced")
    m = tb.build(CFG, "cpu")
    ids = torch.tensor([TOKENS])
    plan = st.export_blocks(m, tb.blocks(m, CFG), d, ids, method="trace")
    assert plan["method"] == "trace" and plan["inputs"] == [{"dtype": "I64", "shape": [1, 12]}]
    want = eager(tiny, steps=0)
    with st.ScriptedModel(d, tiny, pool="256K") as sm:
        got = sm(ids)
    assert torch.equal(got, want[0][1])


@pytest.fixture(scope="module")
def tiny_values(tmp_path_factory):
    """`sluice synth tiny --values --dtype F32`: weights a model computes
    with as they are (skipped without the command: the stand-in writes
    random bits)."""
    cli = sluice_cli()
    if cli is None:
        pytest.skip("the sluice command is not built (synth --values writes these weights)")
    d = str(tmp_path_factory.mktemp("values") / "tiny")
    subprocess.run([cli, "synth", "tiny", d, "--values", "--dtype", "F32"], check=True,
                   capture_output=True)
    return d


def test_values_used_in_place(tmp_path, tiny_values):
    """With float32 values the blocks use each bound weight in place (no
    per-forward conversion) and equal eager torch bit for bit, on demand
    and resident; logits finite and not tame()d (another function)."""
    import tiny_transformer as tt
    w = torch.zeros(3, 2)
    assert tt.use(w, True) is w                         # float32: no copy
    assert tt.use(w.bfloat16(), True).dtype == torch.float32
    d = str(tmp_path / "ts")
    plan = tb.export("tiny", d, st.export_blocks, dtype="F32", values=True)
    assert {p["dtype"] for b in plan["blocks"] for p in b["params"]} == {"F32"}
    want = tb.greedy(tb.eager_model("tiny", tiny_values, "F32", True), TOKENS, 3)
    bits = tb.greedy(tb.eager_model("tiny", tiny_values, "F32", False), TOKENS, 0)
    assert not torch.equal(want[0][1], bits[0][1])
    for pool in ("256K", "8M"):
        with st.ScriptedModel(d, tiny_values, pool=pool) as sm:
            assert sm.resident == (pool == "8M")
            got = tb.greedy(sm, TOKENS, 3)
        for (t, lg), (te, le) in zip(got, want):
            assert t == te and torch.equal(lg, le)
    assert want[0][1].isfinite().all()


# ---------------------------------------------- the vocabulary in pieces (plan version 2)

TIED = tb.PRESETS["tiny-tied"]
TIED_TOKENS = tb.prompt(TIED)
EMBED = "model.embed_tokens.weight"
N_PARTS = 8


def write_tied(d, seed=5):
    """The tiny-tied preset's weights as float32 values (mean 0, spread
    0.02: computed with as they are), one file, and its version 2
    manifest with 64 KiB chunk digests and the built-in rules' part
    digests for 8 (the embedding's parts along the vocabulary). Returns
    the weights' bytes."""
    rng = np.random.default_rng(seed)
    m = tb.build(tb.config("tiny-tied", "F32", True), "meta")
    tensors = {k: ("F32", list(v.shape),
                   (rng.standard_normal(v.numel()) * 0.02).astype(np.float32).tobytes())
               for k, v in m.state_dict().items()}
    stfile.write_sharded(d, [tensors])
    sluice.write_manifest(d, chunk="64K", parts="builtin", worlds=(N_PARTS,))
    return sum(len(t[2]) for t in tensors.values())


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """(weights, whole export (version 1), pieces export (version 2), the
    weights' bytes, a pool under a quarter of them)."""
    root = tmp_path_factory.mktemp("tied")
    w, whole, pieces = str(root / "w"), str(root / "whole"), str(root / "pieces")
    total = write_tied(w)
    tb.export("tiny-tied", whole, st.export_blocks, dtype="F32", values=True)
    tb.export("tiny-tied", pieces, st.export_blocks, dtype="F32", values=True,
              vocab_parts=N_PARTS)
    pool = 512 << 10
    assert pool * 4 < total  # under a quarter of the weights
    with sluice.open(w) as m:
        assert m.info(EMBED).nbytes > pool  # the embedding alone does not fit
    return w, whole, pieces, total, pool


def test_pieces_plan_version_2(tied):
    _w, whole, pieces, _t, _p = tied
    assert sts.read_plan(whole)["version"] == 1
    plan = sts.read_plan(pieces)
    assert plan["version"] == 2
    first, last = plan["blocks"][0], plan["blocks"][-1]
    assert first["name"] == "model.embed_tokens" and first["gather"] == {"param": "weight"}
    assert last["name"] == "lm_head" and last["join_axis"] == -1
    assert last["params"] == [{"name": "weight", "tensor": EMBED, "dtype": "F32",
                               "shape": [TIED["vocab"] // N_PARTS, TIED["hidden"]],
                               "part": {"dim": 0, "n": N_PARTS}}]
    assert all("gather" not in b and "join_axis" not in b for b in plan["blocks"][1:-1])


def test_pieces_equal_whole_in_quarter_pool(tied):
    """The embedding's rows and the head's 8 vocab parts, in a pool under a
    quarter of the weights: the logits of the whole-weight blocks (every
    weight resident) and of eager torch, bit for bit, at the prompt and 3
    greedy steps; every part checked by its part digest."""
    w, whole, pieces, total, pool = tied
    with st.ScriptedModel(whole, w, pool="8M") as sm:
        assert sm.resident
        want = tb.greedy(sm, TIED_TOKENS, 3)
    eager_want = tb.greedy(tb.eager_model("tiny-tied", w, "F32", True), TIED_TOKENS, 3)
    with st.ScriptedModel(pieces, w, pool=pool) as sm:
        assert not sm.resident
        got = tb.greedy(sm, TIED_TOKENS, 3)
        s = sm.stats()
        assert sm.blocks_run == 5
        assert sm.model._m.live_handles == 0
        note = sm.model.part_note()
    for (t, lg), (tw, lw), (te, le) in zip(got, want, eager_want):
        assert t == tw == te and torch.equal(lg, lw) and torch.equal(lg, le)
    assert got[0][1].shape == (1, len(TIED_TOKENS), TIED["vocab"])
    assert s["pool_high_water"] <= pool
    assert s["part_fallback_bytes"] == 0 and note is None, note  # the parts' own digests
    # each of the 4 passes reads every weight once (the embedding as its 8
    # parts) and the rows' chunks (64 KiB each): the embedding is not also
    # read whole for the rows, as a whole-tensor read of it would be
    assert s["bytes_read"] <= 4 * (total + 2 * (64 << 10)), s["bytes_read"]


def test_whole_weights_refused_in_quarter_pool(tied):
    """The version 1 blocks bind the embedding whole: in the same pool
    their first block fails (the tensor is larger than the pool)."""
    w, whole, _pieces, _t, pool = tied
    with st.ScriptedModel(whole, w, pool=pool) as sm:
        with pytest.raises((sluice.TooLargeError, sluice.PoolExhaustedError)) as ei:
            sm(torch.tensor([TIED_TOKENS]))
        assert sm.blocks_run == 0
    assert ei.value.name == EMBED and "model.embed_tokens" in str(ei.value)


def test_pieces_resident_keeps_whole_blocks_only(tied):
    """A pool that holds the blocks bound whole and one part: they stay
    bound after the first call; the parts are bound for their run only."""
    w, _whole, pieces, _t, _p = tied
    with st.ScriptedModel(pieces, w, pool="1M") as sm:
        assert sm.resident
        first = sm(torch.tensor([TIED_TOKENS]))
        held = sm.model._m.live_handles
        assert held == sum(len(sm.blocks[i][2]) for i in range(1, len(sm.blocks) - 1))
        assert sm.bound(0) == {} and sm.bound(len(sm.blocks) - 1) == {}
        verified = sm.stats()["tensors_verified"]
        again = sm(torch.tensor([TIED_TOKENS]))
        assert torch.equal(first, again)
        # only the 8 parts again (the rows are not tensors)
        assert sm.stats()["tensors_verified"] - verified <= N_PARTS


def test_flipped_byte_in_a_vocab_part(tied, tmp_path):
    """A byte flipped in part 5 of 8 of the tied embedding (rows no prompt
    token reads): the rows verify (their chunk), the head's part 5 fails
    its part digest, naming the tensor, the block and the part; the blocks
    before the head ran."""
    w, _whole, pieces, _t, pool = tied
    bad = str(tmp_path / "bad")
    shutil.copytree(w, bad)
    row = TIED["hidden"] * 4
    rows_per_part = TIED["vocab"] // N_PARTS
    assert max(TIED_TOKENS) < rows_per_part
    with sluice.open(bad) as m:
        info = m.info(EMBED)
    with open(info.file, "r+b") as f:
        f.seek(info.offset + (5 * rows_per_part + 17) * row + 3)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    with st.ScriptedModel(pieces, bad, pool=pool) as sm:
        with pytest.raises(sluice.ChecksumError) as ei:
            sm(torch.tensor([TIED_TOKENS]))
        assert sm.blocks_run == 4  # the rows, both layers, the norm: not the head
        assert sm.model._m.live_handles == 0
    msg = str(ei.value)
    assert ei.value.name == EMBED and EMBED in msg and "'lm_head' part 5/8" in msg, msg


def test_pieces_bits_equal_eager(tiny, tmp_path):
    """The tiny preset (random bits, tame()d in every forward; an untied
    head) in pieces: the embedding's code runs on the rows it reads
    (tame() of each row), the head in 8 parts: eager torch's logits, bit
    for bit."""
    d = str(tmp_path / "pieces")
    tb.export("tiny", d, st.export_blocks, vocab_parts=N_PARTS)
    want = eager(tiny)
    with st.ScriptedModel(d, tiny, pool="256K") as sm:
        got = tb.greedy(sm, TOKENS, 3)
    for (t, lg), (te, le) in zip(got, want):
        assert t == te and torch.equal(lg, le)


def test_pieces_plan_checked(tied, tmp_path):
    """Version 2's keys in a version 1 plan, a part whose shape times n is
    not the tensor's, a "gather" block whose code has no embedding: each
    refused before anything runs, naming what."""
    w, _whole, pieces, _t, pool = tied
    d = copy_export(pieces, tmp_path / "v1")
    edit_plan(d, lambda p: p.update(version=1))
    with pytest.raises(st.PlanError, match="need plan version 2"):
        st.ScriptedModel(d, w, pool=pool)
    d = copy_export(pieces, tmp_path / "n")
    edit_plan(d, lambda p: p["blocks"][-1]["params"][0]["part"].update(n=4))
    with pytest.raises(st.PlanError, match=r"part of 4 along dim 0.*\[4096, 64\]"):
        st.ScriptedModel(d, w, pool=pool)
    d = copy_export(pieces, tmp_path / "g")

    def gather_norm(p):
        p["blocks"][-2]["gather"] = {"param": "weight"}
    edit_plan(d, gather_norm)
    with pytest.raises(st.PlanError, match="gather"):
        st.ScriptedModel(d, w, pool=pool)
    with st.ScriptedModel(pieces, w, pool=pool) as sm:
        with pytest.raises(IndexError, match=f"index {TIED['vocab']} is not a row"):
            sm(torch.tensor([[1, TIED["vocab"]]]))


def test_join_axis_other_than_the_parts_refused(tied, tmp_path):
    """A plan joining the head's parts along the tokens (axis 1), not the
    vocabulary: each part's output lacks the part's rows along that axis,
    so the call fails naming the block, where the join would give logits
    of the wrong shape and a wrong token, silently; no handle is kept."""
    w, _whole, pieces, _t, pool = tied
    d = copy_export(pieces, tmp_path / "axis")
    edit_plan(d, lambda p: p["blocks"][-1].update(join_axis=1))
    with st.ScriptedModel(d, w, pool=pool) as sm:
        with pytest.raises(st.PlanError, match=r"'lm_head': part 0's output .* join_axis 1 .*"
                                               rf"part's {TIED['vocab'] // N_PARTS} rows"):
            sm(torch.tensor([TIED_TOKENS]))
        assert sm.model._m.live_handles == 0


def test_traced_pieces_equal_eager(tiny, tmp_path):
    """method="trace" with parts: the head traced on its first part (the
    shape it runs with), the model's own weights put back; eager's logits."""
    d = str(tmp_path / "traced")
    m = tb.build(CFG, "cpu")
    ids = torch.tensor([TOKENS])
    plan = st.export_blocks(m, tb.blocks(m, CFG), d, ids, method="trace",
                            parts={"lm_head": N_PARTS}, gather_rows=True)
    assert plan["version"] == 2 and plan["blocks"][0]["gather"] == {"param": "weight"}
    assert plan["blocks"][-1]["params"][0]["shape"] == [CFG["vocab"] // N_PARTS, CFG["hidden"]]
    assert m.lm_head.weight.shape == (CFG["vocab"], CFG["hidden"])
    want = eager(tiny, steps=0)
    with st.ScriptedModel(d, tiny, pool="256K") as sm:
        got = sm(ids)
    assert torch.equal(got, want[0][1])


def test_cpp_engine_agrees_in_pieces(tied):
    """examples/torchscript_engine on the pieces export in the quarter pool:
    the same token and logits SHA-256 as ScriptedModel at every step."""
    eng = engine()
    if not eng:
        pytest.skip("examples/torchscript_engine is not built (CMake did not find libtorch)")
    w, _whole, pieces, _t, pool = tied
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    r = subprocess.run([eng, pieces, w, "--tokens", ",".join(map(str, TIED_TOKENS)),
                        "--steps", "3", "--pool", str(pool)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    got = re.findall(r"^step (\d+) token (\d+) logits_sha256 ([0-9a-f]{64})$", r.stdout, re.M)
    with st.ScriptedModel(pieces, w, pool=pool) as sm:
        want = [(str(i), str(t), tb.digest(lg))
                for i, (t, lg) in enumerate(tb.greedy(sm, TIED_TOKENS, 3))]
    assert len(got) == 4 and got == want


class PadMaskedEmbedding(torch.nn.Module):
    """An embedding that zeroes the rows of a pad token: its one 2-D
    parameter read only by rows of its input (aten::embedding), the input
    also compared with the pad id, which the positions among the distinct
    rows that a "gather" passes instead of the ids do not equal."""

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


def test_gather_only_where_ids_only_select_rows(tmp_path):
    """gather_rows marks a block only when its first input is used as
    aten::embedding's indices and otherwise only for its shape: an
    embedding that also compares the ids with a pad id (positions [0, 2, 1]
    for ids [3, 7, 5]: the third, not a pad, would be masked) is not
    marked, and runs whole, equal to eager; a plan that marks it anyway is
    refused before anything runs."""
    vocab, hidden, pad = 16, 4, 1
    w = str(tmp_path / "w")
    table = (np.arange(vocab * hidden, dtype=np.float32) + 1).reshape(vocab, hidden)
    stfile.write_sharded(w, [{"embed.weight": table}])
    m = PadMasked(vocab, hidden, pad)
    d = str(tmp_path / "x")
    plan = st.export_blocks(m, ["embed"], d, gather_rows=True)
    ids = torch.tensor([[3, 7, 5, pad]])
    m.embed.weight = torch.nn.Parameter(torch.from_numpy(table), requires_grad=False)
    want = m(ids)
    assert want[0, 2].abs().sum() > 0 and want[0, 3].abs().sum() == 0
    with st.ScriptedModel(d, w, pool="1M") as sm:
        assert torch.equal(sm(ids), want)
    assert "gather" not in plan["blocks"][0]
    edit_plan(d, lambda p: p["blocks"][0].update(gather={"param": "weight"}) or
              p.update(version=2))
    with pytest.raises(st.PlanError, match="gather"):
        st.ScriptedModel(d, w, pool="1M")


class TransposedHead(torch.nn.Module):
    """A head whose weight is [hidden, vocab] (x @ weight) with a bias
    [vocab]: in vocab parts, the weight along dim 1, the bias along dim 0."""

    def __init__(self, hidden, vocab, device="meta"):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(hidden, vocab, device=device),
                                         requires_grad=False)
        self.bias = torch.nn.Parameter(torch.empty(vocab, device=device), requires_grad=False)

    def forward(self, x):
        return torch.matmul(x, self.weight) + self.bias


def test_parts_of_one_block_along_different_dims(tmp_path):
    """A version 2 block whose parameters are parts of one n along
    different dims (a [hidden, vocab] weight along dim 1, its [vocab] bias
    along dim 0): each part is read along its own dim; eager's output."""
    hidden, vocab, n = 8, 32, 4
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((hidden, vocab)).astype(np.float32)
    bias = rng.standard_normal(vocab).astype(np.float32)
    w = str(tmp_path / "w")
    stfile.write_sharded(w, [{"head.weight": weight, "head.bias": bias}])
    d = str(tmp_path / "x")
    os.makedirs(d)
    sm = torch.jit.script(TransposedHead(hidden, vocab // n))
    sm.save(os.path.join(d, "block-000.pt"))
    with open(os.path.join(d, "block-000.pt"), "rb") as f:
        digest = __import__("hashlib").sha256(f.read()).hexdigest()
    plan = {"format": "sluice-torchscript-plan", "version": 2, "blocks": [
        {"name": "head", "file": "block-000.pt", "sha256": digest, "join_axis": -1, "params": [
            {"name": "weight", "tensor": "head.weight", "dtype": "F32",
             "shape": [hidden, vocab // n], "part": {"dim": 1, "n": n}},
            {"name": "bias", "tensor": "head.bias", "dtype": "F32",
             "shape": [vocab // n], "part": {"dim": 0, "n": n}}]}]}
    with open(os.path.join(d, "plan.json"), "w") as f:
        json.dump(plan, f)
    x = torch.from_numpy(rng.standard_normal((1, 3, hidden)).astype(np.float32))
    want = torch.matmul(x, torch.from_numpy(weight)) + torch.from_numpy(bias)
    with st.ScriptedModel(d, w, pool="1M") as m:
        got = m(x)
        assert m.model._m.live_handles == 0
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)


def test_parts_of_a_block_without_parameters_refused(tmp_path):
    """parts= naming a block with no parameter: ValueError naming it, not a
    plan that every reader refuses ("join_axis" without parts)."""
    m = torch.nn.Module()
    m.soft = Softmax()
    d = str(tmp_path / "x")
    with pytest.raises(ValueError, match="'soft' has no parameter"):
        st.export_blocks(m, ["soft"], d, parts={"soft": 2})
    assert not os.path.exists(os.path.join(d, "plan.json"))


class PaddedEmbedding(torch.nn.Module):
    def __init__(self, vocab, hidden, padding_idx):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden, padding_idx=padding_idx)

    def forward(self, ids):
        return self.embed(ids)


def test_gather_not_where_the_table_is_measured(tmp_path):
    """A scripted torch.nn.Embedding with a padding_idx (Llama's and
    Qwen2's embed_tokens with a pad token) reads the table's row count
    (F.embedding asserts padding_idx < weight.size(0)): a gathered table
    has the distinct rows' count, so a prompt of fewer distinct tokens
    than padding_idx + 1 would fail. Not marked by gather_rows, refused
    when a plan marks it; it runs whole, equal to eager, on one token
    repeated. Without a padding_idx (no dead branch left after constant
    propagation) it is marked, and equal to eager."""
    vocab, hidden = 16, 4
    w = str(tmp_path / "w")
    table = (np.arange(vocab * hidden, dtype=np.float32) + 1).reshape(vocab, hidden)
    stfile.write_sharded(w, [{"embed.weight": table}])
    ids = torch.tensor([[3, 3, 3]])
    for padding_idx, marked in ((1, False), (None, True)):
        m = PaddedEmbedding(vocab, hidden, padding_idx)
        d = str(tmp_path / f"x{padding_idx}")
        plan = st.export_blocks(m, ["embed"], d, gather_rows=True)
        assert ("gather" in plan["blocks"][0]) == marked, (padding_idx, plan["blocks"][0])
        m.embed.weight.data = torch.from_numpy(table)
        with torch.no_grad():
            want = m(ids)
        with st.ScriptedModel(d, w, pool="1M") as sm:
            assert torch.equal(sm(ids), want)
    d = str(tmp_path / "x1")
    edit_plan(d, lambda p: p["blocks"][0].update(gather={"param": "weight"}) or
              p.update(version=2))
    with pytest.raises(st.PlanError, match="gather"):
        st.ScriptedModel(d, w, pool="1M")
