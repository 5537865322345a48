"""sluice: lazy, verified loading of .safetensors weights.

    import sluice
    with sluice.open("model_dir") as model:          # headers only
        w = model.get_tensor("lm_head.weight")       # read, verified, zero copy
        for name, t in model.stream():                # every tensor, bounded memory
            ...

Arrays are read-only views of the library's verified buffer: no copy is
made. torch tensors are writable; a write into one reaches no other
reader (see _WriteGuard). An array keeps its buffer (and the model) alive; Model.close() is
honoured at once for new calls, and the library's model is really closed
when the last array made from it is gone.

Drop-in for the safetensors package: ``from sluice import safe_open,
load_file``. See bindings/python/README.md.
"""
import hashlib as _hashlib
import os as _os
import re as _re
import threading as _threading
from collections import namedtuple as _namedtuple

import numpy as _np

from . import _errors
from ._errors import (  # noqa: F401  (re-exported)
    BufferTooSmallError, BusyError, CancelledError, ChecksumError, ClosedError, Error, FileChangedError,
    HeaderError, InvalidArgumentError, ManifestError, ManifestMismatchError, NoFilesError,
    NotFoundError, OutOfMemoryError, PoolError, PoolExhaustedError, ReadError, RemoteError,
    ShardIndexError, SignatureError, TooLargeError, UnsupportedError, UnverifiedWarning,
    error_class,
)
from . import _sluice

__version__ = "0.1.0"
library_version = _sluice.library_version

__all__ = [
    "open", "Model", "TensorInfo", "safe_open", "load_file", "Error", "ChecksumError",
    "HeaderError", "ManifestError", "ManifestMismatchError", "SignatureError", "ShardIndexError", "ReadError", "FileChangedError",
    "NotFoundError", "NoFilesError", "InvalidArgumentError", "ClosedError", "RemoteError",
    "OutOfMemoryError", "PoolError", "TooLargeError", "PoolExhaustedError", "BusyError",
    "CancelledError", "BufferTooSmallError", "UnsupportedError", "parse_size",
    "HAVE_ML_DTYPES", "algorithm_supported", "features", "serve_metrics", "MetricsServer",
    "Cache", "CacheEntry", "UnverifiedWarning", "write_manifest",
]


def algorithm_supported(name):
    """True when this build computes the digest algorithm name ("sha256",
    "blake3"): BLAKE3 needs its C sources at build time (setup.py)."""
    if not isinstance(name, str):
        raise TypeError(f"algorithm must be a str, not {type(name).__name__}")
    return _sluice.algorithm_supported(name)

# ------------------------------------------------------------------ dtypes

try:  # optional: real NumPy dtypes for BF16 and the F8 types
    import ml_dtypes as _ml_dtypes
except ImportError:  # Debian does not package it: raw views, see _np_dtype
    _ml_dtypes = None
HAVE_ML_DTYPES = _ml_dtypes is not None

_NP_DTYPES = {
    "BOOL": _np.bool_, "U8": _np.uint8, "I8": _np.int8, "I16": _np.int16, "U16": _np.uint16,
    "F16": _np.float16, "I32": _np.int32, "U32": _np.uint32, "F32": _np.float32,
    "I64": _np.int64, "U64": _np.uint64, "F64": _np.float64, "C64": _np.complex64,
}
# Without ml_dtypes NumPy has no type for these: asking for them raises
# (_np_dtype_checked) unless the caller asks for their bits (raw=True):
# unsigned integers of the same size (BF16 -> uint16, F8_* -> uint8).
_RAW_NP = {
    "BF16": ("bfloat16", _np.uint16), "F8_E5M2": ("float8_e5m2", _np.uint8),
    "F8_E4M3": ("float8_e4m3fn", _np.uint8), "F8_E8M0": ("float8_e8m0fnu", _np.uint8),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", _np.uint8), "F8_E5M2FNUZ": ("float8_e5m2fnuz", _np.uint8),
}
# Packed types (elements smaller than a byte): given as the flat bytes
# (uint8, shape (nbytes,)), for the caller to unpack.
_PACKED = {"F4", "F6_E2M3", "F6_E3M2"}


def _np_dtype(dtype):
    """The NumPy dtype for a safetensors dtype name, and whether it is raw
    (the dtype's bits, not its values: BF16/F8_* without ml_dtypes, packed
    types). Callers that hand out arrays go through _np_dtype_checked."""
    t = _NP_DTYPES.get(dtype)
    if t is not None:
        return _np.dtype(t), False
    if dtype in _RAW_NP:
        ml_name, raw = _RAW_NP[dtype]
        if _ml_dtypes is not None and hasattr(_ml_dtypes, ml_name):
            return _np.dtype(getattr(_ml_dtypes, ml_name)), False
        return _np.dtype(raw), True
    return _np.dtype(_np.uint8), True  # packed


def _np_dtype_checked(dtype, name, raw=False):
    """The NumPy dtype a tensor is given as. A dtype NumPy cannot represent
    (BF16 and F8_* without ml_dtypes) raises NotImplementedError naming the
    tensor, unless raw: then its bits (uint16, uint8). Packed types (F4,
    F6_*) are their flat bytes (uint8) either way: their shape is not the
    tensor's, so they cannot pass for values."""
    npd, is_raw = _np_dtype(dtype)
    if is_raw and not raw and dtype not in _PACKED:
        raise NotImplementedError(
            f"tensor {name!r} is {dtype}: NumPy has no dtype for it without ml_dtypes "
            f"(pip install ml_dtypes); pass raw=True for its bits ({npd.name})")
    return npd


_torch = None
_TORCH_DTYPES = None


