#!/usr/bin/python3
"""A small Llama-style transformer run three ways on the same weights:

  1. eager: built on the CPU and filled by plain torch from the
     .safetensors files (json header + torch.frombuffer, no sluice);
  2. sluice.torch.lazy_load: built on the meta device, each layer's
     weights read and verified just before it runs, within a budget
     smaller than the model;
  3. sluice.torch.load_state_dict: built on the meta device and filled at
     once, zero copy.

It prints the three outputs' agreement and exits 1 unless they are equal.

    build-release/sluice synth tiny /tmp/tiny       # 39 tensors, 624 KB, BF16
    /usr/bin/python3 examples/python/tiny_transformer.py /tmp/tiny

The weights of `sluice synth` are pseudo-random bit patterns, not trained
values: as BF16 many are huge or NaN. Every weight goes through tame()
(tanh of the value, NaN as 0, scaled) before use, so that the output is a
finite function of the exact bytes: any wrong byte changes it.

`sluice synth --values` writes finite weights of a trained model's spread
instead; a model built with values=True (WeightSpec) uses them as they
are, as a real engine does: float32 weights are used in place, with no
conversion in any forward (BF16/F16 ones are widened to float32 as they
are used).
"""
import argparse
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F
from torch import nn


def tame(w):
    return torch.tanh(torch.nan_to_num(w.float(), nan=0.0, posinf=1.0, neginf=-1.0)) * 0.2


def use(w, values: bool):
    """A weight as the computation takes it (float32): as it is when the
    weights are values (no copy for float32 ones), else tame()d."""
    return w.float() if values else tame(w)


# The weights' dtype and whether they are values (`sluice synth --values`)
# or random bits (tame()d): read from a config's "dtype" and "values".
BITS = (torch.bfloat16, False)


def spec_of(cfg):
    return (cfg.get("dtype", torch.bfloat16), bool(cfg.get("values", False)))


def _param(shape, spec, device):
    return nn.Parameter(torch.empty(*shape, dtype=spec[0], device=device), requires_grad=False)


class Linear(nn.Module):
    def __init__(self, n_in, n_out, device, spec=BITS):
        super().__init__()
        self.values = spec[1]
        self.weight = _param((n_out, n_in), spec, device)

    def forward(self, x):
        return F.linear(x, use(self.weight, self.values))


class RMSNorm(nn.Module):
    def __init__(self, n, device, spec=BITS):
        super().__init__()
        self.values = spec[1]
        self.weight = _param((n,), spec, device)

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * (1.0 + use(self.weight, self.values))


class Embedding(nn.Module):
    def __init__(self, vocab, hidden, device, spec=BITS):
        super().__init__()
        self.values = spec[1]
        self.weight = _param((vocab, hidden), spec, device)

    def forward(self, ids):
        if self.values:     # only the rows asked for
            return F.embedding(ids, self.weight).float()
        return F.embedding(ids, tame(self.weight))


class Attention(nn.Module):
    def __init__(self, cfg, device):
        super().__init__()
        h, hd, sp = cfg["hidden"], cfg["head_dim"], spec_of(cfg)
        self.heads, self.kv_heads, self.head_dim = cfg["heads"], cfg["kv_heads"], hd
        self.q_proj = Linear(h, self.heads * hd, device, sp)
        self.k_proj = Linear(h, self.kv_heads * hd, device, sp)
        self.v_proj = Linear(h, self.kv_heads * hd, device, sp)
        self.o_proj = Linear(self.heads * hd, h, device, sp)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) / self.head_dim ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg, device):
        super().__init__()
        h, i, sp = cfg["hidden"], cfg["intermediate"], spec_of(cfg)
        self.gate_proj = Linear(h, i, device, sp)
        self.up_proj = Linear(h, i, device, sp)
        self.down_proj = Linear(i, h, device, sp)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg, device):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden"], device, spec_of(cfg))
        self.self_attn = Attention(cfg, device)
        self.post_attention_layernorm = RMSNorm(cfg["hidden"], device, spec_of(cfg))
        self.mlp = MLP(cfg, device)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, cfg, device):
        super().__init__()
        self.embed_tokens = Embedding(cfg["vocab"], cfg["hidden"], device, spec_of(cfg))
        self.layers = nn.ModuleList(Layer(cfg, device) for _ in range(cfg["layers"]))
        self.norm = RMSNorm(cfg["hidden"], device, spec_of(cfg))

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class TinyLlama(nn.Module):
    """The layout of `sluice synth tiny` (and of Llama checkpoints):
    model.embed_tokens, model.layers.N.{self_attn,mlp,...}, model.norm,
    lm_head (untied)."""

    def __init__(self, cfg, device="cpu"):
        super().__init__()
        self.model = Body(cfg, device)
        self.lm_head = Linear(cfg["hidden"], cfg["vocab"], device, spec_of(cfg))

    def forward(self, ids):
        return self.lm_head(self.model(ids))


# The tiny preset (tools/presets.c): vocabulary 512, hidden 64, 4 layers,
# intermediate 256, 4 heads, 2 KV heads, head_dim 16.
TINY = dict(vocab=512, hidden=64, layers=4, intermediate=256, heads=4, kv_heads=2, head_dim=16)


def plain_torch_state_dict(path):
    """Every tensor of a .safetensors file or directory of shards, read
    with json + struct + torch only: the eager reference."""
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
    dtypes = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    sd = {}
    for fname in files:
        with open(fname, "rb") as f:
            data = f.read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        header.pop("__metadata__", None)
        for name, e in header.items():
            b, end = e["data_offsets"]
            raw = bytearray(data[8 + n + b:8 + n + end])
            sd[name] = torch.frombuffer(raw, dtype=dtypes[e["dtype"]]).reshape(e["shape"])
    return sd


def run(path, budget="256K", tokens=None):
    """Returns (eager, lazy, loaded) logits and the lazy loader's stats."""
    import sluice.torch as st
    ids = tokens if tokens is not None else torch.arange(24).remainder(TINY["vocab"]).view(2, 12)
    with torch.no_grad():
        eager_model = TinyLlama(TINY, "cpu")
        eager_model.load_state_dict(plain_torch_state_dict(path))
        eager = eager_model(ids)

        lazy_model = TinyLlama(TINY, "meta")
        loader = st.lazy_load(lazy_model, path, budget=budget)
        lazy = lazy_model(ids)
        lazy2 = lazy_model(ids)  # the second call reads ahead in the learned order
        stats = loader.stats()
        loader.detach()

        loaded_model = TinyLlama(TINY, "meta")
        st.load_state_dict(loaded_model, path)
        loaded = loaded_model(ids)
    assert torch.equal(lazy, lazy2)
    return eager, lazy, loaded, stats, loader


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="output of `sluice synth tiny DIR`")
    ap.add_argument("--budget", default="256K", help="lazy_load budget (default 256K)")
    args = ap.parse_args()
    eager, lazy, loaded, stats, loader = run(args.model, args.budget)
    print(f"logits {tuple(eager.shape)}, eager[0, -1, :4] = {eager[0, -1, :4].tolist()}")
    print(f"lazy_load (budget {args.budget}, weights {loader.total_bytes} bytes, "
          f"resident={loader.resident}): equal to eager: {torch.equal(eager, lazy)}; "
          f"{stats['tensors_loaded']} reads, {stats['tensors_verified']} verified, "
          f"pool high water {stats['pool_high_water']} bytes")
    print(f"load_state_dict: equal to eager: {torch.equal(eager, loaded)}")
    ok = torch.equal(eager, lazy) and torch.equal(eager, loaded) and bool(eager.isfinite().all())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
