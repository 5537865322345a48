"""sluice.onnx.export_blocks: ONNX blocks whose weights are initializers
with external, absent data; the plan maps each to its safetensors tensor
(exactly, though the exporter renames, deduplicates and folds); no weight
rewritten by the graph (each mapped initializer is the tensor byte for
byte); the embedded variant is the same graph with the weights in it;
errors are clear. Skipped when torch or onnx is absent. (ONNX Runtime
itself runs these graphs in the C engine's test: its Python package is
not in Debian.)"""
import copy
import hashlib
import json
import os
import struct
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")
onnx = pytest.importorskip("onnx", reason="onnx is not installed (Debian: python3-onnx)")

import sluice  # noqa: E402
import sluice.onnx as so  # noqa: E402
import stfile  # noqa: E402
from conftest import REPO  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "examples", "python"))
import onnx_blocks as ob  # noqa: E402

EXAMPLE = os.path.join(REPO, "examples", "python", "onnx_blocks.py")
CFG = ob.PRESETS["tiny"]
# The Qwen2 variant at the tiny size: q/k/v biases, the head tied to the embedding.
TIED = dict(CFG, qkv_bias=True, tied=True)
IDS = torch.tensor([ob.tb.prompt(CFG)])


def write_weights(d, cfg, seed=0):
    os.makedirs(d, exist_ok=True)
    tensors = ob.make_weights(cfg, seed)
    stfile.write(os.path.join(d, "model.safetensors"), tensors)
    return os.path.join(d, "model.safetensors")


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)}, read with struct + json only."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (e["dtype"], e["shape"], data[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])
            for k, e in header.items()}


def model_on(cfg, weights, device):
    m = ob.build(cfg, device)
    if device != "meta":
        sd = {k: torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape)
              for k, (_dt, shape, raw) in read_safetensors(weights).items()}
        m.load_state_dict(sd)
    return m.eval()


def export(cfg, weights, d, embed=False):
    m = model_on(cfg, weights, "cpu" if embed else "meta")
    return so.export_blocks(m, ob.blocks(m, cfg), d, IDS, embed_weights=embed)


@pytest.fixture(scope="module", params=["tiny", "tied"])
def exported(request, tmp_path_factory):
    """(cfg, weights file, external export dir, embedded export dir)."""
    cfg = CFG if request.param == "tiny" else TIED
    base = tmp_path_factory.mktemp(request.param)
    weights = write_weights(str(base / "weights"), cfg)
    ext, emb = str(base / "blocks"), str(base / "embedded")
    export(cfg, weights, ext)
    export(cfg, weights, emb, embed=True)
    return cfg, weights, ext, emb


def plan_of(d):
    with open(os.path.join(d, "plan.json")) as f:
        return json.load(f)


def graph(d, block):
    return onnx.load(os.path.join(d, block["file"]), load_external_data=False)


ONNX_DTYPES = {"F32": onnx.TensorProto.FLOAT, "F16": onnx.TensorProto.FLOAT16,
               "BF16": onnx.TensorProto.BFLOAT16, "F64": onnx.TensorProto.DOUBLE}


def test_plan_maps_every_initializer(exported):
    cfg, weights, ext, _emb = exported
    plan = plan_of(ext)
    assert plan["format"] == "sluice-onnx-plan" and plan["version"] == 1
    assert plan["torch"] == torch.__version__ and plan["onnx"] == onnx.__version__
    assert plan["opset"] == 17
    assert plan["inputs"] == [{"name": "input_ids", "dtype": "I64", "shape": [1, 12]}]
    assert [b["name"] for b in plan["blocks"]] == (
        ["model.embed_tokens"] + [f"model.layers.{i}" for i in range(4)] + ["model.norm", "lm_head"])
    st = read_safetensors(weights)
    prev = [i["name"] for i in plan["inputs"]]
    for k, b in enumerate(plan["blocks"]):
        assert b["file"] == f"block-{k:03d}.onnx" and b["external_data"] == f"block-{k:03d}.weights"
        path = os.path.join(ext, b["file"])
        with open(path, "rb") as f:
            assert b["sha256"] == hashlib.sha256(f.read()).hexdigest()
        g = graph(ext, b).graph
        assert [i.name for i in g.input] == b["inputs"] and len(b["inputs"]) == len(prev)
        assert [o.name for o in g.output] == b["outputs"]
        prev = b["outputs"]
        external = {t.name: t for t in g.initializer
                    if t.data_location == onnx.TensorProto.EXTERNAL}
        assert sorted(external) == sorted(i["name"] for i in b["initializers"]), b["name"]
        for i in b["initializers"]:
            t = external[i["name"]]
            dtype, shape, _raw = st[i["tensor"]]
            assert (i["dtype"], i["shape"]) == (dtype, shape)
            assert list(t.dims) == shape and t.data_type == ONNX_DTYPES[dtype]
            ed = {e.key: e.value for e in t.external_data}
            assert ed["location"] == b["external_data"] and int(ed["length"]) == len(_raw)
    mapped = [i["tensor"] for b in plan["blocks"] for i in b["initializers"]]
    assert sorted(set(mapped)) == sorted(st)  # every tensor, none invented
    if cfg.get("tied"):
        head = plan["blocks"][-1]["initializers"]
        assert [i["tensor"] for i in head] == ["model.embed_tokens.weight"]
        assert mapped.count("model.embed_tokens.weight") == 2
        assert "model.layers.0.self_attn.q_proj.bias" in mapped
    else:
        assert len(mapped) == len(st) == 39


