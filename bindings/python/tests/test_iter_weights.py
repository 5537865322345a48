"""sluice.torch.iter_weights: (name, torch.Tensor) in completion order, zero
copy where the pool allows, every tensor valid for as long as it is held.
Skipped when torch is absent."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")

import sluice  # noqa: E402
import stfile  # noqa: E402
from conftest import real_models  # noqa: E402
from sluice.torch import iter_weights  # noqa: E402


def raw_bytes(t):
    """The tensor's bytes (standard strides first)."""
    if t.numel() == 0:
        return b""
    fresh = torch.empty(t.shape, dtype=t.dtype).copy_(t).reshape(-1)
    return fresh.view(torch.uint8).numpy().tobytes()


@pytest.fixture
def model(tmp_path):
    """Two shards and a manifest: 24 tensors of 16 KiB (384 KiB), BF16, a
    scalar, an empty tensor (27 in all)."""
    rng = np.random.default_rng(6)
    s1 = {f"layers.{i}.w": rng.standard_normal((64, 64)).astype(np.float32) for i in range(12)}
    s1["scalar"] = np.array(1.5, dtype=np.float32)
    s2 = {f"layers.{i}.w": rng.standard_normal((64, 64)).astype(np.float32)
          for i in range(12, 24)}
    s2["bf16"] = ("BF16", [4, 8], rng.integers(0, 65535, 32, dtype=np.uint16).tobytes())
    s2["empty"] = np.zeros((0, 5), dtype=np.float32)
    d = str(tmp_path / "m")
    stfile.write_sharded(d, [s1, s2])
    return d, stfile.read_model(d)


def check_all(pairs, want, names=None):
    names = sorted(want) if names is None else names
    assert sorted(n for n, _ in pairs) == sorted(names)
    for name, t in pairs:
        dtype, shape, raw = want[name]
        assert isinstance(t, torch.Tensor), name
        assert tuple(t.shape) == tuple(shape), name
        assert raw_bytes(t) == raw, name


def test_every_tensor_verified_zero_copy(model):
    d, want = model
    with sluice.open(d) as m:
        assert m.verify_mode == "require"
        pairs = []
        for name, t in iter_weights(m):
            # zero copy: the tensor IS the library's buffer (a second
            # handle on the same cached tensor has the same address)
            if t.numel():
                assert t.data_ptr() == m.get_handle(name).address, name
            pairs.append((name, t))
        check_all(pairs, want)
        st = m.stats()
        assert st["tensors_verified"] == len(want) - 1  # the empty one has nothing to hash
        assert dict(pairs)["bf16"].dtype == torch.bfloat16
        assert dict(pairs)["scalar"].shape == () and dict(pairs)["scalar"].item() == 1.5
        assert not m.closed  # a Model given is left open
    assert m.closed


def test_names_and_open_args(model):
    d, want = model
    names = ["layers.3.w", "bf16", "layers.3.w", "layers.20.w"]
    pairs = list(iter_weights(d, names=names, pool="1M", verify="require"))
    check_all(pairs, want, names)
    with pytest.raises(sluice.NotFoundError):
        iter_weights(d, names=["layers.3.w", "nope"])  # before anything is read
    with pytest.raises(TypeError):
        iter_weights(d, names="layers.3.w")
    with pytest.raises(TypeError):
        iter_weights(d, no_such_option=True)
    with sluice.open(d) as m, pytest.raises(TypeError):
        iter_weights(m, pool="1M")


def test_kept_tensors_outlive_everything_with_a_small_pool(model):
    """Every tensor kept, with a 64 KiB pool (a sixth of the model): those
    the pool has no room for are read into their own memory (read_into),
    so none fails; all stay right after the generator and the model are
    gone. Without that fallback the stream fails them with
    PoolExhaustedError (as Model.stream does: checked here too)."""
    d, want = model
    with sluice.open(d, pool="64K") as m:
        with pytest.raises(sluice.PoolExhaustedError):
            kept = [t for _, t in m.stream(framework="pt")]
    with sluice.open(d, pool="64K") as m:
        gen = iter_weights(m)
        pairs = list(gen)
        del gen
        st = m.stats()
    del m
    import gc
    gc.collect()
    check_all(pairs, want)
    # some came through the pool (zero copy), the rest by read_into
    assert 0 < st["tensors_loaded"] < len(want)
    assert st["bytes_read"] >= sum(len(v[2]) for v in want.values())


def test_dropped_tensors_with_a_tight_pool(model):
    """A caller that drops each tensor (as load_weights does, copying it
    into a parameter), with a pool of 48 KiB (three tensors): the stream's
    read-ahead and the binding's queue of two leave some tensor no room
    (Model.stream fails them with PoolExhaustedError); iter_weights reads
    those into their own memory. Every one right; the pool's high water
    within the pool, and no handle left."""
    d, want = model
    with sluice.open(d, pool="48K") as m:
        seen = {}
        for name, t in iter_weights(m):
            seen[name] = raw_bytes(t)
            del t
        assert m.stats()["pool_high_water"] <= 48 << 10
        assert m._m.live_handles == 0
    assert seen == {k: v[2] for k, v in want.items()}


