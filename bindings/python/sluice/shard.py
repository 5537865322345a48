"""Tensor-parallel shards: one rank's part of every tensor of a model.

load_shard(path, rank, world, rules=None, framework="pt", *, raw=False, **open_args)
    A dict name -> tensor of what rank `rank` of `world` keeps: each tensor
    the rules split is its part along the rules' dim (Model.get_part: only
    the part's bytes are read when the manifest has part digests), every
    other tensor whole (replicated). Each value is a read-only view over a
    buffer of the pool that the library's handle holds: no copy; the model
    is opened with a pool that holds the whole shard at once (unless
    open_args gives pool=). `rules` is None (the
    built-in Llama/Qwen/Mistral set), the text of a rules file (lines
    `PATTERN DIM` or `PATTERN replicated`, fnmatch globs, the first match
    wins), a path to one (a str naming an existing file, or an
    os.PathLike), or a list of (pattern, dim-or-None) pairs. A dtype the
    framework cannot represent (BF16 and F8_* in NumPy without ml_dtypes,
    F8_* before torch 2.1) raises NotImplementedError naming the tensor
    and dtype before anything is read, unless raw=True: then its bits
    (as Model.get_tensor's raw). See docs/parallel.md.
"""
import os

import sluice
from . import _sluice

__all__ = ["load_shard", "part_dims"]


def _rules_text(rules):
    if rules is None:
        return None
    if isinstance(rules, os.PathLike) or (isinstance(rules, str) and "\n" not in rules
                                          and os.path.isfile(rules)):
        with open(rules, encoding="utf-8") as f:
            return f.read()
    if isinstance(rules, str):
        return rules
    lines = []
    for pattern, dim in rules:
        if any(c in str(pattern) for c in " \t\n#"):
            raise ValueError(f"rule pattern {pattern!r} holds a space, a tab, a newline or '#'")
        lines.append(f"{pattern} {'replicated' if dim is None else int(dim)}")
    return "\n".join(lines) + "\n"


def part_dims(model, rules=None):
    """{name: dim or None (replicated)} of every tensor of an open Model
    under the rules (the library's matching: sluice_part_rules_dim)."""
    names = model.keys()
    infos = [model.info(n) for n in names]
    dims = _sluice.part_dims(_rules_text(rules), [(n, len(t.shape)) for n, t in zip(names, infos)])
    return {n: (None if d < 0 else d) for n, d in zip(names, dims)}


def _shard_bytes(model, rules, world):
    """The pool bytes one rank's shard holds at once: each split tensor's
    part (nbytes / world), each other tensor whole, 64-byte aligned."""
    total = 0
    for name, dim in part_dims(model, rules).items():
        nbytes = model.info(name).nbytes
        total += (nbytes // world if dim is not None else nbytes) + 64
    return total


def load_shard(path, rank, world, rules=None, framework="pt", *, raw=False, **open_args):
    if not isinstance(raw, bool):
        raise TypeError(f"raw must be a bool, not {type(raw).__name__}")
    # every value is over a buffer of the pool, all held at once: a pool
    # that holds the shard, unless open_args names one (as safe_open)
    from ._safe_open import _open_for_all
    model = _open_for_all(path, held=lambda m: _shard_bytes(m, rules, world), **open_args)
    try:
        dims = part_dims(model, rules)
        for name in dims:  # every dtype before any byte is read
            sluice._check_dtype(model.info(name).dtype, name, framework, raw)
        out = {}
        for name, dim in dims.items():
            if dim is None:
                out[name] = model.get_tensor(name, framework=framework, raw=raw)
            else:
                out[name] = model.get_part(name, dim, rank, world, framework=framework, raw=raw)
        note = model.part_note()
        if note:
            import warnings
            warnings.warn(note, stacklevel=2)
        return out
    finally:
        model.close()
