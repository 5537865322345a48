"""ONNX blocks whose weights a runtime is given at run time: graphs for
ONNX Runtime with weights that sluice reads and verifies.

export_blocks(model, blocks, out_dir, example_inputs, *, embed_weights=False,
              opset=17, input_names=None, dynamic={0: "batch", 1: "sequence"})
    Writes one ONNX graph per block (embedding, each decoder layer, final
    norm and head: what the caller lists, as for
    sluice.torch.export_blocks) with torch.onnx.export, in eval mode,
    constant-folded, each block traced on the previous block's output
    (the first on example_inputs). Every weight (parameter or persistent
    buffer) is an initializer whose data is EXTERNAL and ABSENT: it names
    block-NNN.weights, an empty placeholder file (ONNX Runtime needs the
    file to exist, and reads nothing from it when the caller supplies the
    initializer, OrtApi::AddInitializer; an empty file also makes a
    misspelt name fail instead of loading from disk). The .onnx files are
    kilobytes. Initializers that are not weights (the constants the graph
    made: shapes, scalars, masks) stay embedded. plan.json beside them
    maps each weight initializer to its safetensors tensor.

    embed_weights=True writes the same graphs (the same nodes and
    initializer names) with the weights' values embedded, taken from the
    model's own tensors (they must be real, not on the meta device), and
    no placeholder: what ONNX Runtime runs alone, to compare against.

No weight is rewritten by the graph: each mapped initializer is the
safetensors tensor itself, byte for byte (dtype, shape, values), so that a
runtime can use the verified buffer in place. torch's exporter writes
nn.Linear on a 3-D input as MatMul(x, Transpose(W)) and constant folding
turns Transpose(W) into a new initializer holding W^T; export_blocks
rewrites each such MatMul (or Gemm) into Gemm(x as 2-D, W, transB=1),
reshaped back, with W the parameter itself. A graph that still computes a
constant from a weight (an op of the model on its own weights, a cast)
fails the export with ExportError naming the initializer; so does a node
whose inputs are all constants, one of them a weight (ONNX Runtime would
fold it into a copy at session creation).

How initializers are matched to weights: the exporter renames
(onnx::MatMul_413), drops unused parameters and merges initializers of
equal value, so names cannot be trusted. Each block is exported twice
with every weight replaced by a distinct pseudo-random "fingerprint" (two
seeds; the model's own tensors are put back after): an initializer is a
weight's when its bytes are that weight's fingerprint in both exports, a
transposed weight's when they are its transpose in both, a constant of
the graph when they are equal in both, and anything else is computed from
a weight (ExportError). Distinct fingerprints keep the exporter from
merging two weights that happen to be equal in the checkpoint (two norms
of ones), which would leave one tensor unread and unverified. One tensor
object that two slots share (tied weights within a block) is one
initializer, mapped to the tensor of its first slot (named_parameters
order); two slots mapped to one safetensors name (distinct objects) are
two initializers naming the same tensor. A parameter the block's graph
does not use has no initializer and is not in the plan. Only
floating-point weights are supported (ExportError otherwise).

The plan's format (version 1), fixed with the C engine
(examples/onnx_engine.c):

    {"format": "sluice-onnx-plan", "version": 1, "torch": "1.13.1",
     "onnx": "1.12.0", "opset": 17,
     "inputs": [{"name": "input_ids", "dtype": "I64", "shape": [1, 12]}],
     "blocks": [{"name": "model.layers.0", "file": "block-001.onnx",
                 "sha256": "<SHA-256 of the .onnx file>",
                 "external_data": "block-001.weights",
                 "inputs": ["hidden_in"], "outputs": ["hidden_out"],
                 "initializers": [{"name": "onnx::Gemm_413",
                                   "tensor": "model.layers.0.mlp.up_proj.weight",
                                   "dtype": "F32", "shape": [4864, 896]}, ...]}, ...]}

"inputs" are the first block's graph inputs (example_inputs: names,
safetensors dtype names, the example's shapes); each block's "inputs" and
"outputs" are its graph's input and output names in order, and block k's
outputs feed block k+1's inputs positionally. "external_data" is the
placeholder the graph's external data names (null when embed_weights).
Each of "initializers" (graph order) is an initializer name, the
safetensors tensor it is, and that tensor's dtype and shape (the
initializer's). Shapes of graph inputs and outputs are dynamic on the axes
of `dynamic` (default: 0 "batch" and 1 "sequence", for those that have
them), fixed to the example's elsewhere.

Version 2 (written when parts or gather_rows is used; version 1 otherwise)
adds, optionally: an initializer's "part": {"dim": 0, "n": n} (the graph's
initializer is part r of n of the tensor along dim, its "shape" the
part's; the block, one output, is run once per part and the outputs
joined along the block's "join_axis"), and a block's "gather":
{"initializer": name, "indices": input} (the block is one Gather, axis 0,
of that 2-D initializer by its one input: an engine may read the rows
itself). docs/onnx.md, "Version 2".

This module imports torch and onnx only (not the sluice binding): the C
engine's test exports its fixture before the binding is built, loading
this file by path. A block's graph with its weights must fit protobuf's
2 GiB while it is exported.
"""
import hashlib
import io
import json
import os