def _load_torch():
    global _torch, _TORCH_DTYPES
    if _torch is None:
        try:
            import torch
        except ImportError as e:
            raise ImportError("framework='pt' needs torch (Debian: python3-torch)") from e
        t = {
            "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
            "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32,
            "F32": torch.float32, "I64": torch.int64, "F64": torch.float64,
            "C64": torch.complex64,
        }
        # Types this torch may or may not have (float8 since 2.1, uint16+ since 2.3).
        for name, attr in (("F8_E5M2", "float8_e5m2"), ("F8_E4M3", "float8_e4m3fn"),
                           ("F8_E8M0", "float8_e8m0fnu"), ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
                           ("F8_E5M2FNUZ", "float8_e5m2fnuz"), ("U16", "uint16"),
                           ("U32", "uint32"), ("U64", "uint64")):
            if hasattr(torch, attr):
                t[name] = getattr(torch, attr)
        _TORCH_DTYPES = t
        _torch = torch
    return _torch


def _torch_dtype(dtype, raw=False):
    """The torch dtype of a safetensors dtype; TypeError when this torch
    has none (U16/U32/U64 before torch 2.3; F8_* before torch 2.1, unless
    raw: then their bits, uint8). Packed types (F4, F6_*) are their flat
    bytes (uint8)."""
    torch = _load_torch()
    t = _TORCH_DTYPES.get(dtype)
    if t is not None:
        return t
    if dtype in _PACKED or (raw and dtype.startswith("F8_")):
        return torch.uint8
    if dtype.startswith("F8_"):
        raise TypeError(f"torch {torch.__version__} has no dtype for {dtype}: pass raw=True "
                        "for its bits (uint8), or use torch >= 2.1")
    raise TypeError(f"torch {torch.__version__} has no dtype for {dtype}: "
                    "use framework='np'")


def _torch_dtype_named(dtype, name, raw=False):
    """_torch_dtype, its TypeError as NotImplementedError naming the tensor."""
    try:
        return _torch_dtype(dtype, raw)
    except TypeError as e:
        raise NotImplementedError(f"tensor {name!r}: {e}") from None


# ------------------------------------------------------------------ writes
#
# A torch tensor is writable: torch has no read-only tensors. One given
# without a copy is over the library's verified buffer, which the pool
# would otherwise serve again, to the next get_tensor or stream of the
# same tensor. The rule (per Model, _WriteGuard): a buffer that went out
# writable is never shared, and is not reused until checked:
#  - a torch tensor gets the pool's buffer only when nothing else this
#    model gave out holds it; else a private copy (read and verified
#    again from the file, sluice_read_into);
#  - while a torch tensor holds the buffer, every other read of that
#    tensor gets a private copy;
#  - once it is gone, the next read of that tensor hashes the buffer it
#    is given and compares with the digest the library computed when it
#    verified it (sha256; blake3 with the blake3 module; where there is
#    neither, as in an unverified model, with the SHA-256 the guard took
#    of the bytes when it gave them to the first writer); on a mismatch,
#    a private copy instead, until a check passes (the buffer was
#    evicted and read again).
# NumPy arrays are read-only (their WRITEABLE flag cannot be set). The
# handles of Model.get_handle are read-only buffers, outside this rule.


class _Lease:
    """The bytes of one handle as a flat uint8 array interface: the base of
    one NumPy array or torch tensor (and of every view of it). Read-only
    for NumPy, writable for torch (torch then warns of nothing: the
    buffer is the tensor's alone). Its end is the end of the last view."""

    def __init__(self, handle, writable):
        self._guard = None
        self.base = handle  # handle_of() walks .base
        self.__array_interface__ = {"data": (handle.address, not writable),
                                    "shape": (handle.nbytes,), "typestr": "|u1",
                                    "version": 3}

    def __del__(self):
        g = self._guard
        if g is not None:
            g._gone(self._index, self._writer)


class _WriteGuard:
    """Per model: which tensors' pool buffers are out (and how many of
    those are writable torch tensors), and which a writable tensor held
    (checked before they are given out again). See above."""

    def __init__(self, algorithm):
        self._algorithm = algorithm
        self._lock = _threading.RLock()  # __del__ of a lease may run inside
        self._out = {}       # index -> leases alive over the pool's buffer
        self._writers = {}   # index -> writable ones among them
        self._written = {}   # index -> times a writable lease ended (unchecked)
        self._ended = {}     # index -> times a writable lease ended, ever (never drops:
                             # a count back where it was is no proof that none ended)
        self._prints = {}    # index -> SHA-256 taken at hand-out (no library digest)

    def _gone(self, i, writer):
        with self._lock:
            _count(self._out, i, -1)
            if writer:
                _count(self._writers, i, -1)
                self._written[i] = self._written.get(i, 0) + 1
                self._ended[i] = self._ended.get(i, 0) + 1

    def _free_for(self, i, writable):
        return not self._writers.get(i) and not (writable and self._out.get(i))

    def _take(self, h, i, writable):
        lease = _Lease(h, writable)
        lease._index, lease._writer = i, writable
        _count(self._out, i, 1)
        if writable:
            _count(self._writers, i, 1)
        lease._guard = self
        return lease

    def admit(self, h, i, writable):
        """A lease over handle h (the pool's buffer of tensor i) when it may
        be given out so, else None: the caller reads a private copy."""
        with self._lock:
            if not self._free_for(i, writable):
                return None
            seen = self._written.get(i)
            ended = self._ended.get(i)
            if seen is None:
                lease = self._take(h, i, writable)
                own = writable and i not in self._prints and self._digest(h) is None
            else:
                lease = None
        if lease is not None:
            if own:  # the bytes as given: what the check before reuse compares with
                self._prints.setdefault(i, _hashlib.sha256(memoryview(h)).digest())
            return lease
        if not self._pristine(h, i):  # the GIL is released while hashing
            return None
        with self._lock:
            if not self._free_for(i, writable):
                return None
            if self._ended.get(i) != ended:  # a writer had it meanwhile: the check is stale
                return None
            self._written.pop(i, None)  # checked (another reader may have cleared it)
            return self._take(h, i, writable)

    def _digest(self, h):
        """(hasher, digest) of the library's check of h's bytes, or None
        (no digest: an unverified model; no hasher for it here)."""
        want = h.digest()
        if want is None:
            return None
        if self._algorithm == "sha256":
            return _hashlib.sha256, want
        if self._algorithm == "blake3":
            try:
                import blake3
            except ImportError:
                return None
            return blake3.blake3, want
        return None

    def _pristine(self, h, i):
        """True when h's bytes hash to the library's digest of them (or,
        without one, to the SHA-256 taken when a writer was given them)."""
        d = self._digest(h)
        if d is None:
            want = self._prints.get(i)
            if want is None:
                return False
            d = (_hashlib.sha256, want)
        hasher, want = d
        return hasher(memoryview(h)).digest() == want


