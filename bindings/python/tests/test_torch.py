"""sluice.torch: lazy_load equals eager loading, stays within its budget;
load_state_dict. Skipped when torch is absent."""
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")

import sluice  # noqa: E402
import sluice.torch as st  # noqa: E402
import stfile  # noqa: E402
from conftest import REPO, sluice_cli  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "examples", "python"))
import tiny_transformer as tt  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """`sluice synth tiny` when the command is built; else the same layout
    written here (pseudo-random BF16, with a manifest)."""
    d = str(tmp_path_factory.mktemp("tiny") / "tiny")
    cli = sluice_cli()
    if cli:
        subprocess.run([cli, "synth", "tiny", d], check=True, capture_output=True)
        return d
    cfg, rng = tt.TINY, np.random.default_rng(1)
    m = tt.TinyLlama(cfg, "meta")
    tensors = {k: ("BF16", list(v.shape), rng.integers(0, 65535, v.numel(), dtype=np.uint16).tobytes())
               for k, v in m.state_dict().items()}
    keys = sorted(tensors)
    half = len(keys) // 2
    stfile.write_sharded(d, [{k: tensors[k] for k in keys[:half]},
                             {k: tensors[k] for k in keys[half:]}], metadata={"format": "pt"})
    return d


def test_example_lazy_equals_eager(tiny):
    eager, lazy, loaded, stats, loader = tt.run(tiny, budget="256K")
    assert torch.equal(eager, lazy) and torch.equal(eager, loaded)
    assert eager.isfinite().all()
    assert not loader.resident
    assert stats["pool_high_water"] <= 256 << 10
    assert stats["tensors_loaded"] >= 2 * 39  # released after each layer: read again


def test_lazy_resident_when_it_fits(tiny):
    ids = torch.arange(8).view(1, 8)
    with torch.no_grad():
        m = tt.TinyLlama(tt.TINY, "meta")
        loader = st.lazy_load(m, tiny, budget="8M")
        assert loader.resident
        a = m(ids)
        s1 = loader.stats()
        b = m(ids)
        s2 = loader.stats()
        assert torch.equal(a, b)
        assert s1["tensors_loaded"] == 39
        assert s2["acquire_count"] == s1["acquire_count"]  # kept: no acquire at all
        assert s2["bytes_read"] == s1["bytes_read"]
        loader.detach()
        assert m.lm_head.weight.device.type == "meta"