import onnx
import torch
from onnx import helper, numpy_helper

try:
    from . import torchscript as _ts
except ImportError:  # loaded by path, outside the package: its sibling by path too
    import importlib.util
    import sys
    _ts = sys.modules.get("sluice_torchscript")
    if _ts is None:
        _spec = importlib.util.spec_from_file_location(
            "sluice_torchscript", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                               "torchscript.py"))
        _ts = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_ts)
        sys.modules["sluice_torchscript"] = _ts

__all__ = ["export_blocks", "ExportError", "PLAN_FORMAT", "PLAN_VERSION", "MAX_OPSET"]

PLAN_FORMAT = "sluice-onnx-plan"
PLAN_VERSION = 1
PLAN_FILE = "plan.json"
MAX_OPSET = 17          # torch 1.13's exporter goes no further
MIN_OPSET = 14          # Trilu (torch.triu), Gemm, Slice with tensor inputs
_ALIGN = 64             # offsets of the (absent) external data
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class ExportError(ValueError):
    """A block that cannot be exported as the plan requires: a weight that
    is not floating-point, one the graph rewrites, torch's exporter
    failing on it, or embed_weights without real weights."""


def _raw(t):
    """The bytes of a tensor in C order (as safetensors and ONNX's
    raw_data hold them, little-endian on this machine)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()


def _proto_raw(t):
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise ExportError(f"initializer {t.name!r}: external data in torch's export")
    if t.raw_data or not any(t.dims) or 0 in t.dims:
        return t.raw_data
    return numpy_helper.to_array(t).tobytes()


def _weights(mod, slots):
    """The distinct weight objects of a block: [(tensor, slot name,
    [(owner, attr, is_param)])], in _slots order, each object once with
    every place that holds it."""
    places = {}
    for _prefix, m in mod.named_modules():
        for attr, t in m._parameters.items():
            if t is not None:
                places.setdefault(id(t), []).append((m, attr, True))
        for attr, t in m._buffers.items():
            if t is not None and attr not in m._non_persistent_buffers_set:
                places.setdefault(id(t), []).append((m, attr, False))
    out, seen = [], set()
    for name, t in slots:
        if id(t) not in seen:
            seen.add(id(t))
            out.append((t, name, places[id(t)]))
    return out


def _fingerprints(weights, seed, block):
    """One pseudo-random tensor per weight (its dtype and shape), no two
    with the same bytes: [(tensor, raw bytes)]."""
    out, used = [], set()
    for i, (t, name, _places) in enumerate(weights):
        if t.dtype not in _FLOATS:
            raise ExportError(f"block {block!r}: {name!r} is {t.dtype}: only floating-point "
                              f"weights export (they are traced as fingerprints)")
        if t.numel() == 0:
            raise ExportError(f"block {block!r}: {name!r} is empty")
        g = torch.Generator().manual_seed(seed * 1_000_003 + i)
        for _ in range(100):
            fp = (torch.randn(t.shape, generator=g, dtype=torch.float32) * 0.05).to(t.dtype)
            raw = _raw(fp)
            if raw not in used:
                break
        else:
            raise ExportError(f"block {block!r}: no distinct fingerprint for {name!r}")
        used.add(raw)
        out.append((fp, raw))
    return out


def _swap(weights, tensors):
    """Puts tensors (one per weight) in every place of each weight;
    returns what to put back."""
    back = []
    for (_t, _name, places), new in zip(weights, tensors):
        p = torch.nn.Parameter(new, requires_grad=False)
        for owner, attr, is_param in places:
            d = owner._parameters if is_param else owner._buffers
            back.append((d, attr, d[attr]))
            d[attr] = p if is_param else new
    return back


def _unswap(back):
    for d, attr, old in reversed(back):
        d[attr] = old


def _export_once(mod, weights, fps, x, opset, in_names, out_names, axes, block):
    back = _swap(weights, [fp for fp, _raw in fps])
    try:
        f = io.BytesIO()
        try:
            torch.onnx.export(mod, tuple(x), f, opset_version=opset, do_constant_folding=True,
                              input_names=in_names, output_names=out_names, dynamic_axes=axes,
                              training=torch.onnx.TrainingMode.EVAL, export_params=True,
                              keep_initializers_as_inputs=False)
        except Exception as e:
            raise ExportError(f"block {block!r}: torch.onnx.export failed: "
                              f"{type(e).__name__}: {e}") from e
    finally:
        _unswap(back)
    return onnx.load_from_string(f.getvalue())


def _run(mod, weights, fps, x, block):
    """The block's outputs on x with the fingerprints (a tuple of tensors)."""
    back = _swap(weights, [fp for fp, _raw in fps])
    try:
        with torch.no_grad():
            out = mod(*x)
    finally:
        _unswap(back)
    return _tensors_tuple(out, f"block {block!r}'s output")


