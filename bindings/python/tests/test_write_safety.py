"""No caller's write reaches another reader (a zero-copy torch tensor is
writable: the write guard of sluice/__init__.py), load_state_dict keeps
optimizers out of the library's buffers, and no dtype is silently
reinterpreted (raw=True asks for the bits)."""
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")

import sluice  # noqa: E402
import sluice.torch as st  # noqa: E402
import stfile  # noqa: E402

W = np.arange(1, 25, dtype=np.float32).reshape(4, 6)
B = np.full(6, 0.5, dtype=np.float32)
F8 = bytes([95, 130, 194, 7, 0, 255])


@pytest.fixture(params=["verified", "unverified", "blake3_missing"])
def model(request, tmp_path):
    """A file with a manifest (the library's digests check the buffer
    before reuse), without one (the guard's own SHA-256 does), and with
    a manifest whose digests no hasher here computes (as without one)."""
    path = str(tmp_path / "m.safetensors")
    digests = stfile.write(path, {"w": W, "b": B})
    if request.param == "verified":
        stfile.write_manifest(path + ".manifest.json", digests)
    return path, request.param


def _open(path, kind):
    if kind == "unverified":
        return sluice.open(path, verify="off")
    m = sluice.open(path)
    if kind == "blake3_missing":
        m._guard._algorithm = "none-here"  # as a blake3 model without the blake3 module
    return m


def test_inplace_not_seen_by_get_tensor(model):
    path, kind = model
    with _open(path, kind) as m:
        t = m.get_tensor("w", framework="pt")
        t.mul_(0)
        assert (t == 0).all()
        again = m.get_tensor("w", framework="pt")  # the writer still alive
        assert np.array_equal(again.numpy(), W)
        assert np.array_equal(m.get_tensor("w"), W)
        assert (t == 0).all()  # the writer's own buffer
        del t, again
        # the writer gone: the buffer it wrote is checked before reuse
        for fw in ("np", "pt"):
            got = m.get_tensor("w", framework=fw)
            assert np.array_equal(np.asarray(got), W), fw
            del got
        for name, a in m.stream(framework="pt"):
            assert a.numpy().tobytes() == {"w": W, "b": B}[name].tobytes()
        st_ = m.stats()
        assert st_["checksum_failures"] == 0


def test_inplace_on_safe_open_and_stream(model):
    path, kind = model
    kw = {"verify": "off"} if kind == "unverified" else {}
    with sluice.safe_open(path, framework="pt", **kw) as f:
        t = f.get_tensor("w")
        t.add_(100)
        assert np.array_equal(f.get_tensor("w").numpy(), W)
        del t
        assert np.array_equal(f.get_tensor("w").numpy(), W)
    with _open(path, kind) as m:
        for name, a in m.stream(framework="pt"):
            a.zero_()
            del a
        for name, a in m.stream(framework="pt"):
            assert a.numpy().tobytes() == {"w": W, "b": B}[name].tobytes(), name
        del a
        for name, a in sluice.torch.iter_weights(m):
            a.fill_(7)
        del a
        assert np.array_equal(m.get_tensor("w"), W)


def test_reader_before_writer(model):
    """A NumPy array given first keeps its bytes: the torch tensor given
    while it lives is a private copy."""
    path, kind = model
    with _open(path, kind) as m:
        a = m.get_tensor("w")
        t = m.get_tensor("w", framework="pt")
        t.mul_(-1)
        assert np.array_equal(a, W)
        assert t.data_ptr() != a.__array_interface__["data"][0]
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a.flags.writeable = True