def test_checksum_raises_at_once_and_stops(model):
    d, want = model
    shard = os.path.join(d, "model-00002-of-00002.safetensors")
    stfile.flip_byte(shard, stfile.tensor_offset(shard, "layers.13.w") + 5)
    with sluice.open(d) as m:
        got = []
        with pytest.raises(sluice.ChecksumError) as e:
            for name, t in iter_weights(m):
                got.append(name)
        del t
        assert e.value.name == "layers.13.w"
        assert "layers.13.w" not in got
        assert m._m.live_handles == 0  # the stream stopped and gave everything back
    assert m.closed
    with pytest.raises(sluice.ChecksumError):
        list(iter_weights(d))
    assert len(list(iter_weights(d, verify="off"))) == len(want)  # open_args reach open


def test_checksum_in_own_memory_names_the_tensor(model):
    """A damaged tensor the pool has no room for (every earlier one kept,
    a 64 KiB pool) is read into memory of its own by read_into, which
    raises the ChecksumError: it names the tensor (e.name), as a failure
    the stream delivers does."""
    d, _want = model
    shard = os.path.join(d, "model-00002-of-00002.safetensors")
    stfile.flip_byte(shard, stfile.tensor_offset(shard, "layers.23.w") + 5)
    kept = []
    with pytest.raises(sluice.ChecksumError) as e:
        for name, t in iter_weights(d, pool="64K"):
            kept.append(t)
    assert e.value.name == "layers.23.w"
    assert len(kept) > 4  # past the pool's room: the own-memory path failed it


def test_model_closed_during_the_loop(model):
    """A Model given, closed by the caller while the loop goes on (close()
    is honoured for new calls; the stream runs to its end): every tensor
    still comes, those the pool has no room for too (read into their own
    memory through the stream, which keeps the model open); the model
    closes in the library once the loop and the tensors are gone."""
    d, want = model
    m = sluice.open(d, pool="64K")
    g = iter_weights(m)
    pairs = [next(g)]
    m.close()
    pairs += list(g)
    check_all(pairs, want)
    assert m.closed
    del pairs, g
    import gc
    gc.collect()
    assert not m._m.open_in_library


def test_break_stops_the_stream(model):
    d, _want = model
    with sluice.open(d) as m:
        for name, t in iter_weights(m):
            if t.numel():  # an empty tensor holds no handle
                first = t
                break
        import gc
        gc.collect()
        assert m._m.live_handles == 1  # `first` only: the stream stopped
        del t, first
        assert m._m.live_handles == 0
    assert m.closed
    g = iter_weights(d)  # never started: reads nothing, leaks nothing
    del g


def test_torch_load_file(model):
    """sluice.torch.load_file: safetensors.torch.load_file's drop-in (torch
    tensors, not sluice.load_file's default NumPy arrays)."""
    d, want = model
    got = sluice.torch.load_file(d)
    assert sorted(got) == sorted(want)
    for name, t in got.items():
        assert isinstance(t, torch.Tensor), name
        assert tuple(t.shape) == tuple(want[name][1]) and raw_bytes(t) == want[name][2], name
    assert got["bf16"].dtype == torch.bfloat16
    assert isinstance(sluice.torch.load_file(d, device="cpu", verify="off")["scalar"], torch.Tensor)


def test_dtype_torch_lacks(tmp_path):
    if hasattr(torch, "uint16"):
        pytest.skip(f"torch {torch.__version__} has uint16")
    p = str(tmp_path / "u.safetensors")
    stfile.write(p, {"a": np.arange(4, dtype=np.float32), "u": np.arange(3, dtype=np.uint16)})
    with pytest.raises(NotImplementedError, match="'u'.*U16"):
        iter_weights(p)  # before reading anything
    assert [n for n, _ in iter_weights(p, names=["a"])] == ["a"]


def test_engine_style_load_weights(model):
    """The engines' loop: each weight copied into a parameter by name."""
    d, want = model
    params = {k: torch.empty(tuple(v[1]), dtype=torch.float32)
              for k, v in want.items() if v[0] == "F32"}

    def load_weights(weights):
        for name, w in weights:
            if name in params:
                params[name].copy_(w)
    load_weights(iter_weights(d, pool="48K"))
    for k, p in params.items():
        assert raw_bytes(p) == want[k][2]


@pytest.mark.parametrize("path", real_models() or ["absent"],
                         ids=lambda p: os.path.basename(p))
def test_real_files(path, real_dir):
    want = stfile.read_model(path)
    lacking = [k for k, v in want.items()
               if v[0] in ("U16", "U32", "U64") and not hasattr(torch, "uint16")]
    names = [k for k in want if k not in lacking]
    if lacking:
        with pytest.raises(NotImplementedError):
            iter_weights(path)
    pairs = list(iter_weights(path, names=names, raw=True))
    for name, t in pairs:
        dtype, _shape, raw = want[name]
        if dtype in sluice._PACKED:
            assert t.dtype == torch.uint8
        assert raw_bytes(t) == raw, name
    assert sorted(n for n, _ in pairs) == sorted(names)


def test_fresh_interpreter(model):
    """The kept-tensor and early-stop paths in a fresh interpreter with
    -X dev (warnings as errors would show a leaked stream or model)."""
    d, _want = model
    script = textwrap.dedent("""
        import gc, sys, warnings
        warnings.simplefilter("error")
        from sluice.torch import iter_weights
        kept = list(iter_weights(sys.argv[1], pool="64K"))
        for name, t in iter_weights(sys.argv[1]):
            break
        del t
        gc.collect()
        print("ok", len(kept))
    """)
    r = subprocess.run([sys.executable, "-X", "dev", "-c", script, d], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok 27" and "Warning" not in r.stderr
