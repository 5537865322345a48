"""Compiled TorchScript blocks whose weights sluice loads on demand.

export_blocks(model, blocks, out_dir, example_inputs=None, method="script")
    Writes one TorchScript module per block (embedding, each decoder
    layer, final norm and head: what the caller lists) into out_dir,
    scripted (or traced) in eval mode, WITHOUT its weights: every
    parameter and persistent buffer is saved as a placeholder on the
    "meta" device (its dtype and shape, no bytes), to be bound at run
    time. Beside them, plan.json lists the blocks in execution order and,
    for each, the safetensors tensor every placeholder binds to, with its
    dtype and shape, and the SHA-256 of the block's file (the code is
    checked before it is loaded, as the weights are). The directory holds
    kilobytes of code and metadata, never the weights.

ScriptedModel(export_dir, weights, pool=...)
    Runs the blocks in order, each block's output the next one's input.
    Before a block runs, each of its tensors is acquired (read and
    verified) and bound to its parameter without a copy (the parameter's
    data pointer is the library's handle's); the rest of the plan is
    hinted to the library meanwhile, so the next block is read while this
    one runs; after it, its tensors are released, unless every weight fits
    in the pool (then they stay bound). A tensor that fails verification
    fails the call before its block runs (nothing after it runs either); a
    plan that names a tensor missing from the weights, or whose dtype or
    shape differs from the parameter's, fails at construction, before any
    block runs (PlanError, naming both).

This module imports sluice only when a ScriptedModel is made: export needs
torch alone (the C++ engine's test exports plans before the binding is
built).

Not frozen: torch.jit.freeze (and optimize_for_inference, which calls it)
folds the weights into the graph as constants, even those of nested
modules listed in preserved_attrs, which is what an export without weights
must not do. The blocks are scripted in eval mode under no_grad; the JIT
optimises each graph when it first runs (profiling executor).

The plan's format (version 1):

    {"format": "sluice-torchscript-plan", "version": 1, "torch": "1.13.1",
     "method": "script",
     "inputs": [{"dtype": "I64", "shape": [1, 12]}],      # example_inputs
     "blocks": [{"name": "model.layers.0", "file": "block-001.pt",
                 "sha256": "...",
                 "params": [{"name": "self_attn.q_proj.weight",
                             "tensor": "model.layers.0.self_attn.q_proj.weight",
                             "dtype": "BF16", "shape": [64, 64]}, ...]}, ...]}

"name" is the dotted attribute path inside the block module (a parameter
or a persistent buffer); "tensor" the name in the .safetensors files.
"""
import hashlib
import json
import os

import torch

__all__ = ["export_blocks", "ScriptedModel", "PlanError", "PLAN_FORMAT", "PLAN_VERSION"]

PLAN_FORMAT = "sluice-torchscript-plan"
PLAN_VERSION = 1
PLAN_FILE = "plan.json"

# torch dtypes by safetensors name (the ones a block's weights can have).
_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
    "I32": torch.int32, "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16,
    "F32": torch.float32, "F64": torch.float64,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class PlanError(ValueError):
    """A plan that cannot run: unreadable, a block file that is missing or
    differs from its digest, or a tensor that is missing from the weights
    or whose dtype or shape differs from the parameter's."""


def _dtype_name(dt):
    try:
        return _NAMES[dt]
    except KeyError:
        raise PlanError(f"dtype {dt} has no safetensors name in this plan format") from None


def _slots(module):
    """(dotted name, tensor) of every parameter and persistent buffer of a
    (script or eager) module, each slot once."""
    out = [(n, p) for n, p in module.named_parameters()]
    seen = {n for n, _ in out}
    if isinstance(module, torch.jit.ScriptModule):
        bufs = list(module.named_buffers())
    else:
        bufs = []
        for prefix, mod in module.named_modules():
            for attr, b in mod._buffers.items():
                if b is not None and attr not in mod._non_persistent_buffers_set:
                    bufs.append((f"{prefix}.{attr}" if prefix else attr, b))
    out += [(n, b) for n, b in bufs if n not in seen]
    return out