def test_example_script(tiny):
    r = subprocess.run([sys.executable, os.path.join(REPO, "examples", "python", "tiny_transformer.py"),
                        tiny], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "equal to eager: True" in r.stdout


def test_load_state_dict(tiny):
    m = tt.TinyLlama(tt.TINY, "meta")
    res = st.load_state_dict(m, tiny)
    assert res.missing_keys == [] and res.unexpected_keys == []
    w = m.lm_head.weight
    with sluice.open(tiny) as model:
        ref = model.get_tensor("lm_head.weight", framework="pt")
        assert torch.equal(w.view(torch.int16), ref.view(torch.int16))
    # zero copy: the parameter's storage is a sluice handle's buffer
    with sluice.open(tiny) as model:
        pass
    assert w.dtype == torch.bfloat16 and w.device.type == "cpu"
    # CPU float32 module: converted by copy into the existing parameters
    cpu = tt.TinyLlama(tt.TINY, "cpu").float()
    before = cpu.lm_head.weight.data_ptr()
    st.load_state_dict(cpu, tiny)
    assert cpu.lm_head.weight.data_ptr() == before
    # (random bit patterns: NaNs; compare the bits)
    assert torch.equal(cpu.lm_head.weight.view(torch.int32), w.float().view(torch.int32))
    # strict: a key the file lacks
    extra = tt.TinyLlama(tt.TINY, "meta")
    extra.extra = torch.nn.Parameter(torch.empty(3, device="meta"))
    with pytest.raises(RuntimeError, match="missing keys"):
        st.load_state_dict(extra, tiny)
    res = st.load_state_dict(extra, tiny, strict=False)
    assert res.missing_keys == ["extra"]
    with pytest.raises(TypeError):
        st.load_state_dict("not a module", tiny)
    with pytest.raises(TypeError):
        st.lazy_load(5, tiny)


def test_zero_copy(tmp_path, monkeypatch):
    path = str(tmp_path / "l.safetensors")
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    stfile.write(path, {"weight": w, "bias": np.ones(3, np.float32)})
    with sluice.open(path) as model:
        t = model.get_tensor("weight", framework="pt")
        assert t.data_ptr() == model.get_handle("weight").address
        assert t.shape == (3, 4) and torch.equal(t, torch.from_numpy(w))
        del t
    # load_state_dict: the parameters are the buffers get_tensor gave
    given = []
    real = sluice.Model.get_tensor

    def spy(self, name, framework="np"):
        t = real(self, name, framework)
        given.append(t.data_ptr())
        return t
    monkeypatch.setattr(sluice.Model, "get_tensor", spy)
    lin = torch.nn.Linear(4, 3, device="meta")
    st.load_state_dict(lin, path)
    assert lin.weight.device.type == "cpu" and torch.equal(lin.weight, torch.from_numpy(w))
    assert lin.weight.data_ptr() in given and lin.bias.data_ptr() in given
    cpu = torch.nn.Linear(4, 3)  # same dtype on the CPU: zero copy too
    st.load_state_dict(cpu, path)
    assert cpu.weight.data_ptr() in given
    cp = torch.nn.Linear(4, 3)
    st.load_state_dict(cp, path, copy=True)
    assert cp.weight.data_ptr() not in given and torch.equal(cp.weight, lin.weight)


RSS_SCRIPT = textwrap.dedent("""
    import sys, torch, numpy as np
    import sluice.torch as st
    path, budget = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    def rss(field):
        for line in open('/proc/self/status'):
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    layers, n_in, n_out = 16, 1024, 2048
    x = torch.randn(4, n_in)
    # warm torch up (allocator, BLAS buffers) on real weights of one layer
    warm = torch.nn.Linear(n_in, n_out, bias=False)
    with torch.no_grad():
        warm(x); warm(x)
    del warm
    seq = torch.nn.Sequential(*[torch.nn.Linear(n_in, n_out, bias=False, device='meta')
                                for _ in range(layers)])
    class Each(torch.nn.Module):  # every layer sees the same input
        def __init__(self, seq): super().__init__(); self.seq = seq
        def forward(self, x): return sum(l(x) for l in self.seq)
    model = Each(seq)
    loader = st.lazy_load(model, path, budget=budget)
    base = rss('VmRSS:')
    open('/proc/self/clear_refs', 'w').write('5')  # reset the peak (VmHWM)
    with torch.no_grad():
        for _ in range(2):
            y = model(x)
    peak = rss('VmHWM:')
    print(loader.total_bytes, base, peak, peak - base, loader.stats()['pool_high_water'])
""")


def test_lazy_rss_within_budget(tmp_path):
    layers, n_in, n_out = 16, 1024, 2048
    rng = np.random.default_rng(0)
    layer = (rng.standard_normal((n_out, n_in)) * 0.01).astype(np.float32)  # 8 MiB
    path = str(tmp_path / "big.safetensors")
    stfile.write(path, {f"seq.{i}.weight": layer + i for i in range(layers)})
    total = layers * layer.nbytes
    budget = total // 4  # the model is 4x the budget
    r = subprocess.run([sys.executable, "-c", RSS_SCRIPT, path, str(budget)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    tot, base, peak, grew, high = map(int, r.stdout.split())
    assert tot == total
    assert high <= budget
    assert grew <= budget * 1.15, f"RSS grew {grew >> 20} MiB over a {budget >> 20} MiB budget"
