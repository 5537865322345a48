"""sluice for torch modules: weights loaded on demand, or all at once.

lazy_load(module, path, budget="2G")
    Attaches a model to a module built with its parameters on the "meta"
    device (or empty): each submodule's own parameters and buffers are
    acquired (read, verified) just before its forward runs, and given back
    just after, so resident weight memory stays within the budget (the
    pool's size). The first forward call records the order submodules run
    in; from then on the library reads ahead along that order. When every
    weight fits in the budget, the weights are kept after first use (no
    re-read). Returns a LazyLoader; loader.detach() removes the hooks.

    Limits: a submodule's weights exist only during its own forward: code
    that reads another module's weight (tied embeddings read by a head,
    `self.child.weight` used by a parent) sees the meta placeholder. Run
    under torch.no_grad() / torch.inference_mode(): an autograd graph
    would hold the weights past the release.

load_state_dict(module, path, strict=True, copy=False)
    Fills a module from a model like Module.load_state_dict, without a
    copy where the module's tensor is on the meta device or on the CPU
    with the file's dtype: the parameter then IS the library's verified
    buffer, loaded with requires_grad=False (inference). To train, pass
    copy=True: every tensor is copied into the module's own memory and
    keeps its requires_grad. Either way no write reaches the library's
    buffers (see "Writing into tensors" in the README).

load_file(filename, device="cpu", **open_args)
    safetensors.torch.load_file's drop-in: {name: torch.Tensor} of every
    tensor (sluice.load_file with framework="pt").

iter_weights(path_or_url, names=None, **open_args)
    Yields (name, torch.Tensor) for every tensor (or those named), in the
    order their reads complete within the pool: the weight iterator that
    serving engines feed to model.load_weights. See its doc for what each
    tensor is and how long it lives.
"""
from collections import namedtuple

import torch

import sluice
from . import _errors, _load_torch, _wrap, parse_size
from ._safe_open import _open_for_all, _torch_dtype_checked, load_file as _load_file
from .shard import load_shard  # noqa: F401  (tensor-parallel: sluice/shard.py)

__all__ = ["lazy_load", "load_state_dict", "load_shard", "LazyLoader", "IncompatibleKeys",
           "iter_weights", "load_file"]

IncompatibleKeys = namedtuple("IncompatibleKeys", "missing_keys unexpected_keys")


def _entries(module):
    """(owner module, attribute, 'param'|'buffer', state_dict key, tensor)
    for every parameter and persistent buffer, each tensor once."""
    out = []
    seen = set()
    for prefix, mod in module.named_modules(remove_duplicate=True):
        for attr, p in mod._parameters.items():
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            out.append((mod, attr, "param", f"{prefix}.{attr}" if prefix else attr, p))
        for attr, b in mod._buffers.items():
            if b is None or attr in mod._non_persistent_buffers_set or id(b) in seen:
                continue
            seen.add(id(b))
            out.append((mod, attr, "buffer", f"{prefix}.{attr}" if prefix else attr, b))
    return out


def _set(mod, attr, kind, tensor, requires_grad=False):
    if kind == "param":
        mod._parameters[attr] = torch.nn.Parameter(tensor, requires_grad=requires_grad)
    else:
        mod._buffers[attr] = tensor


def _restore(mod, attr, kind, placeholder):
    (mod._parameters if kind == "param" else mod._buffers)[attr] = placeholder


def _check_shape(key, want, info):
    if tuple(want.shape) != tuple(info.shape):
        raise RuntimeError(f"size mismatch for {key}: the file has {list(info.shape)}, "
                           f"the module {list(want.shape)}")


def _check_module(module):
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, not {type(module).__name__}")