def _count(d, k, n):
    v = d.get(k, 0) + n
    if v:
        d[k] = v
    else:
        del d[k]


def _wrap(handle, dtype, shape, framework, name, raw=False, guard=None, index=None,
          reread=None):
    """The tensor of a handle: a read-only NumPy array ("np") or a torch
    tensor ("pt"), without a copy where _WriteGuard allows (guard None: a
    handle whose buffer is its own, a range's or a part's). reread(index,
    buffer) reads the tensor's verified bytes into a private buffer when
    the guard refuses. A dtype the framework cannot represent raises
    NotImplementedError naming the tensor, unless raw (its bits)."""
    torch_ = framework == "pt"
    if torch_:
        torch = _load_torch()
        edt = _torch_dtype_named(dtype, name, raw)
    else:
        edt = _np_dtype_checked(dtype, name, raw)
    if dtype in _PACKED:
        shape = (handle.nbytes,)
    n = handle.nbytes
    if n == 0:
        if torch_:
            return torch.empty(shape, dtype=edt)
        return _np.frombuffer(handle, dtype=edt).reshape(shape)
    if guard is None:
        flat = _np.asarray(_Lease(handle, torch_))
    else:
        lease = guard.admit(handle, index, torch_)
        if lease is not None:
            flat = _np.asarray(lease)
        else:  # a private copy, read and verified again
            flat = torch.empty(n, dtype=torch.uint8).numpy() if torch_ else _np.empty(n, _np.uint8)
            reread(index, flat)
            if not torch_:
                flat.flags.writeable = False
    if torch_:
        return torch.from_numpy(flat).view(edt).reshape(shape)
    return flat.view(edt).reshape(shape)


def _check_framework(framework):
    if not isinstance(framework, str):
        raise TypeError(f"framework must be a str, not {type(framework).__name__}")
    if framework in ("np", "numpy"):
        return "np"
    if framework in ("pt", "torch"):
        _load_torch()
        return "pt"
    raise ValueError(f"framework must be 'np' or 'pt', not {framework!r}")


# ------------------------------------------------------------------ options

_SIZE_RE = _re.compile(r"^\s*(\d+)\s*([kKmMgGtT]?)(i?[bB])?\s*$")


_SIZE_MAX = (1 << 64) - 1  # the library's sizes are uint64_t


