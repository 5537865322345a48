"""safe_open(...).get_slice(name)[index] against NumPy (and torch) indexing
of the whole tensor: many index forms, every dtype family, three ways of
verifying, the real corpus; what is read; the errors."""
import os

import numpy as np
import pytest

import sluice
import stfile
from conftest import real_models
from sluice import safe_open
from sluice._safe_open import Slice, normalize_index

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (python3-torch)")

CHUNK = 4096  # the smallest chunk the library accepts


def synth_tensors():
    rng = np.random.default_rng(27)
    return {
        "f32_3d": rng.standard_normal((13, 7, 5)).astype(np.float32),
        "big_4d": rng.standard_normal((40, 3, 4, 9)).astype(np.float32),  # 17280 B: 5 chunks
        "i64_1d": np.arange(-5, 6, dtype=np.int64),
        "f16_2d": rng.standard_normal((9, 6)).astype(np.float16),
        "u8_2d": rng.integers(0, 255, size=(5, 300), dtype=np.uint8),
        "bool_2d": rng.integers(0, 2, size=(6, 4)).astype(np.bool_),
        "i16_col": rng.integers(-999, 999, size=(7, 1), dtype=np.int16),
        "i32_zero_mid": np.zeros((3, 0, 2), dtype=np.int32),
        "f32_empty": np.zeros((0, 3), dtype=np.float32),
        "f32_scalar": np.array(2.5, dtype=np.float32),
        "bf16_2d": ("BF16", [8, 6], rng.integers(0, 65535, 48, dtype=np.uint16).tobytes()),
        "f8_3d": ("F8_E4M3", [4, 3, 2], rng.integers(0, 255, 24, dtype=np.uint8).tobytes()),
        "f4_packed": ("F4", [4, 2], bytes([0x12, 0x34, 0x56, 0x78])),
    }


def expected(t):
    """The whole tensor as sluice gives it (raw views for BF16/F8)."""
    if isinstance(t, tuple):
        return stfile.expected_array(t[0], tuple(t[1]), t[2])
    return t


FIXED = [
    Ellipsis, (), 0, -1, 1, slice(None), slice(None, None, -1), slice(2, None),
    slice(None, -2), slice(-3, -1), slice(-100, 100), slice(100, None), slice(1, 1),
    slice(None, None, 2), slice(1, None, 3), slice(-1, None, -2), slice(None, 0, -1),
    slice(3, 0, -2), (Ellipsis, 0), (Ellipsis, -1), (0, Ellipsis), (slice(None), 1),
    (slice(1, 3), Ellipsis, slice(None, None, -1)), (-1, -1), (0, slice(None), -1),
    (Ellipsis, slice(1, None, 2)), (np.int64(1),), np.int32(-2), (slice(None, None, 5), 0),
]


def random_indices(shape, rng, count):
    """count random basic indices for a tensor of shape (valid ones:
    ints in bounds, any slice, at most one ellipsis)."""
    out = []
    ndim = len(shape)
    for _ in range(count):
        k = int(rng.integers(0, ndim + 1))
        parts = []
        for d in range(k):
            n = shape[d]
            if n > 0 and rng.random() < 0.3:
                parts.append(int(rng.integers(-n, n)))
            else:
                def bound():
                    return None if rng.random() < 0.3 else int(rng.integers(-n - 2, n + 3))
                step = [None, 1, 2, 3, -1, -2, -3][int(rng.integers(0, 7))]
                parts.append(slice(bound(), bound(), step))
        if rng.random() < 0.3:
            parts.insert(int(rng.integers(0, len(parts) + 1)), Ellipsis)
        # a trailing ellipsis leaves the leading parts where they are
        out.append(parts[0] if len(parts) == 1 and rng.random() < 0.5 else tuple(parts))
    return out


def valid(idx, arr):
    try:
        arr[idx]
    except IndexError:
        return False
    return True


def indices_for(shape, seed):
    rng = np.random.default_rng(seed)
    probe = np.empty(shape, dtype=np.uint8)
    return [i for i in FIXED + random_indices(shape, rng, 60) if valid(i, probe)]


