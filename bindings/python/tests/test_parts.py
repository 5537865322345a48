"""Tensor-parallel parts: Model.get_part, part digests, and
sluice.torch.load_shard (sluice/shard.py).

The expected values are NumPy's: np.split(whole, world, axis=dim)[rank]
of each tensor as the test wrote it, and the manifests' part digests are
hashlib's SHA-256 of those slices' bytes (np.ascontiguousarray), so
nothing here trusts the library's own layout arithmetic.
"""
import hashlib
import json
import os

import numpy as np
import pytest

import sluice
import stfile

WORLDS = (2, 4, 8)
# load_shard says once per load when a part fell back to its whole tensor
# (test_load_shard_warns_once checks it): not noise for every test here.
pytestmark = pytest.mark.filterwarnings("ignore:.*the manifest has no digest of part")


def _synth(tmp_path):
    rng = np.random.default_rng(7)
    tensors = {
        "a": rng.standard_normal((8, 16, 4)).astype(np.float32),
        "b": rng.integers(0, 1 << 15, (16, 24)).astype(np.int16),
        "c": rng.integers(0, 255, (1, 32, 8)).astype(np.uint8),
        "d": rng.standard_normal(40).astype(np.float16),
        "e": rng.integers(-99, 99, (12, 6)).astype(np.int32),
    }
    path = str(tmp_path / "model.safetensors")
    stfile.write(path, tensors)
    return path, tensors


def _manifest(path, tensors, part_dims):
    """Version 2 with part digests along part_dims[name] for the worlds
    that divide it (part_dims None: whole digests only)."""
    mpath = path + ".manifest.json"
    stfile.write_manifest_v2(mpath, [path])
    with open(mpath) as f:
        m = json.load(f)
    for name, dim in (part_dims or {}).items():
        arr = tensors[name]
        digests = {}
        for n in WORLDS:
            if arr.shape[dim] % n == 0:
                digests[str(n)] = [hashlib.sha256(np.ascontiguousarray(p).tobytes()).hexdigest()
                                   for p in np.split(arr, n, axis=dim)]
        m["tensors"][name]["parts"] = {"dim": dim, "digests": digests}
    with open(mpath, "w") as f:
        json.dump(m, f)
    return mpath


PART_DIMS = {"a": 1, "b": 1, "c": 1, "d": 0, "e": 0}


@pytest.mark.parametrize("manifest", ["none", "whole", "parts"])
def test_every_part_equals_numpy_slice(tmp_path, manifest):
    path, tensors = _synth(tmp_path)
    kw = {"verify": "off"}
    if manifest != "none":
        kw = {"manifest": _manifest(path, tensors, PART_DIMS if manifest == "parts" else None)}
    with sluice.open(path, **kw) as m:
        for name, arr in tensors.items():
            for dim in range(arr.ndim):
                for n in WORLDS:
                    if arr.shape[dim] % n:
                        with pytest.raises(sluice.InvalidArgumentError,
                                           match=f"dim {dim} of size {arr.shape[dim]} does not "
                                                 f"split into {n}"):
                            m.get_part(name, dim, 0, n)
                        continue
                    for r, want in enumerate(np.split(arr, n, axis=dim)):
                        got = m.get_part(name, dim, r, n)
                        assert got.shape == want.shape
                        assert got.dtype == want.dtype
                        assert not got.flags.writeable
                        np.testing.assert_array_equal(got, want)


def test_flip_inside_rank3_fails_rank3_only(tmp_path):
    path, tensors = _synth(tmp_path)
    mpath = _manifest(path, tensors, PART_DIMS)
    # b is int16 [16, 24]; rank 3 of 8 along dim 1 holds columns 9..11
    stfile.flip_byte(path, stfile.tensor_offset(path, "b") + (5 * 24 + 10) * 2)
    with sluice.open(path, manifest=mpath) as m:
        for r in range(8):
            if r == 3:
                with pytest.raises(sluice.ChecksumError, match="part 3 of 8 along dim 1"):
                    m.get_part("b", 1, r, 8)
            else:
                m.get_part("b", 1, r, 8)