def _owner(module, dotted):
    *path, leaf = dotted.split(".")
    for p in path:
        module = getattr(module, p)
    return module, leaf


def _submodule(model, path):
    mod = model
    for p in path.split(".") if path else []:
        if not hasattr(mod, p):
            raise ValueError(f"export_blocks: {type(model).__name__} has no submodule {path!r}")
        mod = getattr(mod, p)
    if not isinstance(mod, torch.nn.Module):
        raise ValueError(f"export_blocks: {path!r} is not a torch.nn.Module")
    return mod


def _block_spec(model, item):
    """(name, module, {slot: tensor name}) from a str (a submodule's path:
    its slots bind to path.slot) or a (name, module, tensors) tuple, where
    tensors is a dict slot -> tensor name, a prefix str, or None."""
    if isinstance(item, str):
        mod = _submodule(model, item)
        return item, mod, {n: f"{item}.{n}" if item else n for n, _ in _slots(mod)}
    if isinstance(item, (tuple, list)) and len(item) == 3:
        name, mod, tensors = item
        if not isinstance(mod, torch.nn.Module):
            raise TypeError(f"export_blocks: block {name!r}: not a torch.nn.Module")
        slots = [n for n, _ in _slots(mod)]
        if tensors is None or isinstance(tensors, str):
            pre = tensors if tensors is not None else name
            return name, mod, {n: f"{pre}.{n}" if pre else n for n in slots}
        tensors = dict(tensors)
        extra = sorted(set(tensors) - set(slots))
        if extra:
            raise ValueError(f"export_blocks: block {name!r} has no parameter {extra[0]!r}")
        return name, mod, {n: tensors.get(n, f"{name}.{n}") for n in slots}
    raise TypeError("export_blocks: a block is a submodule path (str) or a "
                    "(name, module, tensors) tuple")