def test_zero_copy_when_alone(tmp_path):
    """The fast path stays: a torch tensor no one else holds is the
    library's buffer (no copy), also again after a writer that did not
    write (the check passes), and torch warns of nothing."""
    path = str(tmp_path / "m.safetensors")
    stfile.write_manifest(path + ".manifest.json", stfile.write(path, {"w": W}))
    code = (
        "import warnings, sys\n"
        "import torch, sluice, numpy as np\n"
        "warnings.simplefilter('error')\n"
        "with sluice.open(sys.argv[1]) as m:\n"
        "    h = m.get_handle('w'); addr = h.address; del h\n"
        "    t = m.get_tensor('w', framework='pt')\n"
        "    assert t.data_ptr() == addr, 'a copy'\n"
        "    del t\n"
        "    t = m.get_tensor('w', framework='pt')\n"
        "    assert t.data_ptr() == addr, 'a copy after the check'\n"
        "    t.add_(1); del t\n"
        "    t = m.get_tensor('w', framework='pt')\n"
        "    assert t.data_ptr() != addr and float(t[0, 0]) == 1.0\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert "not writable" not in r.stderr


def test_optimizer_after_load_state_dict(tmp_path):
    path = str(tmp_path / "l.safetensors")
    stfile.write_manifest(path + ".manifest.json",
                          stfile.write(path, {"weight": W, "bias": B[:4].copy()}))
    # default: zero copy, for inference: no optimizer can step it
    lin = torch.nn.Linear(6, 4, device="meta")
    st.load_state_dict(lin, path)
    assert not lin.weight.requires_grad and not lin.bias.requires_grad
    # a user who turns grad on anyway: the step stays in that parameter
    lin.weight.requires_grad_(True)
    opt = torch.optim.SGD([lin.weight], lr=1.0)
    lin(torch.ones(2, 6)).sum().backward()
    opt.step()
    assert not np.array_equal(lin.weight.detach().numpy(), W)
    # copy=True, to train: requires_grad kept, the module's own memory
    for device in ("meta", "cpu"):
        tr = torch.nn.Linear(6, 4, device=device)
        st.load_state_dict(tr, path, copy=True)
        assert tr.weight.requires_grad and tr.bias.requires_grad
        assert np.array_equal(tr.weight.detach().numpy(), W)
        opt = torch.optim.SGD(tr.parameters(), lr=1.0)
        tr(torch.ones(2, 6)).sum().backward()
        opt.step()
        assert not np.array_equal(tr.weight.detach().numpy(), W)
    # the library's next read: the file's bytes, verified
    with sluice.open(path) as m:
        assert np.array_equal(m.get_tensor("weight"), W)
        assert m.stats()["checksum_failures"] == 0
        assert m.stats()["tensors_verified"] >= 1


# ------------------------------------------------------------------ dtypes

@pytest.fixture
def f8(tmp_path):
    path = str(tmp_path / "f8.safetensors")
    digests = stfile.write(path, {
        "q": ("F8_E4M3", [2, 3], F8),
        "bf": ("BF16", [3], bytes([1, 2, 3, 4, 5, 6])),
        "x": np.ones(3, np.float32),
    })
    stfile.write_manifest(path + ".manifest.json", digests)
    return path


def _torch_has_f8():
    return hasattr(torch, "float8_e4m3fn")


def test_f8_raises_unless_raw(f8):
    if _torch_has_f8():
        pytest.skip(f"torch {torch.__version__} has float8")
    msg = r"'q'.*F8_E4M3.*raw=True"
    with sluice.open(f8) as m:
        with pytest.raises(NotImplementedError, match=msg):
            m.get_tensor("q", framework="pt")
        with pytest.raises(NotImplementedError, match=msg):
            m.stream(framework="pt")
        t = m.get_tensor("q", framework="pt", raw=True)
        assert t.dtype == torch.uint8 and tuple(t.shape) == (2, 3)
        assert bytes(t.flatten().tolist()) == F8
        assert m.get_tensor("x", framework="pt").dtype == torch.float32
    with sluice.safe_open(f8, framework="pt") as f:
        with pytest.raises(NotImplementedError, match=msg):
            f.get_tensor("q")
        with pytest.raises(NotImplementedError, match=msg):
            f.get_slice("q")[0]
    with pytest.raises(NotImplementedError, match=msg):
        sluice.load_file(f8, framework="pt")
    with pytest.raises(NotImplementedError, match=msg):
        st.load_file(f8)
    with pytest.raises(NotImplementedError, match=msg):
        st.iter_weights(f8)
    got = st.load_file(f8, raw=True)
    assert bytes(got["q"].flatten().tolist()) == F8
    with sluice.safe_open(f8, framework="pt", raw=True) as f:
        assert bytes(f.get_slice("q")[1].tolist()) == F8[3:]
    assert bytes(dict(st.iter_weights(f8, raw=True))["q"].flatten().tolist()) == F8


def test_load_state_dict_never_converts_codes(f8):
    if _torch_has_f8():
        pytest.skip(f"torch {torch.__version__} has float8")

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q = torch.nn.Parameter(torch.zeros(2, 3))
    for copy in (False, True):
        m = M()
        with pytest.raises(NotImplementedError, match=r"'q'.*F8_E4M3"):
            st.load_state_dict(m, f8, strict=False, copy=copy)
        assert (m.q == 0).all()  # nothing changed


def test_numpy_bf16_f8_without_ml_dtypes(f8, monkeypatch):
    monkeypatch.setattr(sluice, "_ml_dtypes", None)  # as where it is not installed
    with sluice.open(f8) as m:
        with pytest.raises(NotImplementedError, match=r"'bf'.*BF16.*ml_dtypes.*raw=True"):
            m.get_tensor("bf")
        with pytest.raises(NotImplementedError, match=r"'q'.*F8_E4M3"):
            m.get_tensor("q")
        with pytest.raises(NotImplementedError, match=r"BF16|F8_E4M3"):
            m.stream()
        a = m.get_tensor("bf", raw=True)
        assert a.dtype == np.uint16 and a.tobytes() == bytes([1, 2, 3, 4, 5, 6])
        assert m.get_tensor("q", raw=True).tobytes() == F8
        assert m.get_tensor("x").dtype == np.float32
    with sluice.safe_open(f8) as f:
        with pytest.raises(NotImplementedError, match=r"'bf'.*BF16"):
            f.get_tensor("bf")
        with pytest.raises(NotImplementedError, match=r"'bf'.*BF16"):
            f.get_slice("bf")[0:2]
    with pytest.raises(NotImplementedError, match=r"BF16|F8"):
        sluice.load_file(f8)
    assert sluice.load_file(f8, raw=True)["bf"].dtype == np.uint16
    # torch has bfloat16: no raw needed there
    with sluice.open(f8) as m:
        assert m.get_tensor("bf", framework="pt").dtype == torch.bfloat16


@pytest.mark.skipif(not sluice.HAVE_ML_DTYPES, reason="ml_dtypes is not installed")
def test_numpy_real_dtypes_with_ml_dtypes(f8):
    import ml_dtypes
    with sluice.open(f8) as m:
        assert m.get_tensor("bf").dtype == np.dtype(ml_dtypes.bfloat16)
        assert m.get_tensor("q").dtype == np.dtype(ml_dtypes.float8_e4m3fn)
        # raw concerns the dtypes a framework cannot represent only
        assert m.get_tensor("bf", raw=True).dtype == np.dtype(ml_dtypes.bfloat16)


def test_raw_type_checked(f8):
    with pytest.raises(TypeError):
        sluice.safe_open(f8, raw="yes")
    assert os.path.exists(f8)


def test_writer_ending_while_checked_is_not_missed(model):
    """A reader checks the buffer a writer left (the GIL released while
    it hashes); another thread's writer takes the buffer, writes and ends
    meanwhile: the reader must not take the buffer as checked (the count
    of ended writers back where it was is not "no writer meanwhile")."""
    path, kind = model
    with _open(path, kind) as m:
        g = m._guard
        t = m.get_tensor("w", framework="pt")  # a writer that does not write
        del t
        check = g._pristine
        state = {"nested": False}

        def racing(h, i):
            ok = check(h, i)
            if not state["nested"]:
                state["nested"] = True  # as another thread, while this one hashed
                w = m.get_tensor("w", framework="pt")
                w.mul_(0)
                del w
            return ok

        g._pristine = racing
        got = m.get_tensor("w", framework="pt")
        assert state["nested"]
        assert np.array_equal(got.numpy(), W)