@pytest.fixture(scope="module", params=["none", "whole", "chunked"])
def synth(request, tmp_path_factory):
    """The synth file, unverified, with a whole-tensor manifest, or with a
    version 2 manifest with chunk digests (tensors over one chunk)."""
    d = tmp_path_factory.mktemp("slices")
    path = str(d / "model.safetensors")
    tensors = synth_tensors()
    digests = stfile.write(path, tensors, metadata={"format": "pt"})
    if request.param == "whole":
        stfile.write_manifest(path + ".manifest.json", digests)
    elif request.param == "chunked":
        stfile.write_manifest_v2(path + ".manifest.json", [path], chunk_bytes=CHUNK)
    return request.param, path, tensors


def as_bytes(t):
    if torch is not None and isinstance(t, torch.Tensor):
        if t.numel() == 0:
            return b""
        if t.dim() == 0:
            t = t.reshape(1)
        fresh = torch.empty(t.shape, dtype=t.dtype).copy_(t)  # standard strides, offset 0
        return fresh.view(torch.uint8).numpy().tobytes()
    return np.ascontiguousarray(t).tobytes()


def slice_cases(f, tensors, mode):
    """(name, the whole tensor, its Slice, an index, a label) for every
    tensor but the packed one and many index forms of each."""
    for seed, (name, t) in enumerate(tensors.items()):
        if name == "f4_packed":
            continue
        full = expected(t)
        s = f.get_slice(name)
        for idx in indices_for(full.shape, seed):
            yield name, full, s, idx, f"{name}[{idx!r}] ({mode})"


def test_numpy_indexing_every_form(synth):
    mode, path, tensors = synth
    n = 0
    with safe_open(path, framework="np", raw=True) as f:
        for name, full, s, idx, where in slice_cases(f, tensors, mode):
            assert s.get_shape() == list(full.shape)
            assert s.verified is (mode != "none")
            assert s.chunked is (mode == "chunked" and full.nbytes > CHUNK)
            want = full[idx]
            got = s[idx]
            assert isinstance(got, np.ndarray), where
            assert got.shape == np.shape(want), where
            assert got.dtype == full.dtype, where
            assert got.tobytes() == np.ascontiguousarray(want).tobytes(), where
            assert got.flags.writeable and got.flags.c_contiguous, where  # a copy
            n += 1
    assert n > 500


@needs_torch
def test_torch_indexing_every_form(synth):
    """framework="pt": the reference applies torch's own indexing to the
    whole tensor; the same result here (a negative step, which torch
    refuses, gives NumPy's)."""
    mode, path, tensors = synth
    native = {np.dtype(x) for x in (np.float32, np.float16, np.int64, np.int32, np.int16,
                                     np.uint8, np.bool_)}
    with safe_open(path, framework="pt", raw=True) as f:
        for name, full, s, idx, where in slice_cases(f, tensors, mode):
            got = s[idx]
            want = full[idx]
            assert isinstance(got, torch.Tensor), where
            assert got.dtype == f.get_tensor(name).dtype, where
            assert tuple(got.shape) == np.shape(want), where
            assert as_bytes(got) == np.ascontiguousarray(want).tobytes(), where
            key = idx if isinstance(idx, tuple) else (idx,)
            negative = any(isinstance(k, slice) and (k.step or 1) < 0 for k in key)
            if full.dtype in native and not negative:
                ref = torch.from_numpy(full.copy())[idx]
                assert tuple(got.shape) == tuple(ref.shape), where
                assert as_bytes(got) == as_bytes(ref), where


@needs_torch
def test_torch_bf16_and_f8(synth):
    _mode, path, tensors = synth
    with safe_open(path, framework="pt") as f:
        h = f.get_slice("bf16_2d")
        assert h.get_dtype() == "BF16"
        got = h[1:7:2, ::-1]
        assert got.dtype == torch.bfloat16 and tuple(got.shape) == (3, 6)
        raw = expected(tensors["bf16_2d"])[1:7:2, ::-1]
        assert as_bytes(got) == np.ascontiguousarray(raw).tobytes()
        assert f.get_slice("f8_3d").get_dtype() == "F8_E4M3"