def _block_specs(model, blocks):
    """The specs (_block_spec) of an export's blocks, checked: model is a
    module, at least one block, no two of one name (sluice.onnx's export
    takes its blocks the same way)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    specs = [_block_spec(model, b) for b in blocks]
    if not specs:
        raise ValueError("export_blocks: no blocks")
    names = [s[0] for s in specs]
    if len(set(names)) != len(names):
        raise ValueError("export_blocks: two blocks have the same name")
    return specs


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def export_blocks(model, blocks, out_dir, example_inputs=None, *, method="script"):
    """Writes the blocks of model (see the module's doc) and plan.json into
    out_dir (made if missing). blocks: in execution order, each the path
    of a submodule of model ("model.layers.0"), or a tuple (name, module,
    tensors) for a block that is not one submodule (a tied head: a Linear
    whose "weight" binds to "model.embed_tokens.weight"). method "script"
    (torch.jit.script; the model may be on the meta device) or "trace"
    (torch.jit.trace along example_inputs, each block traced on the
    previous block's output: the model's weights must be real CPU
    tensors, any values). The model itself is not changed. Returns the
    plan (a dict)."""
    if method not in ("script", "trace"):
        raise ValueError(f"method must be 'script' or 'trace', not {method!r}")
    if method == "trace" and example_inputs is None:
        raise ValueError("method='trace' needs example_inputs")
    specs = _block_specs(model, blocks)
    os.makedirs(out_dir, exist_ok=True)
    inputs = example_inputs if isinstance(example_inputs, tuple) or example_inputs is None \
        else (example_inputs,)
    plan = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "torch": torch.__version__,
            "method": method, "blocks": []}
    if inputs is not None:
        plan["inputs"] = [{"dtype": _dtype_name(t.dtype), "shape": list(t.shape)}
                          for t in inputs if isinstance(t, torch.Tensor)]
    x = inputs
    with torch.no_grad():
        for i, (name, mod, tensors) in enumerate(specs):
            was_training = mod.training
            mod.eval()
            try:
                if method == "script":
                    sm = torch.jit.script(mod)
                else:
                    sm = torch.jit.trace(mod, x, check_trace=False)
                    out = mod(*x)
                    x = out if isinstance(out, tuple) else (out,)
            finally:
                mod.train(was_training)
            params = []
            for slot, t in _slots(sm):
                params.append({"name": slot, "tensor": tensors[slot],
                               "dtype": _dtype_name(t.dtype), "shape": list(t.shape)})
                owner, leaf = _owner(sm, slot)
                # The placeholder: dtype and shape, no bytes. Set on the
                # script module only (its own slots): the model keeps its own.
                setattr(owner, leaf, torch.empty(t.shape, dtype=t.dtype, device="meta"))
            fname = f"block-{i:03d}.pt"
            path = os.path.join(out_dir, fname)
            torch.jit.save(sm, path)
            plan["blocks"].append({"name": name, "file": fname, "sha256": _sha256_file(path),
                                   "params": params})
    tmp = os.path.join(out_dir, PLAN_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(plan, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out_dir, PLAN_FILE))
    return plan


def read_plan(export_dir):
    """The plan of an export directory, checked for form (not against any
    weights). Raises PlanError."""
    path = os.path.join(export_dir, PLAN_FILE)
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        raise PlanError(f"{path}: {e}") from e
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT:
        raise PlanError(f"{path}: not a {PLAN_FORMAT}")
    if plan.get("version") != PLAN_VERSION:
        raise PlanError(f"{path}: version {plan.get('version')!r}, this reader knows {PLAN_VERSION}")
    blocks = plan.get("blocks")
    if not isinstance(blocks, list) or not blocks:
        raise PlanError(f"{path}: no blocks")
    for b in blocks:
        ok = isinstance(b, dict) and isinstance(b.get("name"), str) and \
            isinstance(b.get("file"), str) and isinstance(b.get("params"), list)
        if not ok or os.path.basename(b["file"]) != b["file"]:
            raise PlanError(f"{path}: a block is not {{name, file, sha256, params}} "
                            f"(or its file is not in the directory)")
        for p in b["params"]:
            if not (isinstance(p, dict) and isinstance(p.get("name"), str) and
                    isinstance(p.get("tensor"), str) and p.get("dtype") in _DTYPES and
                    isinstance(p.get("shape"), list)):
                raise PlanError(f"{path}: block {b['name']!r}: a parameter is not "
                                f"{{name, tensor, dtype, shape}}")
    return plan


class ScriptedModel:
    """The blocks of an export directory, run with weights from sluice (see
    the module's doc). Call it with the first block's inputs; it returns
    the last block's output. blocks_run counts the blocks that ran (in
    the last call); close() releases everything."""

    def __init__(self, export_dir, weights, *, pool=None, manifest=None, verify="default",
                 resident=None, **open_kw):
        import sluice
        self._sluice = sluice
        self.export_dir = export_dir
        self.plan = read_plan(export_dir)
        self.blocks = []          # (name, script module, [(owner, leaf, tensor name, placeholder)])
        for b in self.plan["blocks"]:
            path = os.path.join(export_dir, b["file"])
            if not os.path.isfile(path):
                raise PlanError(f"block {b['name']!r}: {path} is missing")
            if b.get("sha256") is not None:
                got = _sha256_file(path)
                if got != b["sha256"]:
                    raise PlanError(f"block {b['name']!r}: {path} has SHA-256 {got}, "
                                    f"the plan says {b['sha256']}")
            mod = torch.jit.load(path)
            mod.eval()
            slots = dict(_slots(mod))
            binds = []
            for p in b["params"]:
                if p["name"] not in slots:
                    raise PlanError(f"block {b['name']!r}: the plan binds {p['name']!r} "
                                    f"(tensor {p['tensor']!r}), which the module does not have")
                ph = slots[p["name"]]
                if ph.dtype != _DTYPES[p["dtype"]] or list(ph.shape) != p["shape"]:
                    raise PlanError(f"block {b['name']!r}: parameter {p['name']!r} is "
                                    f"{_dtype_name(ph.dtype)} {list(ph.shape)}, the plan says "
                                    f"{p['dtype']} {p['shape']}")
                owner, leaf = _owner(mod, p["name"])
                binds.append((owner, leaf, p["tensor"], ph))
            self.blocks.append((b["name"], mod, binds))
        self.model = sluice.open(weights, manifest=manifest, verify=verify, pool=pool, **open_kw)
        try:
            self._check_weights()
        except BaseException:
            self.model.close()
            raise
        total = sum(self.model.info(t).nbytes for t in self._unique_tensors())
        self.total_bytes = total
        self.pool_bytes = self.model.stats()["pool_bytes"]
        self.resident = total <= self.pool_bytes if resident is None else bool(resident)
        self._bound = set()       # blocks whose weights are bound now
        self.blocks_run = 0

    def _unique_tensors(self):
        seen = []
        for _n, _m, binds in self.blocks:
            for _o, _l, t, _p in binds:
                if t not in seen:
                    seen.append(t)
        return seen

    def _check_weights(self):
        """Every tensor the plan names exists with the parameter's dtype
        and shape: checked here, before any block can run."""
        for name, _mod, binds in self.blocks:
            for _o, leaf, tensor, ph in binds:
                if tensor not in self.model:
                    raise PlanError(f"block {name!r}: parameter {leaf!r} binds to tensor "
                                    f"{tensor!r}, which is not in {self.model.path}")
                info = self.model.info(tensor)
                want = _dtype_name(ph.dtype)
                if info.dtype != want or list(info.shape) != list(ph.shape):
                    raise PlanError(f"block {name!r}: tensor {tensor!r} is {info.dtype} "
                                    f"{list(info.shape)} in the weights, the parameter it binds "
                                    f"to is {want} {list(ph.shape)}")

    def _names_from(self, i):
        return [t for _n, _m, binds in self.blocks[i:] for _o, _l, t, _p in binds]

    def _bind(self, i):
        name, _mod, binds = self.blocks[i]
        got = []
        try:
            for _o, _l, tensor, _p in binds:
                try:
                    got.append(self.model.get_tensor(tensor, framework="pt"))
                except self._sluice.Error as e:
                    raise self._sluice._errors.make_error(
                        e.code, f"block {name!r}: {e.message}", tensor) from e
        except BaseException:
            del got  # the handles go back; nothing was bound
            raise
        for (owner, leaf, _t, _p), t in zip(binds, got):
            setattr(owner, leaf, t)
        self._bound.add(i)

    def _unbind(self, i):
        for owner, leaf, _t, ph in self.blocks[i][2]:
            setattr(owner, leaf, ph)  # the placeholder back: the handle goes
        self._bound.discard(i)

    def __call__(self, *inputs):
        if self.model is None:
            raise self._sluice.ClosedError(self._sluice._errors.E_INVAL, "the model is closed")
        self.blocks_run = 0
        x = inputs
        with torch.no_grad():
            for i, (_name, mod, _binds) in enumerate(self.blocks):
                if i not in self._bound:
                    # The rest of the plan in order: what this acquire does
                    # not wait for (the next block on) is read ahead while
                    # this block runs, within the pool.
                    self.model.prefetch(self._names_from(i))
                    self._bind(i)
                try:
                    out = mod(*x)
                finally:
                    if not self.resident:
                        self._unbind(i)
                self.blocks_run += 1
                x = out if isinstance(out, tuple) else (out,)
        return x[0] if len(x) == 1 else x

    def bound(self, block):
        """{tensor name: the torch tensor bound now} of a block (by index
        or name): for tests and debugging (empty unless bound)."""
        i = block if isinstance(block, int) else [b[0] for b in self.blocks].index(block)
        if i not in self._bound:
            return {}
        return {t: getattr(owner, leaf) for owner, leaf, t, _p in self.blocks[i][2]}

    def stats(self):
        return self.model.stats()

    def close(self):
        if self.model is None:
            return
        for i in list(self._bound):
            self._unbind(i)
        self.model.close()
        self.model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