def parse_size(value, what="size"):
    """Bytes from an int or a string such as "4G", "512M", "64KiB" (powers
    of 1024), from 1 to 2**64 - 1. None gives None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{what} must be an int or a string like '4G', not {type(value).__name__}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{what} must be positive, not {value}")
        if value > _SIZE_MAX:
            raise ValueError(f"{what} {value} is too large (at most 2**64 - 1 bytes)")
        return value
    m = _SIZE_RE.match(value)
    if not m:
        raise ValueError(f"{what}: cannot read {value!r} as a size (e.g. '4G', '512M')")
    n = int(m.group(1)) << (10 * " KMGT".index((m.group(2) or " ").upper()))
    if n <= 0:
        raise ValueError(f"{what} must be positive, not {value!r}")
    if n > _SIZE_MAX:
        raise ValueError(f"{what} {value!r} is too large (at most 2**64 - 1 bytes)")
    return n


_VERIFY = {"default": 0, "require": 1, "if_present": 2, "off": 3}


def _opt_int(value, what, minimum=0):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, not {value}")
    return value


def _fspath(path, what="path"):
    try:
        return _os.fspath(path)
    except TypeError:
        raise TypeError(f"{what} must be a str, bytes or os.PathLike, "
                        f"not {type(path).__name__}") from None


# ------------------------------------------------------------------ Model

TensorInfo = _namedtuple("TensorInfo", "name dtype shape nbytes file offset index")


def _name_arg(name):
    if not isinstance(name, str):
        raise TypeError(f"a tensor name must be str, not {type(name).__name__}")
    return name


class Model:
    """An open model (see sluice.open). A context manager.

    Mapping-like: len(model), name in model, iter(model), model[name]
    (a NumPy array). Thread-safe: get_tensor from many threads at once
    runs concurrently (the GIL is released while the library works).
    """

    def __init__(self, core, path):
        self._m = core
        self.path = path
        self._guard = _WriteGuard(core.digest_algorithm())

    # -- lifetime
    def close(self):
        """Closes the model for new calls. Arrays still alive keep their
        memory: the library's model is closed when the last one is gone."""
        self._m.close()

    @property
    def closed(self):
        return self._m.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        state = "closed" if self.closed else f"{len(self)} tensors"
        return f"<sluice.Model {self.path!r} {state}>"

    # -- index
    def keys(self):
        """Every tensor name, in model order (shard, then offset)."""
        return self._m.names()

    def __iter__(self):
        return iter(self._m.names())

    def __len__(self):
        return self._m.count()

    def __contains__(self, name):
        if not isinstance(name, str):
            return False
        return self._m.find(name) >= 0

    def _index(self, name):
        i = self._m.find(_name_arg(name))
        if i < 0:
            raise NotFoundError(_errors.E_NOT_FOUND, f"no tensor named {name!r}", name)
        return i

    def info(self, name):
        """TensorInfo(name, dtype, shape, nbytes, file, offset, index)."""
        t = self._m.info(self._index(name))
        return TensorInfo(t[0], t[1], t[2], t[3], t[4], t[5], t[7])

    @property
    def files(self):
        """The paths of the model's files (shards), in order."""
        return [self._m.file_info(i)[0] for i in range(self._m.file_count())]

    def metadata(self, file=None):
        """The __metadata__ of a file (a dict of str, or None when absent or
        null). file: an index or a path among model.files; None: the first
        file when the model has one, merged over all shards when the model
        has several (later shards do not override earlier ones)."""
        n = self._m.file_count()
        if file is None:
            if n == 0:
                return None
            merged = None
            for i in range(n):
                meta = self._m.file_info(i)[5]
                if meta is not None:
                    merged = dict(meta, **(merged or {}))
            return merged
        if isinstance(file, int) and not isinstance(file, bool):
            if not 0 <= file < n:
                raise IndexError(f"file index {file} out of range (model has {n} files)")
            return self._m.file_info(file)[5]
        if isinstance(file, (str, bytes, _os.PathLike)):
            want = _os.fspath(file)
            want = _os.fsdecode(want)
            for i in range(n):
                fi = self._m.file_info(i)
                if fi[0] == want or _os.path.basename(fi[0]) == want:
                    return fi[5]
            raise KeyError(f"no file {want!r} in the model")
        raise TypeError(f"file must be an int, a path or None, not {type(file).__name__}")

    def stats(self):
        """A dict of the fields of sluice_stats (all but the remote ones:
        this binding opens local models), the persistent cache's included:
        disk_hits, disk_hit_bytes, disk_misses, disk_stored, disk_rotten,
        disk_evicted, memo_tensors, memo_bytes, disk_degraded (1: the cache
        was turned off, cache_warning says why), disk_busy (writes of the
        cache's index put off: another process held its lock); unverified
        (0: a manifest checks the bytes, 1: none was found, 2: verification
        is off)."""
        return self._m.stats()

    @property
    def cache_warning(self):
        """Why the persistent cache was turned off for this model (a
        read-only or full file system, a newer schema, a build without
        SQLite, ...; stats()["disk_degraded"] is then 1), else which file
        the verified-once memo refused (trust_unchanged on tmpfs, overlayfs
        and the like, where a write need not move mtime or ctime; the cache
        works, disk_degraded stays 0), else, while the cache works, the note
        that writes of its index were put off because another process held
        its lock (stats disk_busy), or None."""
        return self._m.cache_warning()

    @property
    def verify_mode(self):
        """'require', 'if_present' or 'off': the policy in force."""
        return self._m.verify_mode()

    @property
    def verify_state(self):
        """What the model's bytes are checked against (sluice_verify_state):
        'verified' (a manifest was read: manifest_path), 'publisher_digest'
        (a Hugging Face Hub cache snapshot with no manifest of its own, each
        file checked against the SHA-256 its blob is named by, or an hf://
        model that publishes none, each file checked against the LFS SHA-256
        the Hub lists; each tensor against the manifest derived from those
        bytes, kept in the cache directory: manifest_path), 'no_manifest' (none was given or found:
        nothing is checked, and open warned with UnverifiedWarning) or 'off'
        (verify="off")."""
        return _VERIFY_STATES.get(self._m.verify_state()[0], "off")

    @property
    def manifest_path(self):
        return self._m.manifest_path()

    @property
    def location(self):
        """The location that serves the model's index (sluice_model_location),
        as messages show it (no user:password@, "?..." for a query): the
        model's own (an hf:// one as the commit it was pinned to), or, when
        that could not be opened, the mirror (open's fallback=) serving
        instead. location_fallback says which, location_why why."""
        return self._m.location()[0]

    @property
    def location_fallback(self):
        """0 when the model's own location serves it, else k: fallback
        mirror k (1-based) serves, the locations before it could not."""
        return self._m.location()[1]

    @property
    def location_why(self):
        """With a mirror serving, why each location before it could not
        ("primary (LOC): <why>; fallback 1 (LOC): <why>"), else None."""
        return self._m.location()[2]

    @property
    def digest_algorithm(self):
        """'sha256' or 'blake3': the algorithm of the digests checked (the
        manifest's)."""
        return self._m.digest_algorithm()

    @property
    def manifest_version(self):
        """The manifest's version: 0 (flat, or none read), 1 or 2."""
        return self._m.manifest_version()

    def manifest_chunks(self, name):
        """(chunk_bytes, count) of the manifest's chunk digests for the
        tensor, or None when it gives none (or does not check it)."""
        entry = self._m.manifest_entry(self._index(name))
        return None if entry is None else entry[1]

    def source(self, name):
        """Where the tensor's bytes come from: "" from the model's own
        files, else the mirror and why ("fallback 1 (LOC), after: primary:
        ..."; sluice_tensor_source). Acquires the tensor (read and
        verified as get_tensor)."""
        i = self._index(name)
        return self._acquire(i, name).source

    def metrics_text(self, openmetrics=False):
        """The model's metrics, Prometheus text 0.0.4 (or OpenMetrics 1.0,
        ending "# EOF"), as sluice_metrics_write renders them."""
        return self._m.metrics_text(bool(openmetrics))

    def trim(self):
        """Gives the pool's free pages back to the system; returns bytes."""
        return self._m.trim()

    # -- tensors
    def get_tensor(self, name, framework="np", *, raw=False):
        """The tensor's bytes, read and verified, as a read-only NumPy array
        (framework="np") or a torch tensor ("pt"), without a copy. The array
        holds the library's handle until it is garbage-collected. Raises
        ChecksumError, ReadError, PoolExhaustedError, ... on failure.
        A torch tensor is writable and its writes reach no other reader:
        see "Writing into tensors" in the README (a tensor whose buffer
        another reader holds is a private copy). A dtype the framework
        cannot represent (BF16, F8_* in NumPy without ml_dtypes; F8_* in
        torch before 2.1; U16/U32/U64 in torch before 2.3) raises
        NotImplementedError naming the tensor, before anything is read;
        raw=True gives the bits of BF16 and F8_* instead (uint16, uint8)."""
        framework = _check_framework(framework)
        i = self._index(name)
        t = self._m.info(i)
        _check_dtype(t[1], name, framework, raw)
        h = self._acquire(i, name)
        return _wrap(h, t[1], t[2], framework, name, raw, self._guard, i, self._reread)

    def _reread(self, i, buf):
        """The verified bytes of tensor i into buf: a private copy."""
        try:
            self._m.read_into(i, buf, 0)
        except Error as e:
            e.name = self._m.info(i)[0]
            raise

    def _acquire(self, i, name):
        try:
            return self._m.acquire(i)
        except Error as e:
            e.name = name
            raise

    def read_into(self, name, buffer, offset=0):
        """Reads the tensor's bytes from byte `offset` into `buffer` (any
        writable C-contiguous buffer: bytearray, NumPy array, memoryview,
        at any alignment), as many as fit up to the tensor's end, and
        returns the count. Verified before it returns, like get_tensor's
        bytes: with the manifest's chunk digests only the chunks covering
        the range are read; with a whole-tensor digest the whole tensor is
        read (its bytes outside the range pass through a small buffer of
        the library's). No pool room, no handle: a tensor larger than the
        pool can be read so. The GIL is released meanwhile. On failure
        (ChecksumError, ReadError, ...) the buffer's content is
        unspecified: some bytes may have been written, none verified."""
        i = self._index(name)
        if offset is None:
            raise TypeError("offset must be an int")
        offset = _opt_int(offset, "offset")
        try:
            return self._m.read_into(i, buffer, offset)
        except Error as e:
            e.name = name
            raise

    def get_part(self, name, dim, rank, world, framework="np", *, raw=False):
        """Rank `rank` of `world` equal parts of the tensor along `dim`, the
        slice [rank * n / world, (rank + 1) * n / world) of that dim laid
        out contiguously, read and verified (sluice_read_part_into: only
        the part's bytes when the manifest has part digests, `sluice
        manifest --parts`; else dim 0 through chunk digests and dim >= 1 by
        reading the whole tensor once, counted in stats()
        ["part_fallback_bytes"] and said by part_note()). A read-only NumPy
        array ("np") or a torch tensor ("pt") over the handle's buffer in
        the pool (no copy; it holds pool room while it lives, as
        get_tensor's: PoolExhaustedError when live arrays hold the room,
        TooLargeError for a part larger than the pool). InvalidArgumentError
        when `world` does not divide the dim (the message has the numbers).
        raw: as for get_tensor."""
        framework = _check_framework(framework)
        i = self._index(name)
        _check_dtype(self._m.info(i)[1], name, framework, raw)
        for v, what in ((dim, "dim"), (rank, "rank"), (world, "world")):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{what} must be an int")
            if v < 0:
                raise ValueError(f"{what} must not be negative")
        t = self._m.info(i)
        if dim >= len(t[2]):
            # the binding passes dim as a C unsigned int: 2**32 + 1 would
            # reach the library as 1 and read another dim's part
            raise InvalidArgumentError(
                _errors.E_INVAL,
                f"tensor {name!r} has {len(t[2])} dims: no dim {dim} to split", name)
        try:
            h = self._m.acquire_part(i, dim, rank, world)
        except Error as e:
            e.name = name
            raise
        shape = tuple(d // world if k == dim else d for k, d in enumerate(t[2]))
        return _wrap(h, t[1], shape, framework, name, raw)  # its own buffer: no guard

    def part_note(self):
        """None, or the one sentence the library says once per model when
        a part was checked by reading its whole tensor (no part digests)."""
        return self._m.part_note()

    def get_range(self, name, begin, end):
        """Bytes [begin, end) of the tensor, read and verified as read_into
        reads them, as a read-only 1-D uint8 NumPy array over a buffer the
        library's handle owns (no copy; outside the pool). The array keeps
        the handle, and so the model, alive, like get_tensor's. Use
        .view(dtype) for typed elements."""
        i = self._index(name)
        if begin is None or end is None:
            raise TypeError("begin and end must be ints")
        begin = _opt_int(begin, "begin")
        end = _opt_int(end, "end")
        if end < begin:
            raise ValueError(f"end {end} is before begin {begin}")
        nbytes = self._m.info(i)[3]
        if end > nbytes:
            raise ValueError(f"end {end} is past the end of tensor {name!r} ({nbytes} bytes)")
        try:
            h = self._m.acquire_range(i, begin, end)
        except Error as e:
            e.name = name
            raise
        return _np.frombuffer(h, dtype=_np.uint8)

    def __getitem__(self, name):
        return self.get_tensor(name)

    def get_handle(self, name):
        """The raw handle (buffer protocol, .address, .nbytes, .digest())."""
        return self._acquire(self._index(name), name)

    def _indices(self, names, what="names"):
        if names is None:
            return None
        if isinstance(names, str):
            raise TypeError(f"{what} must be a list of names, not a str")
        try:
            it = iter(names)
        except TypeError:
            raise TypeError(f"{what} must be an iterable of str, "
                            f"not {type(names).__name__}") from None
        return [self._index(n) for n in it]

    def prefetch(self, names):
        """Hint: these tensors will be wanted next, in this order (replaces
        the previous hint; an empty list goes back to the model's order)."""
        self._m.prefetch(self._indices(names))

    def verify(self, names=None, files=False, threads=None):
        """Checks tensors (names; None: every one) and, with files=True,
        every whole file against the manifest without loading them
        (sluice_verify: no pool, no array; each thread preads into a small
        reused buffer). threads: None for the model's hash_threads.
        Returns a dict of the report: tensors_ok, tensors_failed, files_ok,
        files_failed, bytes_hashed, bytes_direct, threads, elapsed_ns, and
        failures, a list of Error (ChecksumError, FileChangedError, ...)
        each with .name (the tensor's name or the file's path) and .kind
        ("tensor" or "file"): empty when everything matched. Raises when
        the verify cannot run at all: ManifestError when no manifest was
        read (verify="off" reads none, not even the sidecar), NotFoundError
        for an unknown name, InvalidArgumentError."""
        if not isinstance(files, bool):
            raise TypeError(f"files must be a bool, not {type(files).__name__}")
        threads = _opt_int(threads, "threads") or 0
        if threads > 0xFFFFFFFF:
            raise ValueError(f"threads {threads} is too large")
        code, message, failed, report = self._m.verify(self._indices(names), files, threads)
        failures = []
        # Each failure comes with its name: no call on the model here, which
        # a close() from another thread during the verify would refuse.
        for kind, _i, c, msg, name in failed:
            e = _errors.make_error(c, msg, name)
            e.kind = kind
            failures.append(e)
        if code != 0 and not failures:
            raise _errors.make_error(code, message)
        report["failures"] = failures
        return report

    def stream(self, names=None, framework="np", *, raw=False):
        """Iterator of (name, tensor) in completion order, for names (None:
        every tensor), memory bounded by the pool. Failed tensors are not
        yielded: once the others were, it raises the first failure's error,
        with .failures listing every one (each an Error with .name). Arrays
        kept beyond the pool's room make later tensors fail with
        PoolExhaustedError: drop each one when done with it. The bound: a
        consumer that drops each tensor before taking the next (`del a` at
        the end of the loop's body) needs a pool of 2 of the largest
        tensors (the one it holds, the one handed over next: the stream
        hands a tensor over only when the consumer takes it); a loop that
        keeps its variable while the next is taken (no del) needs 3.
        Dtypes and raw: as for get_tensor (checked before anything is
        read); torch tensors: as get_tensor's."""
        framework = _check_framework(framework)
        indices = self._indices(names)
        core = self._m
        for i in (range(core.count()) if indices is None else indices):
            t = core.info(i)
            _check_dtype(t[1], t[0], framework, raw)
        return _stream_gen(core.stream(indices), framework, raw, self._guard)


def _check_dtype(dtype, name, framework, raw):
    """Raises NotImplementedError naming the tensor when the framework has
    no dtype for it (see Model.get_tensor)."""
    if framework == "pt":
        _torch_dtype_named(dtype, name, raw)
    else:
        _np_dtype_checked(dtype, name, raw)


def _stream_reread(cs):
    """A private copy's reader for _wrap, through a running stream (which
    keeps the model open after a close() meanwhile)."""
    def reread(i, buf):
        cs.read_into(i, buf, 0)
    return reread


def _stream_gen(cs, framework, raw, guard):
    # Each item comes with its tensor's info: no call on the model here,
    # which a close() during the stream would refuse (close() affects new
    # calls only; the stream goes on to its end).
    failures = []
    reread = _stream_reread(cs)
    try:
        while True:
            item = cs.next_item()
            if item is None:
                break
            _i, h, code, message, t = item
            # Nothing here may keep a tensor past the consumer's own use
            # (the item's tuple would hold its handle while the next one is
            # taken): see stream()'s pool bound.
            del item
            if h is None:
                failures.append(_errors.make_error(code, message, t[0]))
                continue
            try:
                arr = _wrap(h, t[1], t[2], framework, t[0], raw, guard, _i, reread)
            except Error as e:  # a private copy's read failed
                del h
                e.name = t[0]
                failures.append(e)
                continue
            del h
            yield t[0], arr
            del arr
        code, message = cs.result()
    finally:
        cs.close()  # an abandoned iterator stops the stream and joins it
    if failures:
        first = failures[0]
        err = _errors.make_error(first.code, first.message, first.name)
        err.failures = failures
        raise err
    if code != 0:
        err = _errors.make_error(code, message)
        err.failures = []
        raise err


def open(path, *, manifest=None, verify="default", pool=None, queue_depth=None, chunk=None,
         direct=False, hash_threads=None, io_threads=None, force_pread=False,
         trusted_keys=None, cache_dir=None, cache_bytes=None, trust_unchanged=False,
         trusted_cas=None, signature_path=None,
         fallback=None, http_token=None, s3_endpoint=None, s3_region=None, s3_addressing=None,
         remote_connections=None, remote_attempts=None, remote_deadline=None,
         remote_ca_file=None, http_proxy=None, proxy_kind=None):
    """Opens a model: a .safetensors file, a directory of them, or a
    *.safetensors.index.json, local or remote (http://, https://, s3://:
    see "Remote models and mirrors" in sluice.h). Reads headers only.

    manifest: a manifest path (default: the sidecar, when present).
    verify: "default" (require when a manifest is in play, else off),
            "require", "if_present" or "off" (no manifest is read, not
            even the sidecar: Model.verify then raises ManifestError).
    pool: the buffer budget, bytes or "4G"-style (the library's default:
    4 GiB, or 1/4 of a cgroup memory limit when less; a pool above the
    limit raises InvalidArgumentError); queue_depth: reads in
    flight; chunk: bytes per read; direct: O_DIRECT; hash_threads: hashing
    threads (None: online CPUs). None means the library's default.
    trusted_keys: a list of Ed25519 public key files (PEM, `sluice keygen`
    writes them): the manifest must then carry a valid signature
    (MANIFEST.sig beside it) by one of them, else SignatureError; with
    verify="off" they are refused (InvalidArgumentError). None or []: no
    signature asked. EC public keys (P-256/384/521) check an OpenSSF
    model signature instead, when model.sig is beside the model.
    trusted_cas: a list of CA certificate files (PEM): model.sig (or
    signature_path) must be an OpenSSF model signature whose certificate
    chains to one of them. With either, the signature must list the
    manifest (with its digest) and every .safetensors file, else
    SignatureError; the keyless (Sigstore) form is refused.
    cache_dir: the persistent cache's directory (made if missing; see
    "Persistent cache" in sluice.h). None: $SLUICE_CACHE_DIR when set, else
    the default ($XDG_CACHE_HOME/sluice, else ~/.cache/sluice) when
    trust_unchanged is set, else no cache. cache_bytes: the cache's budget
    in bytes of blobs, an int or "64G"-style (None: 64 GiB; 0 is refused
    with InvalidArgumentError). trust_unchanged: the verified-once memo: a
    tensor of a local file verified before, against the same digest, in
    the same unchanged file (device, inode, size, mtime, ctime), is not
    hashed again (stats' memo_tensors). A cache that cannot be used never
    fails the open: Model.cache_warning says why. For a remote model the
    cache keeps its verified tensors, so that a later load (any process,
    the sluice command too) reads them from disk, not the network.
    Remote options (the C options of the same names): fallback: a list of
    mirrors (directories, files or locations, tried in order; a manifest
    is required); http_token (Bearer, http(s) only; default
    $SLUICE_HTTP_TOKEN); s3_endpoint ($AWS_ENDPOINT_URL), s3_region
    ($AWS_REGION), s3_addressing "path" or "virtual"; remote_connections,
    remote_attempts; remote_deadline in seconds; remote_ca_file (PEM);
    http_proxy (a proxy URL, "" for none; default the environment's
    http_proxy/https_proxy/no_proxy) and proxy_kind "plain" or "dragonfly".
    trusted_cas (CA certificates) and signature_path (default model.sig)
    ask for an OpenSSF model-signing signature, as trusted EC keys do.
    None: the library's default.
    """
    _features.require_for_location(path)
    p = _fspath(path)
    mf = None if manifest is None else _fspath(manifest, "manifest")
    if not isinstance(verify, str):
        raise TypeError(f"verify must be a str, not {type(verify).__name__}")
    if verify not in _VERIFY:
        raise ValueError(f"verify must be one of {sorted(_VERIFY)}, not {verify!r}")
    if not isinstance(direct, bool):
        raise TypeError(f"direct must be a bool, not {type(direct).__name__}")
    if not isinstance(force_pread, bool):
        raise TypeError(f"force_pread must be a bool, not {type(force_pread).__name__}")
    if not isinstance(trust_unchanged, bool):
        raise TypeError(f"trust_unchanged must be a bool, not {type(trust_unchanged).__name__}")
    kw = dict(verify=_VERIFY[verify], direct=direct, force_pread=force_pread,
              trust_unchanged=trust_unchanged)
    if cache_dir is not None:
        kw["cache_dir"] = _fspath(cache_dir, "cache_dir")
    if cache_bytes is not None:
        if isinstance(cache_bytes, str):
            kw["cache_bytes"] = parse_size(cache_bytes, "cache_bytes")
        else:  # 0 goes to the library, which refuses it (InvalidArgumentError)
            cb = _opt_int(cache_bytes, "cache_bytes")
            if cb > _SIZE_MAX:
                raise ValueError(f"cache_bytes {cb} is too large (at most 2**64 - 1 bytes)")
            kw["cache_bytes"] = cb
    size = parse_size(pool, "pool")
    if size is not None:
        kw["pool"] = size
    qd = _opt_int(queue_depth, "queue_depth", 1)
    if qd is not None:
        if qd > 0xFFFFFFFF:
            raise ValueError("queue_depth too large")
        kw["queue_depth"] = qd
    ch = parse_size(chunk, "chunk")
    if ch is not None:
        kw["chunk"] = ch
    ht = _opt_int(hash_threads, "hash_threads", 0)
    if ht is not None:
        kw["hash_threads"] = min(ht, 1 << 20)
    it = _opt_int(io_threads, "io_threads", 0)
    if it is not None:
        kw["io_threads"] = min(it, 1 << 20)
    keys = _path_list(trusted_keys, "trusted_keys", "a trusted key")
    if keys:
        kw["trusted_keys"] = keys
    cas = _path_list(trusted_cas, "trusted_cas", "a trusted CA")
    if cas:
        kw["trusted_cas"] = cas
    if signature_path is not None:
        kw["signature_path"] = _fspath(signature_path, "signature_path")
    remote = _remote_options(fallback, http_token, s3_endpoint, s3_region, s3_addressing,
                             remote_connections, remote_attempts, remote_deadline,
                             remote_ca_file, http_proxy, proxy_kind)
    if remote:
        kw["remote"] = remote
    core = _sluice.open(p, mf, **kw)
    model = Model(core, _os.fsdecode(p))
    try:
        _warn_if_unverified(model)
    except BaseException:  # the warning made an error by the caller's filter
        model.close()
        raise
    return model


_VERIFY_STATES = {0: "verified", 1: "no_manifest", 2: "off", 3: "publisher_digest"}

# Set while this thread reopens a model it opened (and warned of) already,
# so that one load warns once (safe_open's reopen with a larger pool).
import threading as _threading  # noqa: E402
_reopening = _threading.local()


def _reopen(path, **open_args):
    """sluice.open of a model this thread opened a moment ago for the same
    load: no second UnverifiedWarning."""
    _reopening.active = True
    try:
        return open(path, **open_args)
    finally:
        _reopening.active = False


def _warn_if_unverified(model):
    """UnverifiedWarning when the model has nothing to be checked against,
    attributed to the first caller outside this package (safe_open,
    load_file and the rest open through here)."""
    if getattr(_reopening, "active", False):
        return
    state, where = model._m.verify_state()
    if _VERIFY_STATES.get(state) != "no_manifest":
        return
    import sys
    import warnings
    level, frame = 1, sys._getframe(0)
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == __name__:
        frame, level = frame.f_back, level + 1
    # where, not model.path: it is shown without credentials or query
    warnings.warn(f"no manifest for this model (looked for {where}): its tensors load "
                  "unverified; write one with `sluice manifest` or pass manifest=",
                  UnverifiedWarning, stacklevel=level)


def _path_list(value, name, what):
    """A list of paths given as a list (one path is a mistake), or None."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, _os.PathLike)):
        raise TypeError(f"{name} must be a list of paths, not one path")
    try:
        return [_fspath(k, what) for k in value]
    except TypeError as e:
        if what in str(e):
            raise
        raise TypeError(f"{name} must be a list of paths, not {type(value).__name__}") from None


_S3_ADDRESSING = {"path": 0, "virtual": 1}
_PROXY_KINDS = {"plain": 0, "dragonfly": 1}


def _remote_options(fallback, http_token, s3_endpoint, s3_region, s3_addressing,
                    remote_connections, remote_attempts, remote_deadline, remote_ca_file,
                    http_proxy=None, proxy_kind=None):
    """The remote options of open as the C layer's dict (C names), None
    left out (the library's default)."""
    r = {}
    if fallback is not None:
        if isinstance(fallback, (str, bytes, _os.PathLike)):
            raise TypeError("fallback must be a list of locations, not one location")
        r["fallback"] = [_fspath(f, "a fallback location") for f in fallback]
        for f in r["fallback"]:
            _features.require_for_location(f)
    for key, value in (("http_token", http_token), ("s3_endpoint", s3_endpoint),
                       ("s3_region", s3_region), ("remote_ca_file", remote_ca_file),
                       ("http_proxy", http_proxy)):
        if value is not None:
            r[key] = _fspath(value, key)
    if s3_addressing is not None:
        if s3_addressing not in _S3_ADDRESSING:
            raise ValueError(f"s3_addressing must be 'path' or 'virtual', not {s3_addressing!r}")
        r["s3_addressing"] = _S3_ADDRESSING[s3_addressing]
    if proxy_kind is not None:
        if proxy_kind not in _PROXY_KINDS:
            raise ValueError(f"proxy_kind must be 'plain' or 'dragonfly', not {proxy_kind!r}")
        r["proxy_kind"] = _PROXY_KINDS[proxy_kind]
    for key, value in (("remote_connections", remote_connections),
                       ("remote_attempts", remote_attempts)):
        v = _opt_int(value, key, 1)
        if v is not None:
            r[key] = v
    if remote_deadline is not None:
        if isinstance(remote_deadline, bool) or not isinstance(remote_deadline, (int, float)):
            raise TypeError(f"remote_deadline must be seconds (int or float), "
                            f"not {type(remote_deadline).__name__}")
        ms = round(remote_deadline * 1000)
        if not 0 < ms <= 0xFFFFFFFF:
            raise ValueError(f"remote_deadline must be in (0, 4294967] seconds, "
                             f"not {remote_deadline}")
        r["remote_deadline_ms"] = ms
    return r


def handle_of(array):
    """The sluice handle under an array made by sluice (NumPy or torch
    via NumPy's base chain), or None. For tests and debugging."""
    base = array
    for _ in range(16):
        if isinstance(base, _sluice.Handle):
            return base
        if isinstance(base, memoryview):
            base = base.obj
            continue
        nxt = getattr(base, "base", None)
        if nxt is None:
            return None
        base = nxt
    return None


from ._safe_open import safe_open, load_file  # noqa: E402
from . import _features  # noqa: E402
from ._features import features  # noqa: E402
from ._metrics import MetricsServer, serve_metrics  # noqa: E402
from ._cache import Cache, CacheEntry  # noqa: E402
from ._manifest import write_manifest  # noqa: E402