def test_get_dtype_spellings(synth):
    _mode, path, tensors = synth
    want = {"f32_3d": "F32", "i64_1d": "I64", "f16_2d": "F16", "u8_2d": "U8",
            "bool_2d": "BOOL", "i16_col": "I16", "i32_zero_mid": "I32", "bf16_2d": "BF16",
            "f8_3d": "F8_E4M3", "f4_packed": "F4"}
    with safe_open(path) as f:
        for name, dt in want.items():
            assert f.get_slice(name).get_dtype() == dt
        assert f.get_slice("f32_scalar").get_shape() == []
        assert f.get_slice("f4_packed").get_shape() == [4, 2]


# ------------------------------------------------------------ what is read

def test_rows_read_only_their_bytes(synth, monkeypatch):
    """Unverified: a run of whole rows reads those rows' bytes and nothing
    else; chunked: the chunks covering them; whole digest: the whole
    tensor once, through the pool, then nothing. Anything but whole rows
    goes through Slice._read_part (the function a read of only the part's
    bytes will replace), rows never."""
    mode, path, tensors = synth
    parts = []
    real = Slice._read_part

    def spy(self, ranges, dropped):
        parts.append((self._name, [(r.start, r.stop, r.step) for r in ranges], dropped))
        return real(self, ranges, dropped)
    monkeypatch.setattr(Slice, "_read_part", spy)
    row = 3 * 4 * 9 * 4  # big_4d: 432 bytes a row
    with safe_open(path) as f:
        s = f.get_slice("big_4d")
        st0 = f.model.stats()
        np.testing.assert_array_equal(s[2:6], tensors["big_4d"][2:6])
        np.testing.assert_array_equal(s[7], tensors["big_4d"][7])
        st1 = f.model.stats()
        assert parts == []
        np.testing.assert_array_equal(s[1:9:3, :, 1], tensors["big_4d"][1:9:3, :, 1])
        st2 = f.model.stats()
        assert parts == [("big_4d", [(1, 9, 3), (0, 3, 1), (1, 2, 1), (0, 9, 1)],
                          (False, False, True, False))]
    if mode == "none":
        assert st1["bytes_read"] - st0["bytes_read"] == 5 * row
        assert st2["bytes_read"] - st1["bytes_read"] == 7 * row  # rows 1..7, then cut
        assert st2["tensors_loaded"] == st0["tensors_loaded"]
    elif mode == "chunked":
        # rows 2..5 (864..2591) and row 7 (3024..3455): chunk 0; rows 1..7: chunk 0
        assert st1["chunks_verified"] - st0["chunks_verified"] == 2
        assert st1["bytes_read"] - st0["bytes_read"] == 2 * CHUNK
        assert st2["tensors_loaded"] == st0["tensors_loaded"]
    else:
        assert st1["tensors_loaded"] - st0["tensors_loaded"] == 1
        assert st1["bytes_read"] - st0["bytes_read"] == tensors["big_4d"].nbytes
        assert st2["bytes_read"] == st1["bytes_read"]  # cached: no read


def test_empty_selection_reads_nothing(synth):
    _mode, path, tensors = synth
    with safe_open(path) as f:
        s = f.get_slice("big_4d")
        st0 = f.model.stats()
        assert s[5:5].shape == (0, 3, 4, 9)
        assert s[:, 3:].shape == (40, 0, 4, 9)
        assert s[2, ::-1, 4:1].shape == (3, 0, 9)
        assert f.get_slice("i32_zero_mid")[1].shape == (0, 2)
        assert f.get_slice("f32_empty")[...].shape == (0, 3)
        assert f.model.stats()["bytes_read"] == st0["bytes_read"]


def test_damage(tmp_path):
    """A flipped byte: unverified slices read the bytes as they now are; a
    whole-tensor digest fails every slice of the tensor with ChecksumError,
    even rows far from the byte; other tensors are not affected."""
    path = str(tmp_path / "m.safetensors")
    tensors = synth_tensors()
    digests = stfile.write(path, tensors)
    stfile.flip_byte(path, stfile.tensor_offset(path, "f32_3d") + 1)  # row 0
    now = stfile.read(path)[0]["f32_3d"][2]
    now = np.frombuffer(now, np.float32).reshape(13, 7, 5)
    with safe_open(path) as f:
        np.testing.assert_array_equal(f.get_slice("f32_3d")[0, 0], now[0, 0])
    stfile.write_manifest(path + ".manifest.json", digests)
    with safe_open(path) as f:
        s = f.get_slice("f32_3d")
        for idx in (0, slice(10, 13), (Ellipsis, 2), slice(None, None, -4)):
            with pytest.raises(sluice.ChecksumError) as e:
                s[idx]
            assert e.value.name == "f32_3d" or "f32_3d" in str(e.value)
        np.testing.assert_array_equal(f.get_slice("i64_1d")[::2], tensors["i64_1d"][::2])


