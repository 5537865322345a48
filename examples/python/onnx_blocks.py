#!/usr/bin/python3
"""The Llama-style transformer of tiny_transformer.py (and its Qwen2
variant: q/k/v biases, tied embedding) in float32 with plain weights,
exported as ONNX blocks whose weights are external and absent
(sluice.onnx.export_blocks), for an engine over ONNX Runtime that is given
the weights sluice reads and verifies (examples/onnx_engine.c).

    /usr/bin/python3 examples/python/onnx_blocks.py make /tmp/tiny-onnx [--preset tiny]
        [--steps 3] [--prompt-len 12] [--seed 0] [--sluice build-release/sluice]

`make DIR` writes:

    DIR/weights/model.safetensors       F32 weights, seeded pseudo-random values
    DIR/weights/sluice.manifest.json    its manifest (version 2 by --sluice CLI's
                                        `sluice manifest` or the binding's
                                        sluice.write_manifest; else flat SHA-256)
    DIR/blocks/plan.json                the plan (sluice-onnx-plan) and one
    DIR/blocks/block-NNN.onnx           graph per block, weights external and
    DIR/blocks/block-NNN.weights        absent (an empty placeholder each)
    DIR/embedded/plan.json, block-NNN.onnx   the same graphs, weights embedded
    DIR/pieces/plan.json, block-NNN.onnx     with --vocab-parts N: plan version 2,
                                        the head's graph on a vocab part [V/N, D]
                                        (run N times, joined), the embedding a
                                        "gather" block (the engine reads rows)
    DIR/eager.json                      eager torch (plain torch from the file):
    DIR/eager-NNN.f32                   the prompt and --steps greedy steps

eager.json: {"preset", "prompt": [token ids], "steps": [{"step", "input":
[the ids the step ran], "token" (the argmax of the last position), "shape",
"logits_sha256" (of the float32 logits in C order, as the engines print
it), "logits" (the file of those logits, raw little-endian float32),
"margin" (top-1 minus top-2 logit at the last position)}]}. Each step runs
the whole sequence again (no KV cache), as the TorchScript engine does.

The weights are plain (no tame() as in tiny_transformer.py): a graph that
computed from its weights would rewrite them, which the export refuses.
Needs torch and onnx only (Debian: python3-torch python3-onnx); the sluice
binding is used for the manifest when it is importable and --sluice is
not given. Presets: tiny (default), mid, qwen2.5-0.5b (2 GB of F32).
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "bindings", "python", "tests"))
import stfile  # noqa: E402  (the tests' .safetensors writer: struct + json + NumPy)
import tiny_transformer as tt  # noqa: E402
import torchscript_blocks as tb  # noqa: E402

PRESETS = tb.PRESETS


def load_exporter():
    """sluice.onnx from this tree, by path: it needs torch and onnx only,
    not the binding (which the C engine's test runs before)."""
    name = "sluice_onnx"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(REPO, "bindings", "python", "sluice", "onnx.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[name] = mod
    return sys.modules[name]


class Linear(nn.Module):
    def __init__(self, n_in, n_out, device, bias=False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in, device=device), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(n_out, device=device), requires_grad=False) \
            if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, n, device):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, device=device), requires_grad=False)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Embedding(nn.Module):
    def __init__(self, vocab, hidden, device):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, hidden, device=device), requires_grad=False)

    def forward(self, ids):
        return F.embedding(ids, self.weight)


class TiedHead(nn.Module):
    """The head of a tied model: the embedding's weight, not a parameter
    of its own."""

    def __init__(self, embedding):
        super().__init__()
        self._embedding = (embedding,)  # a tuple: not registered as a submodule

    def forward(self, x):
        return F.linear(x, self._embedding[0].weight)


class Attention(tt.Attention):
    """tiny_transformer's attention with the key/value heads repeated by
    expand + reshape: torch 1.13 exports repeat_interleave with the
    example's shapes fixed, which fails at another sequence length."""

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k = k[:, :, None].expand(b, self.kv_heads, rep, t, self.head_dim).reshape(
            b, self.heads, t, self.head_dim)
        v = v[:, :, None].expand(b, self.kv_heads, rep, t, self.head_dim).reshape(
            b, self.heads, t, self.head_dim)
        att = (q @ k.transpose(-1, -2)) / self.head_dim ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(y)


def build(cfg, device="cpu"):
    """tiny_transformer's TinyLlama (torchscript_blocks' variants) with
    every weight float32 and used as it is."""
    m = tb.build(cfg, "meta")
    for layer in m.model.layers:
        layer.self_attn.__class__ = Attention
    for mod in list(m.modules()):
        for key, c in list(mod._modules.items()):
            if isinstance(c, tt.Linear):  # BiasLinear too
                out_f, in_f = c.weight.shape
                new = Linear(in_f, out_f, device, bias=getattr(c, "bias", None) is not None)
            elif isinstance(c, tt.RMSNorm):
                new = RMSNorm(c.weight.shape[0], device)
            elif isinstance(c, tt.Embedding):
                new = Embedding(*c.weight.shape, device)
            else:
                continue
            setattr(mod, key, new)
    if isinstance(m.lm_head, tb.TiedHead):
        m.lm_head = TiedHead(m.model.embed_tokens)
    return m