def _structure(model):
    """The model without its initializers' data: what two exports of one
    block must share."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        t.ClearField("raw_data")
        for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            t.ClearField(field)
    return m.SerializeToString()


def _consumers(graph, name):
    return [n for n in graph.node if name in n.input]


def _drop_identities(graph, inits):
    """Identity(initializer) nodes (how the exporter merges equal
    initializers) removed: their uses take the initializer itself."""
    outputs = {o.name for o in graph.output}
    for n in list(graph.node):
        if n.op_type == "Identity" and n.input[0] in inits and n.output[0] not in outputs:
            src, dst = n.input[0], n.output[0]
            graph.node.remove(n)
            for m in graph.node:
                for i, v in enumerate(m.input):
                    if v == dst:
                        m.input[i] = src


def _fresh(graph, taken, base):
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _untranspose(graph, wt_name, w_name, shape, taken, block):
    """Every use of wt_name (an initializer holding W^T, W of shape
    [n, k]) rewritten to use W (w_name): MatMul(A, W^T) becomes Gemm of A
    as 2-D with W, transB=1, reshaped back to A's leading dims + [n];
    Gemm's B flips its transB."""
    n_out, k_in = shape
    for node in _consumers(graph, wt_name):
        if node.op_type == "Gemm" and list(node.input).index(wt_name) == 1 \
                and node.input[0] != wt_name:
            node.input[1] = w_name
            attrs = {a.name: a for a in node.attribute}
            if "transB" in attrs:
                attrs["transB"].i = 1 - attrs["transB"].i
            else:
                node.attribute.append(helper.make_attribute("transB", 1))
            continue
        if node.op_type != "MatMul" or node.input[1] != wt_name or node.input[0] == wt_name:
            raise ExportError(f"block {block!r}: initializer {wt_name!r} is the transpose of "
                              f"{w_name!r}, used by {node.op_type} {node.name!r}, which "
                              f"cannot take the weight itself")
        a, y = node.input[0], node.output[0]
        base = (node.name or y).rstrip("/") + "/sluice"

        def v(suffix):
            return _fresh(graph, taken, f"{base}/{suffix}")
        c_2d, c_lo, c_hi, c_n = v("k2d"), v("start"), v("end"), v("n")
        shp, lead, a2, y2, shp2 = v("shape"), v("lead"), v("a2d"), v("y2d"), v("yshape")
        new = [
            helper.make_node("Constant", [], [c_2d], name=v("Constant"),
                             value=helper.make_tensor(c_2d, onnx.TensorProto.INT64, [2], [-1, k_in])),
            helper.make_node("Reshape", [a, c_2d], [a2], name=v("Reshape")),
            helper.make_node("Gemm", [a2, w_name], [y2], name=v("Gemm"), transB=1),
            helper.make_node("Shape", [a], [shp], name=v("Shape")),
            helper.make_node("Constant", [], [c_lo], name=v("Constant"),
                             value=helper.make_tensor(c_lo, onnx.TensorProto.INT64, [1], [0])),
            helper.make_node("Constant", [], [c_hi], name=v("Constant"),
                             value=helper.make_tensor(c_hi, onnx.TensorProto.INT64, [1], [-1])),
            helper.make_node("Slice", [shp, c_lo, c_hi], [lead], name=v("Slice")),
            helper.make_node("Constant", [], [c_n], name=v("Constant"),
                             value=helper.make_tensor(c_n, onnx.TensorProto.INT64, [1], [n_out])),
            helper.make_node("Concat", [lead, c_n], [shp2], name=v("Concat"), axis=0),
            helper.make_node("Reshape", [y2, shp2], [y], name=v("Reshape")),
        ]
        at = list(graph.node).index(node)
        graph.node.remove(node)
        for i, nn_ in enumerate(new):
            graph.node.insert(at + i, nn_)