# ------------------------------------------------------------ errors

@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("plain") / "m.safetensors")
    stfile.write(path, synth_tensors())
    return path


@pytest.mark.parametrize("idx, exc, match", [
    (13, IndexError, "out of bounds for dimension 0 with size 13"),
    (-14, IndexError, "index -14 is out of bounds"),
    ((0, 7), IndexError, "dimension 1 with size 7"),
    ((0, 0, 0, 0), IndexError, "too many indices"),
    ((Ellipsis, 0, Ellipsis), IndexError, "single ellipsis"),
    (slice(None, None, 0), ValueError, "step cannot be zero"),
    (None, NotImplementedError, "np.newaxis"),
    ((0, None), NotImplementedError, "np.newaxis"),
    ([0, 1], NotImplementedError, "list"),
    ((slice(None), [0, 1]), NotImplementedError, "advanced"),
    (np.array([0, 2]), NotImplementedError, "advanced"),
    (((0, 1),), NotImplementedError, "advanced"),       # NumPy: rows 0 and 1
    ((slice(None), (0, 2)), NotImplementedError, "advanced"),
    (((),), NotImplementedError, "advanced"),           # NumPy: an empty selection
    (range(2), NotImplementedError, "advanced"),
    (True, NotImplementedError, "boolean"),
    ((np.bool_(False),), NotImplementedError, "boolean"),
    (1.5, IndexError, "only integers"),
    (np.float64(1.0), IndexError, "only integers"),
    ("a", IndexError, "only integers"),
    (slice(0.5, 2), TypeError, "slice indices"),
])
def test_index_errors(plain, idx, exc, match):
    with safe_open(plain) as f:
        s = f.get_slice("f32_3d")
        st0 = f.model.stats()
        with pytest.raises(exc, match=match):
            s[idx]
        assert f.model.stats()["bytes_read"] == st0["bytes_read"]  # refused before reading


@needs_torch
def test_index_errors_torch(plain):
    with safe_open(plain, framework="pt") as f:
        with pytest.raises(NotImplementedError, match="advanced"):
            f.get_slice("f32_3d")[torch.tensor([0, 1])]