def test_flip_outside_rank0_spares_rank0(tmp_path):
    path, tensors = _synth(tmp_path)
    mpath = _manifest(path, tensors, PART_DIMS)
    stfile.flip_byte(path, stfile.tensor_offset(path, "b") + (15 * 24 + 20) * 2)  # rank 6 of 8
    with sluice.open(path, manifest=mpath) as m:
        part = m.get_part("b", 1, 0, 8)
        np.testing.assert_array_equal(part, np.split(tensors["b"], 8, axis=1)[0])
        assert m.stats()["bytes_read"] == part.nbytes
        with pytest.raises(sluice.ChecksumError):
            m.get_tensor("b")


def test_bytes_read_per_rank_and_fallback(tmp_path):
    path, tensors = _synth(tmp_path)
    mpath = _manifest(path, tensors, PART_DIMS)
    with sluice.open(path, manifest=mpath) as m:
        for r in range(4):
            before = m.stats()["bytes_read"]
            m.get_part("a", 1, r, 4)
            assert m.stats()["bytes_read"] - before == tensors["a"].nbytes // 4
        assert m.part_note() is None
    mpath = _manifest(path, tensors, None)
    with sluice.open(path, manifest=mpath) as m:
        m.get_part("a", 1, 1, 4)
        st = m.stats()
        assert st["bytes_read"] == tensors["a"].nbytes
        assert st["part_fallback_bytes"] == tensors["a"].nbytes
        assert "part 1 of 4 of tensor \"a\" along dim 1" in m.part_note()


def test_get_part_arguments(tmp_path):
    path, _ = _synth(tmp_path)
    with sluice.open(path, verify="off") as m:
        with pytest.raises(sluice.InvalidArgumentError, match="no dim 2"):
            m.get_part("b", 2, 0, 2)
        # past a C unsigned int: not truncated to dim 1 (before: the dim-1
        # part read, then a reshape to the whole shape failed)
        with pytest.raises(sluice.InvalidArgumentError, match="no dim 4294967297"):
            m.get_part("b", 2**32 + 1, 0, 2)
        with pytest.raises(sluice.InvalidArgumentError):
            m.get_part("b", 1, 2, 2)
        with pytest.raises(TypeError):
            m.get_part("b", 1.0, 0, 2)
        with pytest.raises(ValueError):
            m.get_part("b", 1, -1, 2)
        with pytest.raises(sluice.NotFoundError):
            m.get_part("zz", 0, 0, 2)


def _llama(tmp_path):
    """A two-layer model with Llama names (F32, small)."""
    rng = np.random.default_rng(3)
    h, inter, vocab, kv = 16, 32, 64, 8
    t = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,),
         "lm_head.weight": (vocab, h)}
    for i in range(2):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                  p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.q_proj.bias": (h,),
                  p + "self_attn.o_proj.weight": (h, h), p + "self_attn.o_proj.bias": (h,),
                  p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                  p + "mlp.down_proj.weight": (h, inter), p + "input_layernorm.weight": (h,),
                  p + "post_attention_layernorm.weight": (h,)})
    tensors = {k: rng.standard_normal(s).astype(np.float32) for k, s in t.items()}
    path = str(tmp_path / "llama.safetensors")
    stfile.write(path, tensors)
    stfile.write_manifest_v2(path + ".manifest.json", [path])
    return path, tensors


def _expected_dim(name):
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight",
                      "up_proj.weight", "q_proj.bias")) or "embed_tokens" in name \
            or name == "lm_head.weight":
        return 0
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return 1
    return None


def test_load_shard_builtin_rules_numpy(tmp_path):
    from sluice.shard import load_shard, part_dims
    path, tensors = _llama(tmp_path)
    with sluice.open(path) as m:
        assert part_dims(m) == {k: _expected_dim(k) for k in tensors}
    for rank in range(4):
        sd = load_shard(path, rank, 4, framework="np")
        assert set(sd) == set(tensors)
        for k, arr in tensors.items():
            d = _expected_dim(k)
            want = arr if d is None else np.split(arr, 4, axis=d)[rank]
            np.testing.assert_array_equal(sd[k], want)