class LazyLoader:
    """The hooks lazy_load attached (see the module's doc)."""

    def __init__(self, module, path, budget, manifest, verify, strict):
        _check_module(module)
        self.budget = parse_size(budget, "budget")
        self.model = sluice.open(path, manifest=manifest, verify=verify, pool=self.budget)
        self.module = module
        groups = {}
        missing = []
        total = 0
        for mod, attr, kind, key, t in _entries(module):
            if key not in self.model:
                missing.append(key)
                continue
            info = self.model.info(key)
            _check_shape(key, t, info)
            total += info.nbytes
            groups.setdefault(mod, []).append((attr, kind, key, t))
        if missing and strict:
            self.model.close()
            raise RuntimeError(f"lazy_load: {len(missing)} tensors of the module are not in "
                               f"{path}: {missing[:5]}")
        self.missing_keys = missing
        self.total_bytes = total
        # Everything fits: keep each weight after its first use.
        self.resident = total <= self.budget
        self._groups = groups
        self._order = []          # submodules in execution order (learned)
        self._learning = True
        self._handles = []
        for mod in groups:
            self._handles.append(mod.register_forward_pre_hook(self._pre))
            self._handles.append(mod.register_forward_hook(self._post))
        self._handles.append(module.register_forward_pre_hook(self._root_pre))
        self._handles.append(module.register_forward_hook(self._root_post))
        self._loaded = set()
        self._depth = 0
        # Until the first call says otherwise, guess registration order.
        self.model.prefetch(self._names(groups))

    def _names(self, mods):
        return [key for m in mods for (_a, _k, key, _t) in self._groups[m]]

    def _root_pre(self, module, args):
        self._depth += 1

    def _root_post(self, module, args, output):
        self._depth -= 1
        if self._depth == 0 and self._learning:
            self._learning = False
            if not self.resident and self._order:
                self.model.prefetch(self._names(self._order))

    def _pre(self, mod, args):
        if self._learning and mod not in self._order:
            self._order.append(mod)
        if mod in self._loaded:
            return
        for attr, kind, key, want in self._groups[mod]:
            t = self.model.get_tensor(key, framework="pt")
            if t.dtype != want.dtype:
                t = t.to(want.dtype)  # a copy; the handle goes at once
            _set(mod, attr, kind, t)
        self._loaded.add(mod)

    def _post(self, mod, args, output):
        if self.resident:
            return
        for attr, kind, key, want in self._groups[mod]:
            _restore(mod, attr, kind, want)  # the placeholder back; the handle goes
        self._loaded.discard(mod)

    def detach(self):
        """Removes the hooks, puts the placeholders back and closes the model."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for mod in list(self._loaded):
            for attr, kind, key, want in self._groups[mod]:
                _restore(mod, attr, kind, want)
        self._loaded.clear()
        self.model.close()

    def stats(self):
        return self.model.stats()


def lazy_load(module, path, *, budget="2G", manifest=None, verify="default", strict=True):
    """Attach path's weights to module, loaded per submodule on demand
    within budget. Returns the LazyLoader."""
    return LazyLoader(module, path, budget, manifest, verify, strict)


def load_state_dict(module, path, strict=True, *, manifest=None, verify="default", copy=False):
    """Fills module from path (file, directory or index.json) like
    Module.load_state_dict; zero copy where the module's tensor is on the
    meta device, or on the CPU with the file's dtype (unless copy=True).
    A parameter bound zero copy is loaded with requires_grad=False: it is
    the library's verified buffer, for inference; an optimizer must not
    step it. copy=True (to train) copies every tensor into the module's
    own memory, requires_grad kept. Returns IncompatibleKeys(missing_keys,
    unexpected_keys); with strict, raises RuntimeError when either is
    non-empty, and NotImplementedError (naming the tensor) for a dtype
    torch cannot represent (F8_* before torch 2.1, U16/U32/U64 before 2.3)
    or a packed one (F4, F6_*): never its bits converted into values;
    both before changing anything."""
    _check_module(module)
    if not isinstance(strict, bool) or not isinstance(copy, bool):
        raise TypeError("strict and copy must be bool")
    model = _open_for_all(path, manifest=manifest, verify=verify)
    try:
        entries = _entries(module)
        keys = {e[3] for e in entries}
        file_keys = set(model.keys())
        missing = sorted(keys - file_keys)
        unexpected = sorted(file_keys - keys)
        if strict and (missing or unexpected):
            raise RuntimeError(f"Error(s) in loading state_dict for {type(module).__name__}: "
                               f"missing keys {missing[:10]}, unexpected keys {unexpected[:10]}")
        for mod, attr, kind, key, want in entries:
            if key in file_keys:
                info = model.info(key)
                _check_shape(key, want, info)
                _torch_dtype_checked(info.dtype, key)  # raw bits are never values
                if info.dtype in sluice._PACKED:
                    raise NotImplementedError(
                        f"tensor {key!r} is {info.dtype}, a packed dtype (elements smaller "
                        "than a byte): torch has no dtype for it; load_state_dict does not "
                        "convert its bytes into values")
        for mod, attr, kind, key, want in entries:
            if key not in file_keys:
                continue
            t = model.get_tensor(key, framework="pt")
            zero_copy = not copy and (want.device.type == "meta" or
                                      (want.device.type == "cpu" and want.dtype == t.dtype))
            if zero_copy:
                # the verified buffer itself: for inference, not for an optimizer
                _set(mod, attr, kind, t, requires_grad=False)
            elif want.device.type == "meta":
                _set(mod, attr, kind, t.to(want.dtype).clone(), requires_grad=want.requires_grad)
            else:
                with torch.no_grad():
                    want.copy_(t)
            del t
        return IncompatibleKeys(missing, unexpected)
    finally:
        model.close()  # deferred by the library while the tensors live


def load_file(filename, device="cpu", **open_args):
    """safetensors.torch.load_file(filename, device="cpu"), on sluice:
    {name: torch.Tensor} of every tensor, verified and zero copy as
    sluice.load_file(..., framework="pt") gives them (open_args as for
    sluice.open)."""
    return _load_file(filename, framework="pt", device=device, **open_args)


# ------------------------------------------------------------ iter_weights

# A tensor the pool has no room for (the caller holds earlier tensors, or a
# tight pool is full of the stream's read-ahead and the tensor being handed over), or
# larger than the pool: read into memory of its own instead (iter_weights).
_OWN_MEMORY_CODES = (_errors.E_POOL_EXHAUSTED, _errors.E_TOO_LARGE)


def _read_own(stream, index, info, raw):
    """The tensor read and verified by sluice_read_into into a new torch
    tensor (outside the pool: no room needed, no handle), through the
    running stream, which keeps the model open after a close() of a Model
    given (as for the tensors it delivers)."""
    name, dtype, shape, nbytes = info[0], info[1], info[2], info[3]
    tdt = _torch_dtype_checked(dtype, name, raw)
    buf = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes:
        try:
            stream.read_into(index, buf.numpy(), 0)
        except _errors.Error as e:
            e.name = name  # as a failure the stream delivers names it
            raise
    if dtype in sluice._PACKED:
        return buf
    if nbytes == 0:
        return torch.empty(shape, dtype=tdt)
    return buf.view(tdt).reshape(shape)


def iter_weights(path_or_url, names=None, *, raw=False, **open_args):
    """Yields (name, torch.Tensor) for every tensor of path_or_url (a file,
    a directory, an index.json, a remote location where this build reads
    them; or an open sluice.Model, which is left open), or for `names`
    (each as often as listed), in the order the library completes them
    (not file order): one sluice_stream, reading ahead within the pool
    while the caller works on the tensor it was given. open_args go to
    sluice.open unchanged (manifest=, verify=, pool=, cache_dir=, ...).
    A Model given may be closed during the loop: the stream keeps it open
    to its end, every tensor still comes.

    Each tensor is verified as get_tensor verifies (a manifest in play:
    ChecksumError), and is, where the pool allows, the library's buffer
    itself (zero copy). Lifetime: a tensor is valid for as long as it, or
    any view of it, is referenced, after the generator moves on and after
    it ends, the model closed or not: it holds its buffer, which the pool
    reuses only once the tensor is garbage-collected. So the pool bounds
    the memory only of tensors the caller drops (copied into a parameter
    and forgotten, as load_weights does). A tensor the pool has no room
    for (the caller still holds earlier ones, or a pool of a few tensors
    is full of the stream's read-ahead; or it is larger than the whole
    pool) is read into memory of its own instead of failing
    (sluice_read_into straight into a new tensor: the same verification,
    outside the pool, on the generator's thread), so keeping every tensor
    works with any pool, at the cost of that memory. torch has no read-only
    tensors: a tensor is writable, and a write into it reaches no other
    reader (the write guard of Model.get_tensor: a zero-copy tensor's
    buffer is served to no one else, and checked before it is served
    again).

    A tensor that fails (ChecksumError, ReadError, ...) raises at once
    (e.name is the tensor), and the stream stops; leaving the loop early
    (break, an exception, the generator closed) stops it too. Names
    unknown to the model raise NotFoundError, and dtypes this torch cannot
    represent (U16/U32/U64 before torch 2.3; F8_* before torch 2.1 unless
    raw=True, which gives their bits as uint8) NotImplementedError, before
    anything is read. BF16 and F8_* are torch's types where torch has
    them; packed dtypes (F4, F6_*) are their flat bytes (uint8), as
    get_tensor gives them.
    """
    if isinstance(path_or_url, sluice.Model):
        if open_args:
            raise TypeError("iter_weights: open arguments with an open Model: "
                            f"{sorted(open_args)}")
        model, own = path_or_url, False
    else:
        model, own = sluice.open(path_or_url, **open_args), True
    try:
        indices = model._indices(names)
        _load_torch()
        core = model._m
        for i in (range(core.count()) if indices is None else indices):
            t = core.info(i)
            _torch_dtype_checked(t[1], t[0], raw)
    except BaseException:
        if own:
            model.close()
        raise
    return _iter_stream(model, own, indices, raw)


def _iter_stream(model, own, indices, raw):
    # The stream starts at the first next(): a generator never started
    # reads nothing.
    stream = None
    read_own = False  # a tensor was read into its own memory
    try:
        stream = model._m.stream(indices)
        reread = sluice._stream_reread(stream)
        while True:
            item = stream.next_item()
            if item is None:
                break
            index, handle, code, message, info = item
            del item  # the tuple holds the handle: not kept while the next is taken
            if handle is not None:
                try:
                    tensor = _wrap(handle, info[1], info[2], "pt", info[0], raw, model._guard,
                                   index, reread)
                except _errors.Error as e:  # a private copy's read failed
                    e.name = info[0]
                    raise
                del handle
            elif code in _OWN_MEMORY_CODES:
                tensor = _read_own(stream, index, info, raw)
                read_own = True
            else:
                raise _errors.make_error(code, message, info[0])
            yield info[0], tensor
            del tensor
        code, message = stream.result()
        # the stream returns the first failed tensor's code: one read into
        # its own memory above; any other failure raised when delivered
        if code != 0 and not (read_own and code in _OWN_MEMORY_CODES):
            raise _errors.make_error(code, message)
    finally:
        if stream is not None:
            stream.close()  # an abandoned iterator stops the stream and joins it
        if own:
            model.close()  # deferred by the library while tensors live


from .torchscript import export_blocks, ScriptedModel, PlanError  # noqa: E402,F401  (compiled blocks)