def test_no_weight_rewritten(exported):
    """Each mapped initializer of the embedded export is its safetensors
    tensor byte for byte, and is used as it is: no Transpose takes it,
    and no node takes only constants with it among them."""
    _cfg, weights, _ext, emb = exported
    st = read_safetensors(weights)
    n = 0
    for b in plan_of(emb)["blocks"]:
        g = onnx.load(os.path.join(emb, b["file"])).graph
        inits = {t.name: t for t in g.initializer}
        names = {i["name"] for i in b["initializers"]}
        for i in b["initializers"]:
            assert inits[i["name"]].raw_data == st[i["tensor"]][2], (b["name"], i)
            n += 1
        consts = set(inits) | {o for nd in g.node if nd.op_type == "Constant" for o in nd.output}
        for nd in g.node:
            ws = [x for x in nd.input if x in names]
            if ws:
                assert nd.op_type in ("Gemm", "Gather", "Mul", "Add"), (nd.op_type, ws)
                assert not all(x in consts for x in nd.input if x), nd.name
            if nd.op_type == "Gemm" and len(nd.input) > 1 and nd.input[1] in names:
                assert {a.name: a.i for a in nd.attribute}.get("transB") == 1
    assert n >= 39


def test_external_data_absent(exported):
    _cfg, weights, ext, _emb = exported
    wbytes = os.path.getsize(weights)
    total = 0
    for b in plan_of(ext)["blocks"]:
        path = os.path.join(ext, b["file"])
        size = os.path.getsize(path)
        assert size < 64 << 10, (b["file"], size)  # kilobytes: no weight inside
        total += size
        ph = os.path.join(ext, b["external_data"])
        assert os.path.isfile(ph) and os.path.getsize(ph) == 0  # exists, empty
        g = graph(ext, b).graph
        names = {i["name"] for i in b["initializers"]}
        for t in g.initializer:
            if t.name in names:
                assert not t.raw_data and t.data_location == onnx.TensorProto.EXTERNAL
            else:  # a constant of the graph: embedded
                assert t.data_location == onnx.TensorProto.DEFAULT
        onnx.checker.check_model(path)
    assert total < wbytes / 5, (total, wbytes)


def strip_weights(model, names):
    m = copy.deepcopy(model)
    for t in m.graph.initializer:
        if t.name in names:
            t.ClearField("raw_data")
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
    return m.SerializeToString()


def test_embedded_is_the_same_graph(exported):
    _cfg, _weights, ext, emb = exported
    pe, pm = plan_of(ext), plan_of(emb)
    for be, bm in zip(pe["blocks"], pm["blocks"]):
        assert bm["external_data"] is None
        assert not os.path.exists(os.path.join(emb, be["external_data"]))
        assert {k: v for k, v in be.items() if k not in ("sha256", "external_data")} == \
            {k: v for k, v in bm.items() if k not in ("sha256", "external_data")}
        m = onnx.load(os.path.join(emb, bm["file"]))
        onnx.checker.check_model(m, full_check=True)
        names = {i["name"] for i in be["initializers"]}
        assert strip_weights(m, names) == strip_weights(graph(ext, be), names)


def test_export_is_deterministic_and_leaves_the_model_alone(exported, tmp_path):
    cfg, weights, ext, _emb = exported
    m = model_on(cfg, weights, "cpu")
    m.train()
    before = {k: (v.data_ptr(), v.clone()) for k, v in m.state_dict().items()}
    params = {k: id(v) for k, v in m.named_parameters()}
    so.export_blocks(m, ob.blocks(m, cfg), str(tmp_path / "again"), IDS)
    assert m.training and all(x.training for x in m.modules())
    assert {k: id(v) for k, v in m.named_parameters()} == params
    for k, v in m.state_dict().items():
        assert v.data_ptr() == before[k][0] and torch.equal(v, before[k][1])
    again = plan_of(str(tmp_path / "again"))
    assert again == plan_of(ext)  # the same files, to the digest


class Pair(torch.nn.Module):
    """Two norms whose weights are equal in the checkpoint (ones), and a
    projection whose weight object two Linears share."""

    def __init__(self):
        super().__init__()
        self.n1 = torch.nn.Parameter(torch.ones(8), requires_grad=False)
        self.n2 = torch.nn.Parameter(torch.ones(8), requires_grad=False)
        self.a = torch.nn.Linear(8, 8, bias=False)
        self.b = torch.nn.Linear(8, 8, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x * self.n1) * self.n2)


