#!/usr/bin/python3
"""A hand-made ONNX block model for ctest onnx_engine, with python3-onnx's
onnx.helper alone (no torch): float32, an embedding, LAYERS residual MLP
layers and a head, one graph per block, in the plan format the engine
reads (docs/onnx.md, "sluice-onnx-plan" version 1):

  model.embed_tokens  Gather(embed, input_ids)                  -> hidden
  model.layers.i      h + MatMul(Tanh(MatMul(h, up) + bias), down)
  lm_head             MatMul(h, head)                           -> logits

Two exports of the same graphs: EXPORT_DIR with every weight an
initializer whose data is external (block-NNN.weights, an empty
placeholder: ONNX Runtime never reads it when each initializer is handed
over), and EMBEDDED_DIR with the weights inside the graphs. The weights go
to WEIGHTS_DIR/model.safetensors (names as a Hugging Face checkpoint has
them; the graphs' initializer names are the exporter's, onnx::MatMul_N).

usage: make_blocks.py WEIGHTS_DIR EXPORT_DIR EMBEDDED_DIR
"""
import hashlib
import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

VOCAB, DIM, FF, LAYERS, OPSET = 64, 64, 256, 4, 17


def weights(seed=7, vocab=VOCAB):
    rng = np.random.default_rng(seed)
    w = {"model.embed_tokens.weight": rng.standard_normal((vocab, DIM)).astype(np.float32)}
    for i in range(LAYERS):
        p = f"model.layers.{i}.mlp."
        w[p + "up_proj.weight"] = (rng.standard_normal((DIM, FF)) / np.sqrt(DIM)).astype(np.float32)
        w[p + "up_proj.bias"] = (rng.standard_normal(FF) * 0.1).astype(np.float32)
        w[p + "down_proj.weight"] = (rng.standard_normal((FF, DIM)) / np.sqrt(FF)).astype(np.float32)
    w["lm_head.weight"] = (rng.standard_normal((DIM, vocab)) / np.sqrt(DIM)).astype(np.float32)
    return w


def blocks(vocab=VOCAB):
    """[(name, nodes, inputs, outputs, [(initializer, tensor)])]"""
    seq = "seq"
    h = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, seq, DIM])  # noqa: E731
    out = [("model.embed_tokens",
            [helper.make_node("Gather", ["onnx::Gather_1", "input_ids"], ["hidden"])],
            [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])], [h("hidden")],
            [("onnx::Gather_1", "model.embed_tokens.weight")])]
    n = 100
    for i in range(LAYERS):
        p = f"model.layers.{i}.mlp."
        up, bias, down = f"onnx::MatMul_{n}", f"onnx::Add_{n + 1}", f"onnx::MatMul_{n + 2}"
        n += 10
        nodes = [helper.make_node("MatMul", ["hidden_in", up], ["u"]),
                 helper.make_node("Add", ["u", bias], ["ub"]),
                 helper.make_node("Tanh", ["ub"], ["t"]),
                 helper.make_node("MatMul", ["t", down], ["d"]),
                 helper.make_node("Add", ["hidden_in", "d"], ["hidden_out"])]
        out.append((f"model.layers.{i}", nodes, [h("hidden_in")], [h("hidden_out")],
                    [(up, p + "up_proj.weight"), (bias, p + "up_proj.bias"),
                     (down, p + "down_proj.weight")]))
    out.append(("lm_head", [helper.make_node("MatMul", ["hidden_in", "onnx::MatMul_900"], ["logits"])],
                [h("hidden_in")],
                [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, vocab])],
                [("onnx::MatMul_900", "lm_head.weight")]))
    return out


DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}


def write_safetensors(path, w):
    entries, off = {}, 0
    for k, v in w.items():
        entries[k] = {"dtype": DTYPES[v.dtype], "shape": list(v.shape),
                      "data_offsets": [off, off + v.nbytes]}
        off += v.nbytes
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * ((-len(header)) % 8)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        for v in w.values():
            f.write(np.ascontiguousarray(v).tobytes())


def export(out_dir, w, embedded, parts=0):
    """parts > 0: plan version 2, the embedding a "gather" block (the
    engine reads the prompt's rows) and the head's weight [DIM, vocab] in
    `parts` parts along dim 1 (vocab): its graph takes [DIM, vocab/parts]
    and gives [1, seq, vocab/parts], run once per part, joined on axis 2."""
    os.makedirs(out_dir, exist_ok=True)
    vocab = w["model.embed_tokens.weight"].shape[0]
    plan = {"format": "sluice-onnx-plan", "version": 2 if parts else 1, "onnx": onnx.__version__,
            "opset": OPSET, "inputs": [{"name": "input_ids", "dtype": "I64", "shape": [1, 12]}],
            "blocks": []}
    for k, (name, nodes, ins, outs, inits) in enumerate(
            blocks(vocab // parts if parts else vocab), start=1):
        fname, ext = f"block-{k:03d}.onnx", f"block-{k:03d}.weights"
        tensors, off = [], 0
        for iname, tname in inits:
            a = w[tname]
            if parts and tname == "lm_head.weight":
                a = a[:, :vocab // parts]  # the part's shape (its values are absent)
            if embedded:
                t = helper.make_tensor(iname, TensorProto.FLOAT, a.shape, a.tobytes(), raw=True)
            else:
                t = TensorProto(name=iname, data_type=TensorProto.FLOAT, dims=a.shape)
                t.data_location = TensorProto.EXTERNAL
                for key, val in (("location", ext), ("offset", str(off)), ("length", str(a.nbytes))):
                    e = t.external_data.add()
                    e.key, e.value = key, val
                off += a.nbytes
            tensors.append(t)
        graph = helper.make_graph(nodes, name, ins, outs, initializer=tensors)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="sluice tests/onnx/make_blocks.py")
        model.ir_version = 8
        data = model.SerializeToString()
        with open(os.path.join(out_dir, fname), "wb") as f:
            f.write(data)
        b = {"name": name, "file": fname, "sha256": hashlib.sha256(data).hexdigest(),
             "inputs": [i.name for i in ins], "outputs": [o.name for o in outs],
             "initializers": [{"name": i, "tensor": t, "dtype": "F32", "shape": list(w[t].shape)}
                              for i, t in inits]}
        if parts and name == "lm_head":
            b["initializers"][0]["shape"][1] //= parts
            b["initializers"][0]["part"] = {"dim": 1, "n": parts}
            b["join_axis"] = 2
        if parts and name == "model.embed_tokens":
            b["gather"] = {"initializer": inits[0][0], "indices": "input_ids"}
        if not embedded:
            b["external_data"] = ext
            open(os.path.join(out_dir, ext), "wb").close()
        plan["blocks"].append(b)
    with open(os.path.join(out_dir, "plan.json"), "w") as f:
        json.dump(plan, f, indent=1)
    return plan


def main(argv):
    wdir, xdir, edir = argv[1:4]
    w = weights()
    os.makedirs(wdir, exist_ok=True)
    write_safetensors(os.path.join(wdir, "model.safetensors"), w)
    export(xdir, w, embedded=False)
    export(edir, w, embedded=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
