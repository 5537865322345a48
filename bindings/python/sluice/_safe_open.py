"""safe_open and load_file: drop-ins for the safetensors package's.

    from sluice import safe_open            # was: from safetensors import safe_open
    with safe_open("model.safetensors", framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)

What it matches of the reference (safetensors' Python API, where it
reads): safe_open(filename, framework, device="cpu") as a context manager;
keys() (sorted), offset_keys() (in the order of the data in the files),
metadata() (the __metadata__ dict of str, or None when the header has none
or null), get_tensor(name), get_tensors(), get_slice(name) with
get_shape() (a list of int), get_dtype() (the header's spelling: "F32",
"BF16", "F8_E4M3", ...) and indexing by ..., ints, slices (any step,
negative bounds) and tuples of those. framework: "pt", "torch",
"pytorch", "np", "numpy"; the reference's others ("tf", "flax", "jax",
"mlx", "paddle", ...) raise NotImplementedError. device: "cpu"; with
framework="pt" any device torch knows (the tensor is moved, a copy).

Differences from the reference, all on the safe side:
 - path may also be a directory or a *.safetensors.index.json, and the
   keyword arguments of sluice.open are taken (manifest=, verify=, cache
   and remote options; pool= fixes the pool instead of the sizing below);
 - tensors are verified when a manifest is in play (the sidecar or
   manifest=...), and are zero-copy read-only views of the verified bytes
   (NumPy); torch tensors are writable, zero copy where no other reader
   holds the buffer, and a write into one reaches no other reader (see
   "Writing into tensors" in the README);
 - a dtype the framework cannot represent (BF16, F8_* in NumPy without
   ml_dtypes; F8_* in torch before 2.1) raises NotImplementedError naming
   the tensor instead of giving its bits as integers, unless raw=True;
 - the pool is sized to hold every tensor of the model at once (callers of
   safe_open usually keep them all), so keeping them never fails; in a
   container whose cgroup memory limit is below that size the open fails
   instead (InvalidArgumentError, both numbers);
 - get_slice: see Slice for what is read and what is verified; index forms
   it does not take (lists, arrays, nested tuples, ranges, None, bools)
   raise NotImplementedError where the reference would index (pt) or
   fail; it never guesses.
"""

import operator

import numpy as np

from . import (open as _open, _reopen, _check_framework, _np_dtype, _np_dtype_checked, _PACKED,
               _sluice, _torch_dtype_named, _check_dtype)
from ._errors import InvalidArgumentError, PoolError

_SLACK = 64 << 20  # room for read-ahead beside every tensor held

# The reference's framework names that this package does not convert to.
_OTHER_FRAMEWORKS = ("tf", "tensorflow", "jax", "flax", "mlx", "paddle", "paddlepaddle")


def _open_for_all(path, held=None, **open_args):
    """Opens with a pool large enough to hold every tensor at once (or,
    with held, the bytes held(model) says the caller will hold at once:
    load_shard's parts), unless open_args names a pool. open_args: as
    sluice.open takes them."""
    if open_args.get("pool") is not None:
        return _open(path, **open_args)
    open_args.pop("pool", None)
    model = _open(path, **open_args)
    core = model._m
    total = (held(model) if held is not None
             else sum(core.info(i)[3] + 64 for i in range(core.count())))
    want = total + _SLACK
    # the default pool is the library's: 4 GiB, or 1/4 of a cgroup
    # memory limit, so it is compared with, not a fixed 4G (a pool above
    # the limit is refused by the reopen, with both numbers)
    if want > core.stats()["pool_bytes"]:
        model.close()
        model = _reopen(path, pool=want, **open_args)  # warned once, above
    return model


def _framework(framework):
    """"np" or "pt" for the reference's names of NumPy and torch."""
    if isinstance(framework, str):
        if framework == "pytorch":
            framework = "pt"
        elif framework in _OTHER_FRAMEWORKS:
            raise NotImplementedError(
                f"framework={framework!r}: sluice gives NumPy arrays ('np', 'numpy') and torch "
                "tensors ('pt', 'torch', 'pytorch') only; convert from NumPy")
    return _check_framework(framework)