def blocks(model, cfg):
    """The blocks for export_blocks: embedding, layers, norm, head (for a
    tied model a Linear sharing the embedding's parameter, bound to its
    tensor)."""
    out = ["model.embed_tokens"] + [f"model.layers.{i}" for i in range(cfg["layers"])]
    out.append("model.norm")
    if cfg.get("tied"):
        head = Linear(cfg["hidden"], cfg["vocab"], "meta")
        head.weight = model.model.embed_tokens.weight
        out.append(("lm_head", head, {"weight": "model.embed_tokens.weight"}))
    else:
        out.append("lm_head")
    return out


def make_weights(cfg, seed):
    """{name: float32 ndarray}: seeded values of a trained model's scale
    (linear weights ~ 1/sqrt(fan_in), norms ~ 1), so that the logits have
    a clear argmax."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in build(cfg, "meta").state_dict().items():
        r = torch.randn(p.shape, generator=g)
        if name.endswith("norm.weight"):
            r = 1.0 + 0.1 * r
        elif name.endswith(".bias"):
            r = 0.02 * r
        elif "embed_tokens" not in name:
            r = r / p.shape[-1] ** 0.5
        out[name] = r.numpy()
    return out


def write_manifest(weights_dir, cli, worlds=0):
    """The version 2 manifest, by the CLI or the binding; else the flat one
    stfile wrote stays. worlds > 0 (the CLI or the binding): with the
    digests of the built-in rules' parts in that many (embed_tokens,
    lm_head: dim 0)."""
    out = os.path.join(weights_dir, "sluice.manifest.json")
    if cli:
        more = ["--parts", "builtin", "--worlds", str(worlds)] if worlds else []
        subprocess.run([cli, "manifest", weights_dir, "-o", out, "-q", *more], check=True)
        return "version 2 (sluice manifest)"
    try:
        import sluice
    except ImportError:
        return "flat (no --sluice, no binding)"
    more = {"parts": "builtin", "worlds": (worlds,)} if worlds else {}
    sluice.write_manifest(weights_dir, out, **more)
    return "version 2 (sluice.write_manifest)"


def eager_model(preset, weights_dir):
    m = build(PRESETS[preset], "cpu")
    m.load_state_dict(tt.plain_torch_state_dict(weights_dir))
    return m.eval()


def cmd_make(args):
    cfg = PRESETS[args.preset]
    ox = load_exporter()
    wdir = os.path.join(args.dir, "weights")
    os.makedirs(wdir, exist_ok=True)
    tensors = make_weights(cfg, args.seed)
    digests = stfile.write(os.path.join(wdir, "model.safetensors"), tensors)
    stfile.write_manifest(os.path.join(wdir, "sluice.manifest.json"), digests)
    manifest = write_manifest(wdir, args.sluice, args.vocab_parts)
    nbytes = sum(t.nbytes for t in tensors.values())
    del tensors

    toks = tb.prompt(cfg, args.prompt_len)
    ids = torch.tensor([toks], dtype=torch.long)
    meta = build(cfg, "meta")  # the export needs no weights
    plan = ox.export_blocks(meta, blocks(meta, cfg), os.path.join(args.dir, "blocks"), ids)
    if args.vocab_parts:  # plan version 2: the head in vocab parts, the embedding's rows
        ox.export_blocks(meta, blocks(meta, cfg), os.path.join(args.dir, "pieces"), ids,
                         parts={"lm_head": args.vocab_parts}, gather_rows=True)
    model = eager_model(args.preset, wdir)
    ox.export_blocks(model, blocks(model, cfg), os.path.join(args.dir, "embedded"), ids,
                     embed_weights=True)

    steps, seq = [], list(toks)
    for step, (tok, logits) in enumerate(tb.greedy(model, toks, args.steps)):
        fname = f"eager-{step:03d}.f32"
        logits = logits.float().contiguous()
        with open(os.path.join(args.dir, fname), "wb") as f:
            f.write(logits.numpy().tobytes())
        top = logits[0, -1].topk(2).values
        steps.append({"step": step, "input": list(seq), "token": tok, "shape": list(logits.shape),
                      "logits_sha256": tb.digest(logits), "logits": fname,
                      "margin": float(top[0] - top[1])})
        print(f"step {step} token {tok} logits_sha256 {steps[-1]['logits_sha256']}")
        seq.append(tok)
    with open(os.path.join(args.dir, "eager.json"), "w") as f:
        json.dump({"preset": args.preset, "prompt": toks, "steps": steps}, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(args.dir, "blocks", b["file"])) for b in plan["blocks"])
    print(f"{args.dir}: {len(plan['blocks'])} blocks, "
          f"{sum(len(b['initializers']) for b in plan['blocks'])} weight initializers, "
          f"{size} bytes of graphs for {nbytes} bytes of weights; manifest {manifest}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="weights, manifest, ONNX blocks (external and embedded), "
                        "eager logits, in DIR")
    mk.add_argument("dir")
    mk.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    mk.add_argument("--steps", type=int, default=3, help="greedy steps after the prompt (3)")
    mk.add_argument("--prompt-len", type=int, default=12)
    mk.add_argument("--vocab-parts", type=int, default=0, metavar="N",
                    help="also DIR/pieces: the head in N vocab parts, the embedding marked for "
                         "row reads (plan version 2); the manifest gets the parts' digests")
    mk.add_argument("--seed", type=int, default=0, help="of the weights' values (0)")
    mk.add_argument("--sluice", metavar="CLI", help="the sluice command, for a version 2 manifest")
    args = ap.parse_args()
    return {"make": cmd_make}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