def _constants(graph):
    out = {t.name for t in graph.initializer}
    out.update(o for n in graph.node if n.op_type == "Constant" for o in n.output)
    return out


def _check_no_folding(graph, weight_names, block):
    """No node takes only constants with a weight among them: ONNX Runtime
    would fold it into a copy of the weight when the session is made."""
    consts = _constants(graph)
    for n in graph.node:
        ins = [i for i in n.input if i]
        if n.op_type in ("Shape", "Size") or not ins:
            continue
        if all(i in consts for i in ins) and any(i in weight_names for i in ins):
            w = next(i for i in ins if i in weight_names)
            raise ExportError(f"block {block!r}: {n.op_type} {n.name!r} takes only constants, "
                              f"weight {w!r} among them: ONNX Runtime would fold it into a copy")


def _map_block(name, mod, tensors, x, opset, in_names, dynamic):
    """Exports one block twice with fingerprints and returns (graph with
    weights as fingerprints, [(initializer name, weight index)], the
    weights, the block's outputs for the next one, their names)."""
    weights = _weights(mod, _ts._slots(mod))
    fa, fb = _fingerprints(weights, 1, name), _fingerprints(weights, 2, name)
    out = _run(mod, weights, fa, x, name)
    out_names = ["hidden_out"] if len(out) == 1 else [f"hidden_out_{i}" for i in range(len(out))]
    axes = {nm: {a: d for a, d in dynamic.items() if a < t.dim()}
            for nm, t in zip(list(in_names) + out_names, x + out)}
    ma = _export_once(mod, weights, fa, x, opset, in_names, out_names, axes, name)
    mb = _export_once(mod, weights, fb, x, opset, in_names, out_names, axes, name)
    if _structure(ma) != _structure(mb):
        raise ExportError(f"block {name!r}: two exports with different weight values differ "
                          f"in structure (control flow on weight values?)")
    hash_ = lambda b: hashlib.sha256(b).digest()  # noqa: E731
    direct = [{hash_(r): i for i, (_fp, r) in enumerate(fps)} for fps in (fa, fb)]
    trans = [{hash_(_raw(fp.t())): i for i, (fp, _r) in enumerate(fps) if fp.dim() == 2}
             for fps in (fa, fb)]
    mapped, transposed, consts = [], [], set()
    for ta, tb in zip(ma.graph.initializer, mb.graph.initializer):
        ha, hb = hash_(_proto_raw(ta)), hash_(_proto_raw(tb))
        if ha in direct[0] and direct[1].get(hb) == direct[0][ha]:
            mapped.append((ta.name, direct[0][ha]))
        elif ha in trans[0] and trans[1].get(hb) == trans[0][ha]:
            transposed.append((ta.name, trans[0][ha]))
        elif ha == hb:
            consts.add(ta.name)
        else:
            users = ", ".join(f"{n.op_type} {n.name!r}" for n in _consumers(ma.graph, ta.name))
            raise ExportError(f"block {name!r}: initializer {ta.name!r} {list(ta.dims)} is "
                              f"computed from the weights (used by {users or 'nothing'}): the "
                              f"graph rewrites a weight, which a runtime given the tensor "
                              f"cannot run")
    g = ma.graph
    inits = {t.name for t in g.initializer}
    _drop_identities(g, inits)
    taken = {v for n in g.node for v in list(n.input) + list(n.output)} | inits | \
        {i.name for i in g.input} | {n.name for n in g.node}
    by_weight = {i: n for n, i in mapped}
    for wt, i in transposed:
        w = by_weight.get(i)
        if w is None:  # the weight itself is not in the graph yet: add it
            fp, _r = fa[i]
            w = _fresh(g, taken, tensors[weights[i][1]])
            g.initializer.append(numpy_helper.from_array(
                fp.float().numpy() if fp.dtype == torch.bfloat16 else fp.numpy(), w))
            if fp.dtype == torch.bfloat16:
                t = g.initializer[-1]
                t.data_type, t.raw_data = onnx.TensorProto.BFLOAT16, _raw(fp)
            mapped.append((w, i))
            by_weight[i] = w
        _untranspose(g, wt, w, list(weights[i][0].shape), taken, name)
        g.initializer.remove(next(t for t in g.initializer if t.name == wt))
    used = {v for n in g.node for v in n.input} | {o.name for o in g.output}
    for t in list(g.initializer):  # what the rewrite left unused
        if t.name not in used:
            g.initializer.remove(t)
    order = {t.name: k for k, t in enumerate(g.initializer)}
    mapped = sorted(((n, i) for n, i in mapped if n in order), key=lambda p: order[p[0]])
    _check_no_folding(g, {n for n, _ in mapped}, name)
    g.name = name
    return ma, mapped, weights, out, out_names