def _torch_dtype_checked(dtype, name, raw=False):
    """The torch dtype sluice gives a safetensors dtype as; a dtype this
    torch cannot represent raises NotImplementedError naming the tensor
    (F8_* before torch 2.1 unless raw: its bits, uint8)."""
    return _torch_dtype_named(dtype, name, raw)


def _check_device(framework, device):
    if not isinstance(device, (str, int)) and type(device).__name__ != "device":
        raise TypeError(f"device must be a str, not {type(device).__name__}")
    if framework == "np" and device not in ("cpu", 0) and str(device) != "cpu":
        raise ValueError("framework='np' loads to device='cpu' only")


def _to_device(t, framework, device):
    if framework == "pt" and str(device) != "cpu":
        return t.to(device)
    return t


class safe_open:
    """safe_open(path, framework="np"|"pt", device="cpu", *, backend="mmap",
    raw=False, **open_args): the reference's safe_open, on sluice. backend:
    the reference's choice of "mmap" or "pread", taken and checked; both
    read through the library here. raw: a dtype the framework cannot
    represent (BF16, F8_* in NumPy without ml_dtypes; F8_* in torch before
    2.1) raises NotImplementedError naming the tensor unless raw=True,
    which gives its bits (uint16, uint8), for get_tensor and get_slice
    alike. open_args: the keyword arguments of sluice.open (manifest=,
    verify=, trusted_keys=, cache_dir=, and the remote options fallback=,
    http_token=, s3_endpoint=, ...)."""

    def __init__(self, path, framework="np", device="cpu", *, backend="mmap", raw=False,
                 **open_args):
        if not isinstance(raw, bool):
            raise TypeError(f"raw must be a bool, not {type(raw).__name__}")
        self._raw = raw
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a str, not {type(backend).__name__}")
        if backend not in ("mmap", "pread"):
            raise ValueError(f'backend {backend!r} is invalid (expected one of: "mmap", "pread")')
        self._framework = _framework(framework)
        _check_device(self._framework, device)
        self._device = device
        self._model = _open_for_all(path, **open_args)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        """Closes the file for new calls (tensors already given stay valid)."""
        self._model.close()

    @property
    def model(self):
        """The underlying sluice.Model."""
        return self._model

    def keys(self):
        """Tensor names, sorted (as the reference returns them)."""
        return sorted(self._model.keys())

    def offset_keys(self):
        """Tensor names in the order of their data in the files (shard by
        shard for a sharded model)."""
        return self._model.keys()

    def metadata(self):
        """__metadata__ as a dict of str, or None (absent or null); a
        sharded model's shards merged (see Model.metadata)."""
        return self._model.metadata()

    def get_tensor(self, name):
        t = self._model.get_tensor(name, framework=self._framework, raw=self._raw)
        return _to_device(t, self._framework, self._device)

    def get_tensors(self):
        """{name: tensor} of every tensor, in offset_keys() order."""
        return {k: self.get_tensor(k) for k in self.offset_keys()}

    def get_slice(self, name):
        return Slice(self, name)


# ------------------------------------------------------------ indices

_SUPPORTED = "..., ints, slices (any step) and tuples of those"


def _dim_index(x):
    """An int for an integer index, None for a slice or Ellipsis; raises
    for what is not taken."""
    if x is Ellipsis or isinstance(x, slice):
        return None
    if isinstance(x, (bool, np.bool_)):
        raise NotImplementedError(f"a boolean index is not supported by get_slice "
                                  f"(only {_SUPPORTED})")
    if isinstance(x, (int, np.integer)):
        return int(x)
    if x is None:
        raise NotImplementedError(f"None (np.newaxis) is not supported by get_slice "
                                  f"(only {_SUPPORTED}): add the axis to the result")
    # Sequences and arrays are NumPy's advanced indices (a tuple or a range
    # inside the index too); checked before __index__, which 0-d arrays and
    # tensors also have.
    if (isinstance(x, (list, tuple, range, np.ndarray)) or type(x).__name__ == "Tensor"
            or (not isinstance(x, np.generic)
                and (hasattr(x, "__array__") or hasattr(x, "__array_interface__")))):
        raise NotImplementedError(f"advanced (array or list) indexing is not supported by "
                                  f"get_slice (only {_SUPPORTED}): index the result")
    if hasattr(type(x), "__index__"):  # an integer by the index protocol, as NumPy takes it
        return operator.index(x)
    raise IndexError(f"only integers, slices (`:`) and ellipsis (`...`) are valid indices "
                     f"for get_slice, not {type(x).__name__}")