class _Index:
    """An integer by __index__ only (not an int): NumPy indexes by it."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def test_index_protocol(plain):
    """An object with __index__ is an integer index, as NumPy takes it."""
    full = synth_tensors()["f32_3d"]
    with safe_open(plain) as f:
        s = f.get_slice("f32_3d")
        for idx in (_Index(2), (_Index(-1), slice(None), _Index(3)), (Ellipsis, _Index(0))):
            want = full[idx]
            got = s[idx]
            assert got.shape == want.shape and got.tobytes() == want.tobytes(), idx
        with pytest.raises(IndexError, match="out of bounds"):
            s[_Index(13)]


def test_scalar_and_packed(plain):
    with safe_open(plain) as f:
        s = f.get_slice("f32_scalar")
        assert s[()] == 2.5 and s[...].shape == () and s[...].flags.writeable
        with pytest.raises(IndexError, match="too many indices"):
            s[0]
        with pytest.raises(TypeError):
            len(s)
        assert len(f.get_slice("f32_3d")) == 13
        with pytest.raises(NotImplementedError, match="packed dtype"):
            f.get_slice("f4_packed")[...]
        with pytest.raises(NotImplementedError, match="packed dtype"):
            f.get_slice("f4_packed")[0]
        with pytest.raises(sluice.NotFoundError):
            f.get_slice("missing")


def test_dtype_without_element_type(plain, monkeypatch):
    """A dtype the library reads but the package's tables do not name (I16
    taken out here, standing for one a newer library adds) is refused by
    get_slice (NotImplementedError, nothing read), not sliced as bytes."""
    monkeypatch.delitem(sluice._NP_DTYPES, "I16")
    with safe_open(plain) as f:
        s = f.get_slice("i16_col")
        assert s.get_dtype() == "I16" and s.get_shape() == [7, 1]
        st0 = f.model.stats()
        for idx in (slice(1, 3), Ellipsis, 0):
            with pytest.raises(NotImplementedError, match="'i16_col' is I16"):
                s[idx]
        assert f.model.stats()["bytes_read"] == st0["bytes_read"]


def test_normalize_index():
    assert normalize_index((Ellipsis, -1), (4, 5)) == ([range(0, 4), range(4, 5)],
                                                       (False, True))
    assert normalize_index(slice(None, None, -2), (5,)) == ([range(4, -1, -2)], (False,))
    assert normalize_index((), ()) == ([], ())


def test_frameworks(plain):
    for fw in ("np", "numpy"):
        with safe_open(plain, framework=fw) as f:
            assert isinstance(f.get_slice("i64_1d")[1:3], np.ndarray)
    for fw in ("tf", "tensorflow", "flax", "jax", "mlx", "paddle"):
        with pytest.raises(NotImplementedError, match="'np', 'numpy'"):
            safe_open(plain, framework=fw)
    with pytest.raises(ValueError):
        safe_open(plain, framework="cupy")
    with pytest.raises(ValueError, match="cpu"):
        safe_open(plain, framework="numpy", device="cuda:0")


def test_backend(plain):
    """The reference's keyword-only backend= ("mmap", "pread") is taken;
    anything else is refused, as the reference refuses it."""
    for backend in ("mmap", "pread"):
        with safe_open(plain, framework="np", backend=backend) as f:
            assert f.get_slice("i64_1d")[1:3].tolist() == [-4, -3]
    with pytest.raises(ValueError, match="backend 'odirect' is invalid"):
        safe_open(plain, backend="odirect")
    with pytest.raises(TypeError):
        safe_open(plain, backend=1)


@needs_torch
def test_frameworks_torch(plain):
    for fw in ("pt", "torch", "pytorch"):
        with safe_open(plain, framework=fw, device="cpu") as f:
            t = f.get_slice("i64_1d")[1:3]
            assert isinstance(t, torch.Tensor) and t.tolist() == [-4, -3]


@needs_torch
def test_torch_missing_dtype(tmp_path):
    """A dtype this torch has no type for raises NotImplementedError naming
    the tensor, before reading (U16 before torch 2.3)."""
    if hasattr(torch, "uint16"):
        pytest.skip(f"torch {torch.__version__} has uint16")
    path = str(tmp_path / "u16.safetensors")
    stfile.write(path, {"u": np.arange(6, dtype=np.uint16)})
    with safe_open(path, framework="pt") as f:
        with pytest.raises(NotImplementedError, match="'u'.*U16"):
            f.get_slice("u")[1:3]
        with pytest.raises(NotImplementedError, match="'u'.*U16"):
            f.get_tensor("u")
    with safe_open(path, framework="np") as f:
        assert f.get_slice("u")[1:3].tolist() == [1, 2]


# ------------------------------------------------------------ the API

def test_keys_metadata_get_tensors(tmp_path):
    path = str(tmp_path / "m.safetensors")
    tensors = {"z": np.arange(3.0), "a": np.arange(2), "m": np.ones((2, 2), np.float32)}
    stfile.write(path, tensors, metadata={"k": "v"})
    with safe_open(path, framework="np") as f:
        assert f.keys() == ["a", "m", "z"]              # sorted
        assert f.offset_keys() == ["z", "a", "m"]       # file order
        assert f.metadata() == {"k": "v"}
        got = f.get_tensors()
        assert list(got) == ["z", "a", "m"]
        for k, v in tensors.items():
            np.testing.assert_array_equal(got[k], v)
    for meta, want in ((None, None), ({}, {})):
        stfile.write(path, tensors, metadata=meta)
        with safe_open(path) as f:
            assert f.metadata() == want
    # keyword arguments of sluice.open pass through; a pool given is kept
    with safe_open(path, verify="off", pool="8M") as f:
        assert f.model.stats()["pool_bytes"] == 8 << 20
    with pytest.raises(TypeError):
        safe_open(path, no_such_option=1)


# ------------------------------------------------------------ the real corpus

def _offsets(path):
    return {k: v[3] for k, v in stfile.parse(path)[2].items()}


@pytest.mark.parametrize("model", real_models() or ["absent"],
                         ids=lambda p: os.path.basename(p))
def test_real_files(model, real_dir):
    """Every tensor of every real file: slices equal NumPy's of the whole
    tensor; keys() sorted, offset_keys() in data order file by file;
    metadata() as the header has it (None for absent or null)."""
    with safe_open(model, framework="np", raw=True) as f:
        names = f.offset_keys()
        assert f.keys() == sorted(names)
        files = f.model.files
        pos = {}
        for fi, p in enumerate(files):
            for k, off in _offsets(p).items():
                pos[k] = (fi, off)
        assert sorted(pos) == sorted(names)
        order = [pos[k] for k in names]
        assert order == sorted(order)
        if len(files) == 1:
            assert f.metadata() == stfile.parse(files[0])[3]
        n = 0
        for seed, name in enumerate(names):
            full = f.get_tensor(name)
            s = f.get_slice(name)
            assert s.get_shape() == list(full.shape)
            assert s.get_dtype() == f.model.info(name).dtype
            if s.get_dtype() in sluice._PACKED:
                continue
            for idx in indices_for(full.shape, seed)[:12]:
                got = s[idx]
                assert got.shape == np.shape(full[idx]), (name, idx)
                assert got.tobytes() == np.ascontiguousarray(full[idx]).tobytes(), (name, idx)
                n += 1
        assert n > 0 or not names


@needs_torch
@pytest.mark.parametrize("model", real_models() or ["absent"],
                         ids=lambda p: os.path.basename(p))
def test_real_files_torch(model, real_dir):
    with safe_open(model, framework="np", raw=True) as fn, \
            safe_open(model, framework="pt", raw=True) as ft:
        for seed, name in enumerate(fn.offset_keys()):
            dt = fn.model.info(name).dtype
            if dt in sluice._PACKED:
                continue
            full = fn.get_tensor(name)
            s = ft.get_slice(name)
            for idx in indices_for(full.shape, seed)[:6]:
                try:
                    got = s[idx]
                except NotImplementedError as e:
                    assert dt in ("U16", "U32", "U64") and not hasattr(torch, "uint16"), e
                    break
                assert tuple(got.shape) == np.shape(full[idx]), (name, idx)
                assert as_bytes(got) == np.ascontiguousarray(full[idx]).tobytes(), (name, idx)


def test_closed(plain):
    """After close (the with block's end) every call raises ClosedError,
    a slice taken before included (the reference's slices keep its mmap;
    here a closed model refuses new reads); tensors given stay valid."""
    with safe_open(plain) as f:
        s = f.get_slice("i64_1d")
        t = f.get_tensor("i64_1d")
    for call in (f.keys, f.offset_keys, f.metadata, f.get_tensors, lambda: f.get_tensor("i64_1d"),
                 lambda: f.get_slice("i64_1d"), lambda: s[1:3]):
        with pytest.raises(sluice.ClosedError):
            call()
    assert s.get_shape() == [11] and t.tolist() == list(range(-5, 6))


def test_whole_digest_larger_than_the_pool(tmp_path):
    """pool= smaller than a tensor under a whole-tensor digest: a slice is
    read by read_into (the whole tensor verified through its bounce
    buffer, only the rows kept), where get_tensor raises TooLargeError;
    a flipped byte still fails every slice."""
    path = str(tmp_path / "big.safetensors")
    rng = np.random.default_rng(2)
    big = rng.standard_normal((512, 1024)).astype(np.float32)  # 2 MiB
    digests = stfile.write(path, {"big": big})
    stfile.write_manifest(path + ".manifest.json", digests)
    with safe_open(path, pool="1M") as f:
        with pytest.raises(sluice.TooLargeError):
            f.get_tensor("big")
        s = f.get_slice("big")
        st0 = f.model.stats()
        np.testing.assert_array_equal(s[10:12], big[10:12])
        np.testing.assert_array_equal(s[::-100, 7], big[::-100, 7])
        st = f.model.stats()
        assert st["bytes_read"] - st0["bytes_read"] == 2 * big.nbytes  # whole, each time
    stfile.flip_byte(path, stfile.tensor_offset(path, "big") + big.nbytes - 1)
    with safe_open(path, pool="1M") as f:
        with pytest.raises(sluice.ChecksumError):
            f.get_slice("big")[0]
