"""safe_open and load_file: drop-ins for the safetensors package's.

    from sluice import safe_open            # was: from safetensors import safe_open
    with safe_open("model.safetensors", framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)

Differences from the reference, all on the safe side:
 - path may also be a directory or a *.safetensors.index.json;
 - tensors are verified when a manifest is in play (the sidecar or
   manifest=...), and are zero-copy read-only views of the verified bytes
   (torch: torch has no read-only tensors; do not write into them);
 - the pool is sized to hold every tensor of the model at once (callers of
   safe_open usually keep them all), so keeping them never fails; in a
   container whose cgroup memory limit is below that size the open fails
   instead (InvalidArgumentError, both numbers);
 - get_slice: see Slice for what is read and what is verified.
"""
import os

import numpy as np

from . import _errors
from . import open as _open, _check_framework, _np_dtype, _PACKED, _sluice

_SLACK = 64 << 20  # room for read-ahead beside every tensor held


def _open_for_all(path, manifest=None, verify="default", trusted_keys=None, **cache):
    """Opens with a pool large enough to hold every tensor at once. cache:
    cache_dir, cache_bytes, trust_unchanged, as sluice.open takes them."""
    model = _open(path, manifest=manifest, verify=verify, trusted_keys=trusted_keys, **cache)
    core = model._m
    total = sum(core.info(i)[3] + 64 for i in range(core.count()))
    want = total + _SLACK
    # the default pool is the library's: 4 GiB, or 1/4 of a cgroup
    # memory limit, so it is compared with, not a fixed 4G (a pool above
    # the limit is refused by the reopen, with both numbers)
    if want > core.stats()["pool_bytes"]:
        model.close()
        model = _open(path, manifest=manifest, verify=verify, pool=want,
                      trusted_keys=trusted_keys, **cache)
    return model


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
    """safe_open(path, framework="np"|"pt", device="cpu", *, manifest=None,
    verify="default", trusted_keys=None, cache_dir=None, cache_bytes=None,
    trust_unchanged=False, **remote): the reference's safe_open, on sluice (the
    keyword arguments as for sluice.open; remote: its remote options,
    fallback=, http_token=, s3_endpoint=, ...)."""

    def __init__(self, path, framework="np", device="cpu", *, manifest=None, verify="default",
                 trusted_keys=None, cache_dir=None, cache_bytes=None, trust_unchanged=False,
                 **remote):
        self._framework = _check_framework(framework)
        _check_device(self._framework, device)
        self._device = device
        self._model = _open_for_all(path, manifest=manifest, verify=verify,
                                    trusted_keys=trusted_keys, cache_dir=cache_dir,
                                    cache_bytes=cache_bytes, trust_unchanged=trust_unchanged,
                                    **remote)

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
        """Tensor names in the order of their data in the files."""
        return self._model.keys()

    def metadata(self):
        """__metadata__ as a dict of str, or None."""
        return self._model.metadata()

    def get_tensor(self, name):
        t = self._model.get_tensor(name, framework=self._framework)
        return _to_device(t, self._framework, self._device)

    def get_slice(self, name):
        return Slice(self, name)