def test_parts_in_the_pool(tmp_path):
    """A part's buffer is the pool's (issue 37): held arrays hold pool
    room, a part the held room leaves no place for is PoolExhaustedError,
    and room comes back when the array goes."""
    path, tensors = _synth(tmp_path)
    _manifest(path, tensors, PART_DIMS)
    with sluice.open(path, pool=2048) as m:
        p0 = m.get_part("a", 0, 0, 2)          # 1,024 bytes
        assert m.stats()["pool_in_use"] == 1024
        p1 = m.get_part("a", 0, 1, 2)
        with pytest.raises(sluice.PoolExhaustedError):
            m.get_part("a", 1, 0, 2)
        np.testing.assert_array_equal(p1, np.split(tensors["a"], 2, axis=0)[1])
        del p0
        np.testing.assert_array_equal(m.get_part("a", 1, 0, 2),
                                      np.split(tensors["a"], 2, axis=1)[0])
        del p1


def test_load_shard_pool_holds_the_shard(tmp_path, monkeypatch):
    """load_shard holds every value at once, in the pool: it opens with a
    pool that holds the rank's shard (its parts and the replicated
    tensors), unless pool= is given; a pool= too small is refused."""
    from sluice import _safe_open, shard
    path, tensors = _llama(tmp_path)
    with sluice.open(path) as m:
        need = shard._shard_bytes(m, None, 4)
        default = m.stats()["pool_bytes"]
    assert need < sum(a.nbytes for a in tensors.values())   # the parts only
    asked = []
    real_reopen = _safe_open._reopen

    def reopen(p, **kw):
        asked.append(kw.get("pool"))
        return real_reopen(p, **kw)
    monkeypatch.setattr(_safe_open, "_reopen", reopen)
    monkeypatch.setattr(_safe_open, "_SLACK", default - need + 1)   # one byte over
    sd = shard.load_shard(path, 1, 4, framework="np")
    assert asked == [default + 1]
    for k, arr in tensors.items():
        d = _expected_dim(k)
        np.testing.assert_array_equal(sd[k], arr if d is None else np.split(arr, 4, axis=d)[1])
    del sd
    with pytest.raises(sluice.PoolExhaustedError):
        shard.load_shard(path, 1, 4, framework="np", pool=need // 2)


def test_load_shard_rules_overridden(tmp_path):
    from sluice.shard import load_shard
    path, tensors = _llama(tmp_path)
    rules = [("*.o_proj.weight", None), ("*.down_proj.weight", 0), ("*", None)]
    sd = load_shard(path, 1, 2, rules=rules, framework="np")
    o = "model.layers.0.self_attn.o_proj.weight"
    down = "model.layers.1.mlp.down_proj.weight"
    np.testing.assert_array_equal(sd[o], tensors[o])
    np.testing.assert_array_equal(sd[down], np.split(tensors[down], 2, axis=0)[1])
    rfile = tmp_path / "rules.txt"
    rfile.write_text("# mine\n*q_proj.weight 1\n")
    sd = load_shard(path, 0, 2, rules=str(rfile), framework="np")
    q = "model.layers.0.self_attn.q_proj.weight"
    np.testing.assert_array_equal(sd[q], np.split(tensors[q], 2, axis=1)[0])
    with pytest.raises(ValueError, match="rules line 1: the dim is not a number"):
        load_shard(path, 0, 2, rules="*.w x\n")
    with pytest.raises(ValueError, match="has 1"):
        load_shard(path, 0, 2, rules="*norm* 1\n")
    with pytest.raises(sluice.InvalidArgumentError, match="does not split into 3"):
        load_shard(path, 0, 3, framework="np")


def test_load_shard_torch_zero_copy(tmp_path):
    torch = pytest.importorskip("torch")
    import sluice.torch as st
    path, tensors = _llama(tmp_path)
    sd = st.load_shard(path, 1, 2)
    for k, arr in tensors.items():
        d = _expected_dim(k)
        want = arr if d is None else np.split(arr, 2, axis=d)[1]
        assert isinstance(sd[k], torch.Tensor)
        assert torch.equal(sd[k], torch.from_numpy(np.ascontiguousarray(want)))
        assert sd[k].is_contiguous()


def test_load_shard_raw(tmp_path, monkeypatch):
    """BF16 and F8 in NumPy without ml_dtypes: load_shard raises naming the
    tensor and dtype before reading anything, unless raw=True (their bits),
    as get_tensor and get_part do (issue 38, item 4)."""
    from sluice.shard import load_shard
    import sluice as s
    monkeypatch.setattr(s, "_ml_dtypes", None)  # as on Debian, whatever is installed here
    bf = np.arange(8 * 6, dtype=np.uint16).reshape(8, 6)
    f8 = np.arange(4 * 10, dtype=np.uint8).reshape(4, 10)
    path = str(tmp_path / "m.safetensors")
    stfile.write(path, {"a.weight": ("BF16", [8, 6], bf.tobytes()),
                        "b.q_proj.weight": ("F8_E4M3", [4, 10], f8.tobytes()),
                        "c": np.ones(3, dtype=np.float32)})
    rules = "a.weight 1\n*q_proj.weight 0\n* replicated\n"
    with pytest.raises(NotImplementedError, match="'a.weight' is BF16"):
        load_shard(path, 0, 2, rules=rules, framework="np", verify="off")
    f8_only = str(tmp_path / "f8.safetensors")
    stfile.write(f8_only, {"c": np.ones(3, dtype=np.float32),
                           "b.q_proj.weight": ("F8_E4M3", [4, 10], f8.tobytes())})
    with pytest.raises(NotImplementedError, match="'b.q_proj.weight' is F8_E4M3"):
        load_shard(f8_only, 0, 2, rules=rules, framework="np", verify="off")
    sd = load_shard(path, 1, 2, rules=rules, framework="np", raw=True, verify="off")
    assert sd["a.weight"].dtype == np.uint16
    np.testing.assert_array_equal(sd["a.weight"], np.split(bf, 2, axis=1)[1])
    assert sd["b.q_proj.weight"].dtype == np.uint8
    np.testing.assert_array_equal(sd["b.q_proj.weight"], np.split(f8, 2, axis=0)[1])
    np.testing.assert_array_equal(sd["c"], np.ones(3, dtype=np.float32))
    with pytest.raises(TypeError, match="raw must be a bool"):
        load_shard(path, 0, 2, rules=rules, framework="np", raw=1, verify="off")


def test_load_shard_warns_once(tmp_path, recwarn):
    from sluice.shard import load_shard
    path, _ = _llama(tmp_path)
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        load_shard(path, 0, 2, framework="np")
    notes = [x for x in w if "no digest of part" in str(x.message)]
    assert len(notes) == 1


@pytest.mark.parametrize("manifest", ["none", "whole", "parts"])
def test_get_slice_of_a_part_reads_the_part(tmp_path, manifest):
    """safe_open's get_slice(name)[:, a:b] (and [:, :, k]) that is one equal
    part of a later dimension goes through get_part: no manifest, only the
    part's bytes; part digests, only the part's bytes, verified; a whole
    digest, the whole tensor once (counted as part_fallback_bytes)."""
    path, tensors = _synth(tmp_path)
    kw = {"verify": "off"}
    if manifest != "none":
        kw = {"manifest": _manifest(path, tensors, PART_DIMS if manifest == "parts" else None)}
    a = tensors["a"]  # (8, 16, 4) float32, part digests along dim 1
    with sluice.safe_open(path, framework="np", **kw) as f:
        s = f.get_slice("a")
        st0 = f.model.stats()
        got = s[:, 4:8]  # rank 1 of 4 along dim 1
        st1 = f.model.stats()
        np.testing.assert_array_equal(got, a[:, 4:8])
        assert got.flags.writeable and got.flags.c_contiguous
        read = st1["bytes_read"] - st0["bytes_read"]
        fallback = st1["part_fallback_bytes"] - st0["part_fallback_bytes"]
        if manifest == "whole":
            assert read == a.nbytes and fallback == a.nbytes
        else:
            assert read == a.nbytes // 4 and fallback == 0
        np.testing.assert_array_equal(s[:, 12:16, :], a[:, 12:16, :])
        np.testing.assert_array_equal(s[:, :, 3], a[:, :, 3])  # an int: a part of 4, dim dropped
        np.testing.assert_array_equal(s[:, 3:9], a[:, 3:9])  # not a part: rows, then cut