def normalize_index(idx, shape):
    """(ranges, dropped) for a basic index of a tensor of this shape, as
    NumPy reads it: one range per dimension (Python's slice.indices
    resolution of every bound and step, an int as a range of one), and for
    each dimension whether an int indexed it (it leaves the result).
    Raises IndexError as NumPy does (out of bounds, too many indices, two
    ellipses), ValueError for a zero step, NotImplementedError for forms
    get_slice does not take."""
    if isinstance(idx, list):
        raise NotImplementedError(f"a list index is not supported by get_slice "
                                  f"(only {_SUPPORTED}; write a tuple)")
    key = idx if isinstance(idx, tuple) else (idx,)
    ints = [_dim_index(x) for x in key]
    n_ell = sum(1 for x in key if x is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    ndim = len(shape)
    used = len(key) - n_ell
    if used > ndim:
        raise IndexError(f"too many indices for tensor: tensor is {ndim}-dimensional, "
                         f"but {used} were indexed")
    full = []
    for x, i in zip(key, ints):
        if x is Ellipsis:
            full.extend([(slice(None), None)] * (ndim - used))
        else:
            full.append((x, i))
    full.extend([(slice(None), None)] * (ndim - len(full)))
    ranges, dropped = [], []
    for d, ((x, i), n) in enumerate(zip(full, shape)):
        if i is None:
            ranges.append(range(*x.indices(n)))
            dropped.append(False)
        else:
            j = i + n if i < 0 else i
            if not 0 <= j < n:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {n}")
            ranges.append(range(j, j + 1))
            dropped.append(True)
    return ranges, tuple(dropped)


def _span(r):
    """[lo, hi): the indices from the first to the last of a non-empty
    range r, whatever its step's sign."""
    return min(r[0], r[-1]), max(r[0], r[-1]) + 1


def _local(r, shift=0):
    """The slice of range r (resolved) within an array whose first index is
    `shift`."""
    start, stop = r.start - shift, r.stop - shift
    return slice(start, None if stop < 0 else stop, r.step)


class Slice:
    """A lazily indexed tensor (safe_open.get_slice): get_shape(),
    get_dtype(), len(), and [index] for ..., ints, slices (any step,
    negative bounds) and tuples of those, with NumPy's meaning (an int
    removes its dimension). The result is a new array (a copy, writable),
    like the reference's; for framework="pt" a torch tensor. Packed dtypes
    (F4, F6_*) have no element type to slice: indexing them raises
    NotImplementedError (get_tensor gives their bytes).

    What is read and what is verified (`s.verified`, `s.chunked`). Every
    read goes through the library (local or remote files alike):
     - rows (a range along the first dimension, from the first to the
       last row the index selects) are read with sluice_read_into from
       the tensor's byte offset of the first row: only those rows' bytes
       when nothing checks the tensor (no manifest, verify="off", or
       "if_present" and the tensor not listed; NOT verified: there is
       nothing to verify them against), only the chunks covering them,
       each verified before the rows are seen, when the manifest gives the
       tensor chunk digests (a version 2 manifest written with chunks,
       `sluice manifest --chunk`: a damaged chunk fails only the slices
       whose rows it covers, ChecksumError). Nothing is kept in the pool;
     - the manifest checks this tensor with a whole-tensor digest only:
       the WHOLE tensor is acquired through the library and verified, and
       the rows are taken from it (no subset of its bytes can be verified
       alone). The verified buffer stays cached in the pool, so further
       slices of the same tensor cost no read. A tensor the pool cannot
       hold (pool= given) is read with sluice_read_into instead, which
       reads and verifies the whole tensor each time and keeps the rows.
    An index that selects whole rows, one after the other (an int or a
    step-1 slice on the first dimension, the others whole), is those rows;
    any other index (a step, a cut of a later dimension) goes through
    _read_part: a cut of one later dimension that is one of its equal
    parts (`[:, a:b]` with b - a dividing the dimension and a a multiple of
    it: a tensor-parallel shard) is read as sluice_read_part_into reads it
    (only its row segments; verified by part digests, else the library
    checks the whole tensor, counted in part_fallback_bytes); anything else
    reads the rows covering it as above and cuts the rest in memory.
    """

    def __init__(self, owner, name):
        self._owner = owner
        model = owner._model
        self._name = name
        self._index = model._index(name)
        t = model._m.info(self._index)
        self._dtype, self._shape, self._nbytes = t[1], tuple(t[2]), t[3]

    def get_shape(self):
        return list(self._shape)

    def get_dtype(self):
        return self._dtype

    @property
    def verified(self):
        """True when a slice of this tensor is verified (see the class)."""
        return self._owner._model._m.manifest_entry(self._index) is not None

    @property
    def chunked(self):
        """True when the manifest gives this tensor chunk digests: a slice
        then reads and verifies only the chunks covering its rows."""
        entry = self._owner._model._m.manifest_entry(self._index)
        return entry is not None and entry[1] is not None

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of a scalar tensor")
        return self._shape[0]

    def __getitem__(self, idx):
        if self._dtype in _PACKED:
            raise NotImplementedError(
                f"tensor {self._name!r} is {self._dtype}, a packed dtype (elements smaller than "
                "a byte): get_slice cannot index it; get_tensor gives its bytes")
        npd, _raw = _np_dtype(self._dtype)
        if npd.itemsize * 8 != _sluice.dtype_bits(self._dtype):
            # a dtype the library reads but this package has no element type
            # for (a newer one): slicing its bytes as another size would
            # give a wrong tensor
            raise NotImplementedError(
                f"tensor {self._name!r} is {self._dtype}, a dtype get_slice has no element type "
                "for; get_tensor or Model.get_range give its bytes")
        # before reading anything
        if self._owner._framework == "pt":
            _torch_dtype_checked(self._dtype, self._name, self._owner._raw)
        else:
            _np_dtype_checked(self._dtype, self._name, self._owner._raw)
        ranges, dropped = normalize_index(idx, self._shape)
        out_shape = tuple(len(r) for r, d in zip(ranges, dropped) if not d)
        if any(len(r) == 0 for r in ranges):
            out = np.empty(out_shape, dtype=npd)  # nothing selected: nothing read
        elif not ranges:  # a scalar tensor: its one element
            block, owned = self._read_rows(0, 1)
            out = block.reshape(()) if owned else block.reshape(()).copy()
        elif self._is_rows(ranges):
            block, owned = self._read_rows(*_span(ranges[0]))
            out = block.reshape(out_shape)
            if not owned:
                out = out.copy()
        else:
            out = self._read_part(ranges, dropped)
        return self._framework_array(out)

    def _is_rows(self, ranges):
        """True when the selection is rows one after the other, whole."""
        r0 = ranges[0]
        if r0.step != 1 and len(r0) != 1:
            return False
        return all(r == range(n) for r, n in zip(ranges[1:], self._shape[1:]))

    def _read_part(self, ranges, dropped):
        """The part of the tensor that ranges and dropped (normalize_index)
        select, any selection but whole rows one after the other, as a new
        C-contiguous NumPy array of the result's shape.

        The one place that reads a part other than rows: today it reads the
        rows from the first to the last selected along dimension 0 (through
        _read_rows: only their bytes, or their chunks, or the verified
        whole tensor) and cuts the other dimensions in memory. A read of
        only the part's bytes (a library call for strided ranges) replaces
        this function alone."""
        part = self._as_part(ranges)
        if part is not None:
            dim, rank, world = part
            try:
                # raw: the bits; the dtype was checked by __getitem__
                arr = self._owner._model.get_part(self._name, dim, rank, world, framework="np",
                                                  raw=True)
            except (InvalidArgumentError, PoolError):
                # a world the library does not take, or no room in the pool
                # for the part (its buffer is the pool's): the rows below
                pass
            else:
                out_shape = tuple(len(r) for r, d in zip(ranges, dropped) if not d)
                return np.array(arr, copy=True, order="C").reshape(out_shape)
        lo, hi = _span(ranges[0])
        block, _owned = self._read_rows(lo, hi)
        key = []
        for d, (r, drop) in enumerate(zip(ranges, dropped)):
            shift = lo if d == 0 else 0
            key.append(r.start - shift if drop else _local(r, shift))
        return np.array(block[tuple(key)], copy=True, order="C")

    def _as_part(self, ranges):
        """(dim, rank, world) when the selection is one tensor-parallel part
        (sluice_read_part_into): a step-1 cut of one dimension d >= 1 whose
        length divides it and whose start is a multiple of that length,
        every other dimension whole. Such a part is read through the
        library: only its row segments (verified by the manifest's part
        digests when it has them; else the library checks the whole tensor
        and counts part_fallback_bytes). Else None."""
        cut = [d for d, (r, n) in enumerate(zip(ranges, self._shape)) if r != range(n)]
        if len(cut) != 1 or cut[0] == 0:
            return None
        d = cut[0]
        r, n = ranges[d], self._shape[d]
        length = len(r)
        if r.step != 1 and length != 1:
            return None
        if length == 0 or n % length or r.start % length:
            return None
        world = n // length
        if world > 65536:
            return None
        return d, r.start // length, world

    def _read_rows(self, lo, hi):
        """Rows [lo, hi) of the tensor (for a scalar tensor, (0, 1): its
        element) as a NumPy array of shape (hi - lo,) + shape[1:], and
        whether the caller owns it (True: a new buffer; False: a read-only
        view of the library's verified buffer, to be copied).

        Read and verified as the class says: sluice_read_into from the
        first row's byte offset (only those bytes, or only the chunks
        covering them), or, when only a whole-tensor digest checks the
        tensor, the verified whole tensor acquired through the pool."""
        npd, _raw = _np_dtype(self._dtype)
        rest = self._shape[1:]
        row_bytes = npd.itemsize
        for d in rest:
            row_bytes *= d
        shape = (hi - lo,) + rest if self._shape else ()
        if self.verified and not self.chunked:
            try:
                whole = self._owner._model.get_tensor(self._name, framework="np", raw=True)
                return (whole[lo:hi] if self._shape else whole), False
            except PoolError:
                pass  # larger than the pool (pool= given): read_into below
                # verifies the whole tensor too, through its bounce buffer
        n = (hi - lo) * row_bytes
        buf = np.empty(n, dtype=np.uint8)
        if n:
            self._owner._model.read_into(self._name, buf, lo * row_bytes)
        return buf.view(npd).reshape(shape), True

    def _framework_array(self, arr):
        owner = self._owner
        if owner._framework == "np":
            return arr
        from . import _load_torch
        torch = _load_torch()
        tdt = _torch_dtype_checked(self._dtype, self._name, owner._raw)
        shape = arr.shape
        if arr.size == 0:
            return _to_device(torch.empty(shape, dtype=tdt), owner._framework, owner._device)
        # Through the raw bytes: torch takes no ml_dtypes arrays and, before
        # 2.3, no uint16 ones; the bits are the same.
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        t = torch.from_numpy(raw).view(tdt).reshape(shape)
        return _to_device(t, owner._framework, owner._device)


def load_file(path, framework="np", device="cpu", *, raw=False, **open_args):
    """{name: tensor} of every tensor of path (a file, a directory or an
    index.json, local or remote), verified as safe_open verifies, zero copy (open_args as
    for sluice.open). raw: as for safe_open (a dtype the framework cannot
    represent raises before anything is read, unless raw=True)."""
    with safe_open(path, framework=framework, device=device, raw=raw, **open_args) as f:
        for k in f.offset_keys():  # every dtype checked before anything is read
            _check_dtype(f.model.info(k).dtype, k, f._framework, raw)
        return f.get_tensors()


__all__ = ["safe_open", "load_file", "Slice", "normalize_index"]
_ = _sluice  # the C layer is loaded by the package first