class Slice:
    """A lazily indexed tensor (safe_open.get_slice). Indexing with ints,
    slices (any step) and Ellipsis selects rows of the FIRST dimension
    through the file; further dimensions are then cut from those rows.

    What is read and what is verified (`s.verified`, `s.chunked`):
     - the manifest checks this tensor AND gives it chunk digests (a
       version 2 manifest written with chunks, `sluice manifest --chunk`):
       only the bytes from the first to the last row selected are read
       through the library (sluice_read_into), which reads and verifies
       exactly the chunks covering them, before the rows are seen. A
       damaged chunk fails only the slices whose rows it covers
       (ChecksumError). Nothing is kept in the pool.
     - the manifest checks this tensor with a whole-tensor digest only:
       the WHOLE tensor is acquired through the library and verified, and
       the rows are copied out of it (no subset of its bytes can be
       verified alone). The verified buffer stays cached in the pool, so
       further slices of the same tensor cost no read.
     - nothing checks this tensor (no manifest, verify="off", or
       "if_present" and the tensor not listed): only the bytes of the rows
       asked for (from the first to the last row selected) are read, with
       pread on the file, and are NOT verified: there is nothing to verify
       them against.
     - packed dtypes (F4, F6_*) and indices other than ints, slices and
       Ellipsis on the first dimension: the whole tensor, as in the
       second case (also for a chunked tensor).
    The result is a new array (a copy), like the reference's.
    """

    def __init__(self, owner, name):
        self._owner = owner
        model = owner._model
        self._name = name
        self._index = model._index(name)
        t = model._m.info(self._index)
        self._dtype, self._shape, self._nbytes = t[1], t[2], t[3]
        self._file, self._offset = t[4], t[5]

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
        framework = self._owner._framework
        key = idx if isinstance(idx, tuple) else (idx,)
        if self._dtype in _PACKED or not self._shape or not key:
            return self._whole(idx)
        if self.verified:
            if not self.chunked:
                return self._whole(idx)
            read_rows = self._read_rows_verified
        else:
            read_rows = self._read_rows
        first, rest = key[0], key[1:]
        if first is Ellipsis:
            if Ellipsis in rest:
                raise IndexError("an index can only have a single ellipsis ('...')")
            first, rest = slice(None), (Ellipsis,) + rest
        rows = self._shape[0]
        if isinstance(first, (int, np.integer)) and not isinstance(first, bool):
            r = int(first)
            if r < 0:
                r += rows
            if not 0 <= r < rows:
                raise IndexError(f"index {int(first)} is out of bounds for dimension 0 "
                                 f"with size {rows}")
            block = read_rows(r, r + 1)
            out = block[(0,) + rest]
        elif isinstance(first, slice):
            sel = range(*first.indices(rows))
            if len(sel) == 0:
                block = read_rows(0, 0)
                out = block[(slice(None),) + rest]
            else:
                lo, hi = min(sel[0], sel[-1]), max(sel[0], sel[-1]) + 1
                block = read_rows(lo, hi)
                local = slice(sel.start - lo, None if sel.stop - lo < 0 else sel.stop - lo,
                              sel.step)
                out = block[(local,) + rest]
        else:
            return self._whole(idx)
        out = np.array(out, copy=True)
        return self._framework_array(out)

    def _whole(self, idx):
        t = self._owner._model.get_tensor(self._name, framework=self._owner._framework)
        out = t[idx]
        if self._owner._framework == "np":
            out = np.array(out, copy=True)
        else:
            out = out.clone()
        return _to_device_owner(self._owner, out)

    def _row_layout(self, lo, hi):
        npd, _raw = _np_dtype(self._dtype)
        row_elems = 1
        for d in self._shape[1:]:
            row_elems *= d
        row_bytes = row_elems * npd.itemsize
        return npd, row_bytes, (hi - lo) * row_bytes

    def _read_rows_verified(self, lo, hi):
        """Rows [lo, hi) of the tensor, read and verified by the library:
        only the chunks covering them (sluice_read_into)."""
        npd, row_bytes, n = self._row_layout(lo, hi)
        buf = np.empty(n, dtype=np.uint8)
        if n:
            self._owner._model.read_into(self._name, buf, lo * row_bytes)
        return buf.view(npd).reshape((hi - lo,) + tuple(self._shape[1:]))

    def _read_rows(self, lo, hi):
        """Rows [lo, hi) of the tensor, read from its file (not verified)."""
        npd, row_bytes, n = self._row_layout(lo, hi)
        buf = np.empty(n, dtype=np.uint8)
        if n:
            fd = os.open(self._file, os.O_RDONLY | os.O_CLOEXEC)
            try:
                done = 0
                view = memoryview(buf)
                while done < n:
                    got = os.preadv(fd, [view[done:]], self._offset + lo * row_bytes + done)
                    if got == 0:
                        raise _errors.FileChangedError(
                            _errors.E_FILE_CHANGED,
                            f"{self._file}: tensor {self._name!r} ends past the end of "
                            "the file (it shrank after open)", self._name)
                    done += got
            finally:
                os.close(fd)
        return buf.view(npd).reshape((hi - lo,) + tuple(self._shape[1:]))

    def _framework_array(self, arr):
        if self._owner._framework == "np":
            return arr
        from . import _torch_dtype, _load_torch
        torch = _load_torch()
        tdt = _torch_dtype(self._dtype)
        if arr.dtype == np.uint16:  # torch 1.13 takes no uint16 arrays: same bits
            arr = arr.view(np.int16)
        t = torch.from_numpy(arr)
        if t.dtype != tdt:  # a raw view (BF16 as uint16): reinterpret the bits
            t = t.view(tdt)
        return _to_device_owner(self._owner, t)


def _to_device_owner(owner, t):
    return _to_device(t, owner._framework, owner._device)


def load_file(path, framework="np", device="cpu", *, manifest=None, verify="default",
              trusted_keys=None, cache_dir=None, cache_bytes=None, trust_unchanged=False,
              **remote):
    """{name: tensor} of every tensor of path (a file, a directory or an
    index.json, local or remote), verified as safe_open verifies, zero copy
    (the keyword arguments as for sluice.open)."""
    with safe_open(path, framework=framework, device=device, manifest=manifest,
                   verify=verify, trusted_keys=trusted_keys, cache_dir=cache_dir,
                   cache_bytes=cache_bytes, trust_unchanged=trust_unchanged, **remote) as f:
        return {k: f.get_tensor(k) for k in f.offset_keys()}


__all__ = ["safe_open", "load_file", "Slice"]
_ = _sluice  # the C layer is loaded by the package first
