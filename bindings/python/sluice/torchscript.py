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

Version 2 (written when parts or gather_rows is used; version 1 otherwise;
readers take both, and refuse these keys in a version 1 plan) adds,
optionally, for a pool smaller than a vocabulary-sized tensor:

    a parameter's "part": {"dim": 0, "n": 8}: the module's placeholder is
        part r of n of the tensor along dim ("shape" the part's: the
        tensor's with dim divided by n); every parameter of such a block
        is parted with one n, the block has one output and "join_axis": a
        (negative from the end, as torch.cat takes it): the block runs n
        times, part r bound at run r (Model.get_part, sluice_acquire_part:
        verified against the part's digest when the manifest has one),
        and the n outputs are joined along a in part order;
    a block's "gather": {"param": name}: the block's one parameter, 2-D
        and whole, is a table its code reads by rows of its first input
        (aten::embedding; the input used only as its indices and for its
        shape) and otherwise only element by element (its size unread):
        the
        engine binds as the table the rows of the distinct indices, in
        ascending order, read with Model.read_into / sluice_read_into
        (verified by the chunks that hold them when the manifest has chunk
        digests), and passes each index's position among them instead of
        the index, so the table never enters the pool.

docs/torchscript.md, "Version 2".
"""
import hashlib
import json
import os

import torch

__all__ = ["export_blocks", "ScriptedModel", "PlanError", "PLAN_FORMAT", "PLAN_VERSION"]

PLAN_FORMAT = "sluice-torchscript-plan"
PLAN_VERSION = 1          # written when no block is in parts or gathered
PLAN_VERSIONS = (1, 2)    # read
PLAN_FILE = "plan.json"
# Rows of a gathered table within this many bytes of each other are read
# as one range (each read verifies the chunks it touches).
GATHER_SPAN = 4 << 20

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


def _parts_arg(parts, specs):
    """export_blocks' parts= (here and in sluice.onnx), checked: a dict of
    block name to a count of parts, each name one of specs' blocks."""
    parts = dict(parts or {})
    unknown = set(parts) - {s[0] for s in specs}
    if unknown:
        raise ValueError(f"export_blocks: parts names no block: {sorted(unknown)}")
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in parts.values()):
        raise ValueError(f"export_blocks: parts must be counts, not {parts}")
    return parts


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


# What a gather block's first input may flow through and into: its
# positions among the distinct indices stand in for it, which is the same
# only where it selects rows of the table (aten::embedding's indices, and
# embedding_renorm_'s, which renormalizes those rows of the table it is
# given) or where only its shape counts.
_ROWS_KEEP = ("aten::contiguous",)
_ROWS_END = ("aten::embedding", "aten::embedding_renorm_")
_SHAPE_ONLY = ("aten::size", "aten::dim", "aten::len", "aten::numel", "prim::device",
               "prim::dtype", "prim::layout")
# What a gather block's table may flow through on its way to
# aten::embedding: element by element (the distinct rows stand in for the
# table: its row count, a sum over it, differ).
_ELEMENTWISE = ("aten::to", "aten::type_as", "aten::contiguous", "aten::detach", "aten::clone",
                "aten::nan_to_num", "aten::tanh", "aten::sigmoid", "aten::relu", "aten::abs",
                "aten::neg", "aten::exp", "aten::sqrt", "aten::rsqrt", "aten::mul", "aten::div",
                "aten::add", "aten::sub", "aten::clamp", "aten::clamp_min", "aten::clamp_max")


def _gather_graph(sm):
    """A script module's forward graph, inlined, constants propagated (the
    dead branches of F.embedding's padding_idx and max_norm gone); None
    when there is none."""
    try:
        g = sm.graph.copy()
        torch._C._jit_pass_inline(g)
        torch._C._jit_pass_constant_propagation(g)
        return g
    except (AttributeError, RuntimeError):
        return None


def _nodes(block):
    for n in block.nodes():
        yield n
        for b in n.blocks():
            yield from _nodes(b)


def _if_output(use):
    """The prim::If output a use by a branch's return gives, else None."""
    n = use.user
    owner = n.owningBlock().owningNode() if n.kind() == "prim::Return" else None
    if owner is not None and owner.kind() == "prim::If":
        return list(owner.outputs())[use.offset]
    return None


def _reads_rows_by_input(sm, slot):
    """Whether a script module's code (inlined, constants propagated,
    nested blocks too) reads the table `slot` by rows of its first input
    and by nothing else: the input (or what aten::contiguous and prim::If
    pass on of it) reaches aten::embedding as its indices, and is
    otherwise used only for its shape; the table (what element-by-element
    ops and prim::If make of it) reaches aten::embedding as its weight,
    and nothing else. Any other use of the input (a pad mask from the
    ids, ids + an offset, the ids returned) would see the positions among
    the distinct rows instead of the ids; of the table (its size, read by
    F.embedding's padding_idx check; a sum over it) the distinct rows
    instead of the table."""
    g = _gather_graph(sm)
    inputs = list(g.inputs()) if g is not None else []
    if len(inputs) < 2:
        return False
    todo, seen, found = [inputs[1]], set(), False
    while todo:
        v = todo.pop()
        if v.unique() in seen:
            continue
        seen.add(v.unique())
        for use in v.uses():
            n, kind = use.user, use.user.kind()
            if kind in _ROWS_END and use.offset == 1:
                found = found or kind == "aten::embedding"
            elif kind in _SHAPE_ONLY and use.offset == 0:
                pass
            elif kind in _ROWS_KEEP and use.offset == 0:
                todo.append(n.output())
            elif _if_output(use) is not None:
                todo.append(_if_output(use))
            else:
                return False
    if not found:
        return False
    leaf = slot.split(".")[-1]
    todo = [n.output() for n in _nodes(g) if n.kind() == "prim::GetAttr" and n.s("name") == leaf
            and n.output().type().kind() == "TensorType"]
    seen, found = set(), False
    while todo:
        v = todo.pop()
        if v.unique() in seen:
            continue
        seen.add(v.unique())
        for use in v.uses():
            n, kind = use.user, use.user.kind()
            if kind == "aten::embedding" and use.offset == 0:
                found = True
            elif kind in _ELEMENTWISE:
                todo.extend(n.outputs())
            elif _if_output(use) is not None:
                todo.append(_if_output(use))
            else:
                return False
    return found


def _gather_slot(sm):
    """The slot of a block that can be read by rows: one slot, 2-D, and
    code that reads it by rows of its first input alone (_reads_rows_by_input);
    else None."""
    slots = _slots(sm)
    if len(slots) == 1 and slots[0][1].dim() == 2 and _reads_rows_by_input(sm, slots[0][0]):
        return slots[0][0]
    return None


def export_blocks(model, blocks, out_dir, example_inputs=None, *, method="script", parts=None,
                  gather_rows=False):
    """Writes the blocks of model (see the module's doc) and plan.json into
    out_dir (made if missing). blocks: in execution order, each the path
    of a submodule of model ("model.layers.0"), or a tuple (name, module,
    tensors) for a block that is not one submodule (a tied head: a Linear
    whose "weight" binds to "model.embed_tokens.weight"). method "script"
    (torch.jit.script; the model may be on the meta device) or "trace"
    (torch.jit.trace along example_inputs, each block traced on the
    previous block's output: the model's weights must be real CPU
    tensors, any values). parts: {block name: n}: every parameter of that
    block is saved as its part along dim 0 ([shape[0] / n, ...]: a tied
    head's [V, D] weight, a head's bias), the block's one output joined on
    its last axis (plan version 2; ValueError for a block with no
    parameter, or one n does not divide along dim 0). gather_rows: each block of one 2-D
    parameter whose code uses its first input only as aten::embedding's
    indices and for its shape, and the parameter only as its weight
    through element-by-element ops (an embedding) is marked
    "gather" (plan version 2): an engine reads the rows its indices ask
    for instead of the table (the module's doc says the contract). The
    model itself is not changed. Returns the plan (a dict)."""
    if method not in ("script", "trace"):
        raise ValueError(f"method must be 'script' or 'trace', not {method!r}")
    if method == "trace" and example_inputs is None:
        raise ValueError("method='trace' needs example_inputs")
    specs = _block_specs(model, blocks)
    parts = _parts_arg(parts, specs)
    if not isinstance(gather_rows, bool):
        raise TypeError("gather_rows must be a bool")
    os.makedirs(out_dir, exist_ok=True)
    inputs = example_inputs if isinstance(example_inputs, tuple) or example_inputs is None \
        else (example_inputs,)
    version = 2 if parts or gather_rows else PLAN_VERSION
    plan = {"format": PLAN_FORMAT, "version": version, "torch": torch.__version__,
            "method": method, "blocks": []}
    if inputs is not None:
        plan["inputs"] = [{"dtype": _dtype_name(t.dtype), "shape": list(t.shape)}
                          for t in inputs if isinstance(t, torch.Tensor)]
    x = inputs
    with torch.no_grad():
        for i, (name, mod, tensors) in enumerate(specs):
            n_parts = parts.get(name)
            if n_parts:
                if not _slots(mod):
                    # no parameter in parts: its plan ("join_axis" without
                    # parts) would be refused by every reader
                    raise ValueError(f"export_blocks: block {name!r} has no parameter to split "
                                     f"into {n_parts} parts")
                for slot, t in _slots(mod):
                    if t.dim() == 0 or t.shape[0] % n_parts:
                        raise ValueError(f"export_blocks: block {name!r}: {slot} {list(t.shape)} "
                                         f"is not divisible by {n_parts} parts along dim 0")
            was_training = mod.training
            mod.eval()
            try:
                if method == "script":
                    sm = torch.jit.script(mod)
                else:
                    out = mod(*x)
                    # A block in parts is traced on its first part, the
                    # shape it will run with.
                    back = _swap_parts(mod, n_parts) if n_parts else []
                    try:
                        sm = torch.jit.trace(mod, x, check_trace=False)
                    finally:
                        for owner, leaf, t in back:
                            setattr(owner, leaf, t)
                    x = out if isinstance(out, tuple) else (out,)
            finally:
                mod.train(was_training)
            params = []
            for slot, t in _slots(sm):
                shape = list(t.shape)
                if n_parts and shape[0] != 0 and method == "script":
                    shape[0] //= n_parts
                params.append({"name": slot, "tensor": tensors[slot],
                               "dtype": _dtype_name(t.dtype), "shape": shape})
                if n_parts:
                    params[-1]["part"] = {"dim": 0, "n": n_parts}
                owner, leaf = _owner(sm, slot)
                # The placeholder: dtype and shape, no bytes. Set on the
                # script module only (its own slots): the model keeps its own.
                setattr(owner, leaf, torch.empty(shape, dtype=t.dtype, device="meta"))
            entry = {"name": name, "file": None, "sha256": None, "params": params}
            if n_parts:
                entry["join_axis"] = -1
            g = _gather_slot(sm) if gather_rows and not n_parts else None
            if g is not None:
                entry["gather"] = {"param": g}
            fname = f"block-{i:03d}.pt"
            path = os.path.join(out_dir, fname)
            torch.jit.save(sm, path)
            entry["file"], entry["sha256"] = fname, _sha256_file(path)
            plan["blocks"].append(entry)
    tmp = os.path.join(out_dir, PLAN_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(plan, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out_dir, PLAN_FILE))
    return plan


def _swap_parts(mod, n):
    """Sets each slot of an eager module to its first part along dim 0 (a
    slice of the real tensor); returns what to put back."""
    back = []
    for slot, t in _slots(mod):
        owner, leaf = _owner(mod, slot)
        back.append((owner, leaf, t))
        part = t.narrow(0, 0, t.shape[0] // n)
        if isinstance(t, torch.nn.Parameter):
            part = torch.nn.Parameter(part, requires_grad=t.requires_grad)
        setattr(owner, leaf, part)
    return back


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
    version = plan.get("version")
    if version not in PLAN_VERSIONS or isinstance(version, bool):
        raise PlanError(f"{path}: version {version!r}, this reader knows "
                        f"{', '.join(map(str, PLAN_VERSIONS))}")
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
        _check_v2(path, b, version)
    return plan


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _check_v2(path, b, version):
    """A block's version 2 keys ("part", "join_axis", "gather"), checked
    for form: parts all of one n along a dim the shape has, with a
    join_axis; a gather of the block's one parameter, 2-D, not parted."""
    where = f"{path}: block {b['name']!r}"
    parted = [p for p in b["params"] if "part" in p]
    if version < 2 and (parted or "join_axis" in b or "gather" in b):
        raise PlanError(f"{where}: \"part\", \"join_axis\" and \"gather\" need plan version 2")
    ns = set()
    for p in parted:
        part = p["part"]
        if not (isinstance(part, dict) and _is_int(part.get("dim")) and _is_int(part.get("n"))
                and 0 <= part["dim"] < len(p["shape"]) and part["n"] >= 1):
            raise PlanError(f"{where}: parameter {p['name']!r}: \"part\" is not {{dim, n}} "
                            f"with a dim of its shape {p['shape']} and n >= 1")
        ns.add(part["n"])
    if parted:
        if len(parted) != len(b["params"]) or len(ns) != 1:
            raise PlanError(f"{where}: a block in parts has every parameter in parts of one n")
        if not _is_int(b.get("join_axis")):
            raise PlanError(f"{where}: a block in parts needs \"join_axis\" (an int)")
    elif "join_axis" in b:
        raise PlanError(f"{where}: \"join_axis\" without parts")
    if "gather" in b:
        g = b["gather"]
        ok = isinstance(g, dict) and len(b["params"]) == 1 and not parted and \
            g.get("param") == b["params"][0]["name"] and len(b["params"][0]["shape"]) == 2
        if not ok:
            raise PlanError(f"{where}: \"gather\" needs {{\"param\": NAME}} of the block's one "
                            f"parameter, 2-D and whole")


class ScriptedModel:
    """The blocks of an export directory, run with weights from sluice (see
    the module's doc). Call it with the first block's inputs; it returns
    the last block's output. blocks_run counts the blocks that ran (in
    the last call); close() releases everything.

    A plan of version 2: a block in parts runs once per part, each part
    bound from Model.get_part (verified against the part's digest when the
    manifest has one) for its run only, resident or not, and its outputs
    are joined in part order; a "gather" block gets the rows of its
    indices (Model.read_into, ranges of rows, verified by the chunks they
    touch) as its table, and the indices' positions among them, for that
    call only. Neither tensor is hinted to the library (a hint reads the
    whole tensor into the pool)."""

    def __init__(self, export_dir, weights, *, pool=None, manifest=None, verify="default",
                 resident=None, **open_kw):
        import sluice
        self._sluice = sluice
        self.export_dir = export_dir
        self.plan = read_plan(export_dir)
        self.blocks = []          # (name, script module, [(owner, leaf, tensor name, placeholder)])
        self._parts = []          # per block: (each param's dim, n, join_axis), or None: whole
        self._gather = []         # per block: True when its one parameter is read by rows
        self._part_len = []       # per block in parts: the length of a part along its dim
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
            part = b["params"][0].get("part") if b["params"] else None
            # each parameter along its own dim (all of one n: _check_v2)
            self._parts.append((tuple(p["part"]["dim"] for p in b["params"]), part["n"],
                                b["join_axis"]) if part else None)
            # a part's length: each output piece has it along join_axis
            self._part_len.append(b["params"][0]["shape"][part["dim"]] if part else None)
            gather = "gather" in b
            if gather and not _reads_rows_by_input(mod, b["gather"]["param"]):
                raise PlanError(f"block {b['name']!r}: the plan says \"gather\", and its code "
                                f"does not use its first input only as aten::embedding's "
                                f"indices (and for its shape), and its table only as its "
                                f"weight (through element-by-element ops)")
            self._gather.append(gather)
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
        # What a resident run holds at once: the tensors bound whole, and
        # one block's parts (bound for a run only; gathered rows are not
        # in the pool).
        whole = sum(self.model.info(t).nbytes for t in self._unique_tensors(whole=True))
        part = max([sum(ph.numel() * ph.element_size() for _o, _l, _t, ph in binds)
                    for (_n, _m, binds), pt in zip(self.blocks, self._parts) if pt] or [0])
        held = whole + part
        self.resident = held <= self.pool_bytes if resident is None else bool(resident)
        self._bound = set()       # blocks whose weights are bound now
        self.blocks_run = 0

    def _unique_tensors(self, whole=False):
        """The tensors the plan names, each once (whole: only those bound
        whole somewhere: neither parted nor gathered)."""
        seen = []
        for i, (_n, _m, binds) in enumerate(self.blocks):
            if whole and (self._parts[i] or self._gather[i]):
                continue
            for _o, _l, t, _p in binds:
                if t not in seen:
                    seen.append(t)
        return seen

    def _check_weights(self):
        """Every tensor the plan names exists with the parameter's dtype
        and shape (a part's: the tensor's with the part's dim divided by
        n): checked here, before any block can run."""
        for i, (name, _mod, binds) in enumerate(self.blocks):
            part = self._parts[i]
            for k, (_o, leaf, tensor, ph) in enumerate(binds):
                if tensor not in self.model:
                    raise PlanError(f"block {name!r}: parameter {leaf!r} binds to tensor "
                                    f"{tensor!r}, which is not in {self.model.path}")
                info = self.model.info(tensor)
                want = _dtype_name(ph.dtype)
                shape = list(ph.shape)
                if part:
                    shape[part[0][k]] *= part[1]
                if info.dtype != want or list(info.shape) != shape:
                    what = f"part of {part[1]} along dim {part[0][k]} " if part else ""
                    raise PlanError(f"block {name!r}: tensor {tensor!r} is {info.dtype} "
                                    f"{list(info.shape)} in the weights, the parameter it binds "
                                    f"to is {want} {list(ph.shape)} {what}(the tensor would be "
                                    f"{want} {shape})")

    def _names_from(self, i):
        """The tensors bound whole from block i on, in order (a hint: the
        parted and gathered ones are read as they are needed)."""
        return [t for k in range(i, len(self.blocks)) if not (self._parts[k] or self._gather[k])
                for _o, _l, t, _p in self.blocks[k][2]]

    def _hint(self, i):
        """Hints the tensors bound whole from block i on (none left: the
        plan's from the start, the next call's), so that the library reads
        ahead, within the pool, what the acquires do not wait for. Not
        when every block bound whole is bound (resident). Never an empty
        hint: that means the model's order, which would read the parted
        and gathered tensors whole."""
        whole = [k for k in range(len(self.blocks)) if not (self._parts[k] or self._gather[k])]
        if all(k in self._bound for k in whole):
            return
        names = self._names_from(i) or self._names_from(0)
        if names:
            self.model.prefetch(names)

    def _error(self, e, where, tensor):
        return self._sluice._errors.make_error(e.code, f"{where}: {e.message}", tensor)

    def _bind(self, i, part=None):
        name, _mod, binds = self.blocks[i]
        got = []
        try:
            for k, (_o, _l, tensor, _p) in enumerate(binds):
                try:
                    if part is None:
                        got.append(self.model.get_tensor(tensor, framework="pt"))
                    else:
                        dims, n, _a = self._parts[i]
                        got.append(self.model.get_part(tensor, dims[k], part, n, framework="pt"))
                except self._sluice.Error as e:
                    where = f"block {name!r}" + (f" part {part}/{self._parts[i][1]}"
                                                 if part is not None else "")
                    raise self._error(e, where, tensor) from e
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

    def _rows(self, i, ids):
        """A gather block's table for ids: the rows of the distinct
        indices, ascending (read and verified by ranges), and the
        positions of ids among them."""
        name, _mod, binds = self.blocks[i]
        _o, _l, tensor, ph = binds[0]
        rows, width = ph.shape
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64:
            raise TypeError(f"block {name!r}: its indices are not an int64 tensor")
        flat = ids.reshape(-1)
        bad = flat[(flat < 0) | (flat >= rows)]
        if bad.numel():
            raise IndexError(f"block {name!r}: index {int(bad[0])} is not a row of {tensor!r} "
                             f"[{rows}, {width}]")
        uniq, inv = torch.unique(flat, sorted=True, return_inverse=True)
        row = width * ph.element_size()
        table = torch.empty((uniq.numel(), row), dtype=torch.uint8)
        u = uniq.tolist()
        g = 0
        while g < len(u):
            h = g + 1
            while h < len(u) and (u[h] - u[g] + 1) * row <= GATHER_SPAN:
                h += 1
            span = u[h - 1] - u[g] + 1
            buf = torch.empty((span, row), dtype=torch.uint8)
            try:
                self.model.read_into(tensor, buf.numpy(), u[g] * row)
            except self._sluice.Error as e:
                raise self._error(e, f"block {name!r}", tensor) from e
            table[g:h] = buf[uniq[g:h] - u[g]]
            g = h
        return table.view(ph.dtype).reshape(len(u), width), inv.reshape(ids.shape)

    def _run(self, i, x):
        """Block i on inputs x (a tuple): its output as a tuple."""
        name, mod, binds = self.blocks[i]
        part = self._parts[i]
        if part:
            self._hint(i)
            pieces = []
            for r in range(part[1]):
                self._bind(i, r)
                try:
                    out = mod(*x)
                finally:
                    self._unbind(i)  # a part is bound for its run only, resident too
                if not isinstance(out, torch.Tensor):
                    raise TypeError(f"block {name!r}: a block in parts gives one tensor")
                # A join_axis other than the parted one would join the pieces
                # into logits of the wrong shape, silently.
                axis, rows = part[2], self._part_len[i]
                if not -out.dim() <= axis < out.dim() or out.shape[axis] != rows:
                    raise PlanError(f"block {name!r}: part {r}'s output is "
                                    f"{list(out.shape)}: along join_axis {axis} it does not "
                                    f"have the part's {rows} rows")
                pieces.append(out)
            return (torch.cat(pieces, dim=part[2]),)
        if self._gather[i]:
            self._hint(i)  # the next blocks read while the rows are
            table, pos = self._rows(i, x[0])
            owner, leaf, _t, ph = binds[0]
            setattr(owner, leaf, table)
            try:
                out = mod(pos, *x[1:])
            finally:
                setattr(owner, leaf, ph)
                del table
        else:
            if i not in self._bound:
                # The rest of the plan in order: what this acquire does
                # not wait for (the next block on) is read ahead while
                # this block runs, within the pool.
                self._hint(i)
                self._bind(i)
            try:
                out = mod(*x)
            finally:
                if not self.resident:
                    self._unbind(i)
        return out if isinstance(out, tuple) else (out,)

    def __call__(self, *inputs):
        if self.model is None:
            raise self._sluice.ClosedError(self._sluice._errors.E_INVAL, "the model is closed")
        self.blocks_run = 0
        x = inputs
        with torch.no_grad():
            for i in range(len(self.blocks)):
                x = self._run(i, x)
                self.blocks_run += 1
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