def _set_external(t, location, offset, length):
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                  "uint64_data"):
        t.ClearField(field)
    del t.external_data[:]
    t.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v


def _tensors_tuple(x, what):
    x = x if isinstance(x, (tuple, list)) else (x,)
    if not x or not all(isinstance(t, torch.Tensor) for t in x):
        raise ValueError(f"export_blocks: {what} must be a tensor or a tuple of tensors")
    return tuple(x)


def _gather_of(g, mapped, in_names, out_names):
    """The initializer name when the graph is one Gather of a mapped 2-D
    weight by the block's one input on axis 0 giving its one output."""
    if len(g.node) != 1 or len(in_names) != 1 or len(out_names) != 1:
        return None
    n = g.node[0]
    axis = [a.i for a in n.attribute if a.name == "axis"]
    names = {m for m, _i in mapped}
    dims = {t.name: len(t.dims) for t in g.initializer}
    if n.op_type == "Gather" and len(n.input) == 2 and n.input[0] in names \
            and dims.get(n.input[0]) == 2 and n.input[1] == in_names[0] \
            and list(n.output) == list(out_names) and axis in ([], [0]) \
            and len(n.attribute) == len(axis):
        return n.input[0]
    return None


def export_blocks(model, blocks, out_dir, example_inputs, *, embed_weights=False, opset=MAX_OPSET,
                  input_names=None, dynamic=None, parts=None, gather_rows=False):
    """Writes the blocks of model as ONNX graphs and plan.json into out_dir
    (made if missing; see the module's doc). blocks: in execution order,
    as sluice.torch.export_blocks takes them (a submodule's path, or a
    tuple (name, module, tensors)). example_inputs: a tensor or a tuple
    of tensors, the first block's inputs (the exporter traces: each block
    runs once, with fingerprint weights, on the previous one's outputs;
    the model may be on the meta device unless embed_weights). parts:
    {block name: n}: every weight of that block is exported as its part
    [shape[0] / n, ...] along dim 0 (a vocab head: the Linear's weight
    [V, D] and its bias), the block having one output, joined on its
    last axis (plan version 2). gather_rows: a block that is one Gather
    of a 2-D weight by its one input is marked "gather" (plan version 2),
    for an engine that reads the rows itself. input_names:
    the first block's input names (default "input_ids" for one input,
    else input_0, input_1, ...); later blocks take hidden_in (hidden_in_0,
    ...) and give hidden_out (hidden_out_0, ...). dynamic: {axis: name} of
    the axes left dynamic in every block's inputs and outputs (default
    {0: "batch", 1: "sequence"}; {} for none). opset: 14 to 17. The model
    is not changed (its training mode is put back). Returns the plan."""
    specs = _ts._block_specs(model, blocks)
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset must be {MIN_OPSET} to {MAX_OPSET} (torch "
                         f"{torch.__version__}'s exporter), not {opset!r}")
    if example_inputs is None:
        raise ValueError("export_blocks: example_inputs is needed (torch's ONNX exporter traces)")
    x = _tensors_tuple(example_inputs, "example_inputs")
    if input_names is None:
        input_names = ["input_ids"] if len(x) == 1 else [f"input_{i}" for i in range(len(x))]
    input_names = list(input_names)
    if len(input_names) != len(x) or len(set(input_names)) != len(input_names):
        raise ValueError(f"export_blocks: {len(x)} example inputs, input_names {input_names}")
    dynamic = {0: "batch", 1: "sequence"} if dynamic is None else dict(dynamic)
    parts = _ts._parts_arg(parts, specs)
    if parts and embed_weights:
        raise ValueError("export_blocks: embed_weights writes whole weights, not parts")
    os.makedirs(out_dir, exist_ok=True)
    version = 2 if parts or gather_rows else PLAN_VERSION
    plan = {"format": PLAN_FORMAT, "version": version, "torch": torch.__version__,
            "onnx": onnx.__version__, "opset": opset,
            "inputs": [{"name": n, "dtype": _ts._dtype_name(t.dtype), "shape": list(t.shape)}
                       for n, t in zip(input_names, x)],
            "blocks": []}
    in_names = input_names
    for k, (name, mod, tensors) in enumerate(specs):
        was_training = mod.training
        mod.eval()
        n_parts, back = parts.get(name), []
        if n_parts:  # the block traced on part-shaped weights (any values: meta)
            ws = _weights(mod, _ts._slots(mod))
            for t, slot, _places in ws:
                if t.dim() == 0 or t.shape[0] % n_parts:
                    raise ExportError(f"block {name!r}: {slot!r} {list(t.shape)}: dim 0 is not "
                                      f"divisible by {n_parts} parts")
            back = _swap(ws, [torch.empty((t.shape[0] // n_parts,) + tuple(t.shape[1:]),
                                          dtype=t.dtype, device="meta") for t, _s, _p in ws])
        try:
            g_model, mapped, weights, out, out_names = _map_block(name, mod, tensors, x, opset,
                                                                  in_names, dynamic)
        finally:
            _unswap(back)
            mod.train(was_training)
        if n_parts and len(out_names) != 1:
            raise ExportError(f"block {name!r}: a block in parts needs one output")
        stem = f"block-{k:03d}"
        fname, ext = stem + ".onnx", None if embed_weights else stem + ".weights"
        inits = {t.name: t for t in g_model.graph.initializer}
        entries, offset = [], 0
        for init_name, i in mapped:
            t, slot, _places = weights[i]
            entries.append({"name": init_name, "tensor": tensors[slot],
                            "dtype": _ts._dtype_name(t.dtype), "shape": list(t.shape)})
            if n_parts:
                entries[-1]["part"] = {"dim": 0, "n": n_parts}
            proto = inits[init_name]
            if list(proto.dims) != list(t.shape):
                raise ExportError(f"block {name!r}: initializer {init_name!r} is "
                                  f"{list(proto.dims)}, weight {slot!r} {list(t.shape)}")
            if embed_weights:
                if t.is_meta:
                    raise ExportError(f"block {name!r}: embed_weights needs the weights: "
                                      f"{slot!r} is on the meta device")
                proto.raw_data = _raw(t)
            else:
                length = t.numel() * t.element_size()
                _set_external(proto, ext, offset, length)
                offset += (length + _ALIGN - 1) // _ALIGN * _ALIGN
        path = os.path.join(out_dir, fname)
        with open(path + ".tmp", "wb") as f:
            f.write(g_model.SerializeToString())
        os.replace(path + ".tmp", path)
        if ext is not None:
            open(os.path.join(out_dir, ext), "wb").close()  # the placeholder: exists, empty
        plan["blocks"].append({"name": name, "file": fname, "sha256": _ts._sha256_file(path),
                               "external_data": ext, "inputs": list(in_names),
                               "outputs": out_names, "initializers": entries})
        if n_parts:
            plan["blocks"][-1]["join_axis"] = out[0].dim() - 1
            # the trace ran on one part: the next block sees the whole output
            out = (torch.cat([out[0]] * n_parts, dim=-1),)
        gi = _gather_of(g_model.graph, mapped, in_names, out_names) if gather_rows else None
        if gi is not None:
            plan["blocks"][-1]["gather"] = {"initializer": gi, "indices": in_names[0]}
        x = out
        in_names = ["hidden_in"] if len(x) == 1 else [f"hidden_in_{i}" for i in range(len(x))]
    tmp = os.path.join(out_dir, PLAN_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(plan, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out_dir, PLAN_FILE))
    return plan