def test_equal_weights_not_merged_tied_object_one(tmp_path):
    """The exporter merges initializers of equal value: two norms of ones
    would become one, leaving a tensor unread. Fingerprints keep them
    apart; one shared object stays one initializer, mapped to its first
    slot's tensor."""
    m = torch.nn.Sequential()
    m.add_module("blk", Pair())
    plan = so.export_blocks(m, ["blk"], str(tmp_path / "p"), torch.randn(1, 3, 8),
                            embed_weights=True)
    inits = plan["blocks"][0]["initializers"]
    assert sorted(i["tensor"] for i in inits) == ["blk.a.weight", "blk.n1", "blk.n2"]
    g = onnx.load(str(tmp_path / "p" / "block-000.onnx")).graph
    assert not [n for n in g.node if n.op_type in ("Identity", "Transpose")]
    vals = {t.name: t.raw_data for t in g.initializer}
    for i in inits:
        want = dict(m.named_parameters())[i["tensor"]]
        assert vals[i["name"]] == want.detach().numpy().tobytes()


class Tamed(torch.nn.Module):
    """A graph that computes from its weight: torch folds the scaling into
    a new initializer; it leaves tanh in the graph, where ONNX Runtime
    would fold it into a copy."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        self.weight = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False)

    def forward(self, x):
        return x @ (torch.tanh(self.weight) if self.op == "tanh" else self.weight * 0.5)


class IntBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("pos", torch.arange(4))
        self.weight = torch.nn.Parameter(torch.randn(4), requires_grad=False)

    def forward(self, x):
        return x * self.weight + self.pos


def seq(**mods):
    m = torch.nn.Sequential()
    for k, v in mods.items():
        m.add_module(k, v)
    return m


def test_errors_are_clear(tmp_path):
    d = str(tmp_path / "e")
    m = ob.build(CFG, "meta")
    with pytest.raises(ValueError, match=r"has no submodule 'model\.layers\.9'"):
        so.export_blocks(m, ["model.embed_tokens", "model.layers.9"], d, IDS)
    with pytest.raises(ValueError, match="example_inputs is needed"):
        so.export_blocks(m, ["model.embed_tokens"], d, None)
    with pytest.raises(ValueError, match="opset must be 14 to 17"):
        so.export_blocks(m, ["model.embed_tokens"], d, IDS, opset=18)
    with pytest.raises(ValueError, match="two blocks have the same name"):
        so.export_blocks(m, ["model.norm", "model.norm"], d, IDS)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        so.export_blocks(object(), ["x"], d, IDS)
    x = torch.randn(2, 4)
    with pytest.raises(so.ExportError, match=r"block 't': initializer .* is computed from the "
                       r"weights \(used by MatMul .*rewrites a weight"):
        so.export_blocks(seq(t=Tamed("scale")), ["t"], d, x)
    with pytest.raises(so.ExportError, match=r"block 't': Tanh '/Tanh' takes only constants, "
                       r"weight 'weight' among them: ONNX Runtime would fold it into a copy"):
        so.export_blocks(seq(t=Tamed("tanh")), ["t"], d, x)
    with pytest.raises(so.ExportError, match=r"block 'i': 'pos' is torch.int64: only "
                       r"floating-point weights"):
        so.export_blocks(seq(i=IntBuffer()), ["i"], d, x)
    with pytest.raises(so.ExportError, match=r"embed_weights needs the weights: "
                       r"'weight' is on the meta device"):
        so.export_blocks(m, ["model.norm"], d, torch.randn(1, 12, 64), embed_weights=True)
    assert not os.path.exists(os.path.join(d, "plan.json"))  # nothing half-written claims a plan


def test_training_mode_exports_eval(tmp_path):
    """A model in training mode is exported in eval mode (no Dropout in
    the graph) and left in training mode."""
    m = seq(blk=torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)))
    m.train()
    so.export_blocks(m, ["blk"], str(tmp_path / "t"), torch.randn(2, 3, 4))
    g = onnx.load(str(tmp_path / "t" / "block-000.onnx"), load_external_data=False).graph
    assert "Dropout" not in {n.op_type for n in g.node}
    assert m.training and m.blk[1].training


def test_example_makes_the_engine_fixture(tmp_path):
    d = str(tmp_path / "fx")
    r = subprocess.run([sys.executable, EXAMPLE, "make", d], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for sub in ("blocks", "embedded"):
        assert len(plan_of(os.path.join(d, sub))["blocks"]) == 7
    with open(os.path.join(d, "eager.json")) as f:
        eager = json.load(f)
    assert [s["step"] for s in eager["steps"]] == [0, 1, 2, 3]
    assert eager["steps"][0]["input"] == eager["prompt"] and len(eager["prompt"]) == 12
    for s in eager["steps"]:
        assert s["input"] == eager["prompt"] + [t["token"] for t in eager["steps"][:s["step"]]]
        with open(os.path.join(d, s["logits"]), "rb") as f:
            raw = f.read()
        assert len(raw) == 4 * 512 * len(s["input"]) and s["shape"] == [1, len(s["input"]), 512]
        assert hashlib.sha256(raw).hexdigest() == s["logits_sha256"] and s["margin"] > 0
    with sluice.open(os.path.join(d, "weights")) as m:  # the manifest covers every tensor
        assert len(m.keys()) == 39
        for name in m.keys():
            m.get_tensor(name)
        assert m.stats()["tensors_verified"] == 39
