#!/usr/bin/python3
"""The Llama-style transformer of tiny_transformer.py (and its Qwen2
variant: q/k/v biases, tied embedding) exported as TorchScript blocks
without weights, then run with weights that sluice reads and verifies on
demand, one block ahead, and compared with eager torch, bit for bit.

    build-release/sluice synth tiny /tmp/tiny
    /usr/bin/python3 examples/python/torchscript_blocks.py export tiny /tmp/tiny-ts
    /usr/bin/python3 examples/python/torchscript_blocks.py run tiny /tmp/tiny-ts /tmp/tiny \\
        --pool 256K --steps 3

`export` writes /tmp/tiny-ts/plan.json and one block-NNN.pt per block
(embedding, each layer, final norm, head: a few KB each, no weights);
with --vocab-parts N the head runs in N vocabulary parts and the
embedding reads the prompt's rows (plan version 2: a pool smaller than
the embedding);
`run` runs them through sluice.torch.ScriptedModel and through the eager
model (filled by plain torch from the files) for the prompt and --steps
greedy decode steps, prints per step the token and the SHA-256 of the
logits (what examples/torchscript_engine prints for the same inputs), and
exits 1 unless every step is equal. `bench` times the three ways of
running the same model (see bench's --help).

Presets: tiny and qwen2.5-0.5b (the shapes of `sluice synth`'s presets).
The module is importable without sluice (the C++ engine's test uses its
model and export alone).
"""
import argparse
import hashlib
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_transformer as tt  # noqa: E402

PRESETS = {
    "tiny": dict(tt.TINY, qkv_bias=False, tied=False),
    "qwen2.5-0.5b": dict(vocab=151936, hidden=896, layers=24, intermediate=4864, heads=14,
                         kv_heads=2, head_dim=64, qkv_bias=True, tied=True),
    # Not a `sluice synth` preset: 110 MB of weights in layers of 17 MB,
    # for the resident-memory tests (which write its weights themselves).
    "mid": dict(vocab=2048, hidden=1024, layers=6, intermediate=2048, heads=16, kv_heads=4,
                head_dim=64, qkv_bias=False, tied=False),
    # Not a `sluice synth` preset either: qwen2.5-0.5b's shape in small (a
    # tied embedding of most of the weights), for the tests of the
    # vocabulary in pieces (which write its weights themselves).
    "tiny-tied": dict(vocab=8192, hidden=64, layers=2, intermediate=128, heads=4, kv_heads=2,
                      head_dim=16, qkv_bias=True, tied=True),
}


class BiasLinear(tt.Linear):
    """Linear with a bias (Qwen2's q/k/v projections)."""

    def __init__(self, n_in, n_out, device, spec=tt.BITS):
        super().__init__(n_in, n_out, device, spec)
        self.bias = tt._param((n_out,), spec, device)

    def forward(self, x):
        return F.linear(x, tt.use(self.weight, self.values), tt.use(self.bias, self.values))


class TiedHead(nn.Module):
    """The head of a tied model: the embedding's weight, not a parameter
    of its own (the files have no lm_head.weight)."""

    def __init__(self, embedding):
        super().__init__()
        self._embedding = (embedding,)  # a tuple: not registered as a submodule

    def forward(self, x):
        e = self._embedding[0]
        return F.linear(x, tt.use(e.weight, e.values))


def config(preset, dtype="BF16", values=False):
    """A preset's config with the weights' dtype (a safetensors name) and
    kind: random bits (tame()d) or values (`sluice synth --values`)."""
    return dict(PRESETS[preset], dtype=DTYPES[dtype], values=values)


DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def build(cfg, device="cpu"):
    """The eager model of a preset's config."""
    m = tt.TinyLlama(cfg, device)
    if cfg.get("qkv_bias"):
        h, hd, sp = cfg["hidden"], cfg["head_dim"], tt.spec_of(cfg)
        for layer in m.model.layers:
            a = layer.self_attn
            a.q_proj = BiasLinear(h, cfg["heads"] * hd, device, sp)
            a.k_proj = BiasLinear(h, cfg["kv_heads"] * hd, device, sp)
            a.v_proj = BiasLinear(h, cfg["kv_heads"] * hd, device, sp)
    if cfg.get("tied"):
        m.lm_head = TiedHead(m.model.embed_tokens)
    return m


def blocks(model, cfg):
    """The blocks, in execution order, for export_blocks: the embedding,
    each layer, the final norm, the head (for a tied model, a Linear whose
    weight binds to the embedding's tensor)."""
    out = ["model.embed_tokens"] + [f"model.layers.{i}" for i in range(cfg["layers"])]
    out.append("model.norm")
    if cfg.get("tied"):
        out.append(("lm_head", tt.Linear(cfg["hidden"], cfg["vocab"], "meta", tt.spec_of(cfg)),
                    {"weight": "model.embed_tokens.weight"}))
    else:
        out.append("lm_head")
    return out


def prompt(cfg, n=12):
    return [(7 * i + 3) % cfg["vocab"] for i in range(n)]


def digest(logits):
    """SHA-256 of the logits as float32 in C order (the C++ engine's)."""
    return hashlib.sha256(logits.float().contiguous().numpy().tobytes()).hexdigest()


def greedy(fn, tokens, steps):
    """[(token, logits)] for the prompt and each decode step: each step
    appends the argmax and runs the whole sequence again."""
    seq, out = list(tokens), []
    with torch.no_grad():
        for _ in range(steps + 1):
            logits = fn(torch.tensor([seq], dtype=torch.long))
            nxt = int(logits[0, -1].float().argmax())
            out.append((nxt, logits))
            seq.append(nxt)
    return out


def export(preset, out_dir, export_blocks, n_prompt=12, dtype="BF16", values=False,
           vocab_parts=0):
    """vocab_parts N > 0: the vocabulary in pieces (plan version 2): the
    head's weight in N parts along the vocabulary, the embedding read by
    the prompt's rows."""
    cfg = config(preset, dtype, values)
    m = build(cfg, "meta")
    ids = torch.tensor([prompt(cfg, n_prompt)], dtype=torch.long)
    if vocab_parts:
        return export_blocks(m, blocks(m, cfg), out_dir, ids, parts={"lm_head": vocab_parts},
                             gather_rows=True)
    return export_blocks(m, blocks(m, cfg), out_dir, ids)


def eager_model(preset, weights, dtype="BF16", values=False):
    """The eager model filled by plain torch (no sluice) from weights."""
    m = build(config(preset, dtype, values), "cpu")
    m.load_state_dict(tt.plain_torch_state_dict(weights))
    return m.eval()


def unbound_blocks(export_dir):
    """The exported blocks with every weight a zero tensor that holds no
    memory (a stride-0 view of one element), as one callable: the same
    code and working memory as a real run, without a byte of weight
    (libtorch's own resident size)."""
    import json
    with open(os.path.join(export_dir, "plan.json")) as f:
        plan = json.load(f)
    mods = []
    for b in plan["blocks"]:
        m = torch.jit.load(os.path.join(export_dir, b["file"]))
        for name, p in list(m.named_parameters()) + list(m.named_buffers()):
            *path, leaf = name.split(".")
            owner = m
            for part in path:
                owner = getattr(owner, part)
            setattr(owner, leaf, torch.zeros((), dtype=p.dtype).expand(p.shape))
        mods.append(m)

    def run(ids):
        x = ids
        for m in mods:
            x = m(x)
        return x
    return run


def cmd_export(args):
    import sluice.torch as st
    plan = export(args.preset, args.out, st.export_blocks, args.prompt_len, args.dtype,
                  args.values, args.vocab_parts)
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print(f"{len(plan['blocks'])} blocks, {sum(len(b['params']) for b in plan['blocks'])} "
          f"parameters, {size} bytes in {args.out}")
    return 0


def cmd_run(args):
    import sluice.torch as st
    cfg = PRESETS[args.preset]
    toks = prompt(cfg, args.prompt_len)
    with st.ScriptedModel(args.export, args.weights, pool=args.pool) as sm:
        got = greedy(sm, toks, args.steps)
        stats = sm.stats()
        resident = sm.resident
    want = greedy(eager_model(args.preset, args.weights, args.dtype, args.values), toks,
                  args.steps)
    ok = True
    for step, ((t, lg), (te, le)) in enumerate(zip(got, want)):
        same = t == te and torch.equal(lg, le)
        ok = ok and same
        print(f"step {step} token {t} logits_sha256 {digest(lg)} equal to eager: {same}")
    print(f"pool {args.pool} (resident={resident}): {stats['tensors_verified']} verified, "
          f"pool high water {stats['pool_high_water']} bytes")
    return 0 if ok else 1


def _rss_kb(field="VmHWM"):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def cmd_bench_one(args):
    """One way, in this process: prints first-token and whole-run times."""
    cfg = config(args.preset, args.dtype, args.values)
    toks = prompt(cfg, args.prompt_len)
    base = _rss_kb("VmRSS")
    t0 = time.perf_counter()
    first = []

    def step_timer(fn):
        def run(ids):
            out = fn(ids)
            if not first:
                first.append(time.perf_counter() - t0)
            return out
        return run

    with torch.no_grad():
        if args.way == "scripted":
            import sluice.torch as st
            sm = st.ScriptedModel(args.export, args.weights, pool=args.pool)
            out = greedy(step_timer(sm), toks, args.steps)
            sm.close()
        elif args.way == "eager":
            import sluice.torch as st
            m = build(cfg, "meta")
            st.load_state_dict(m, args.weights)
            out = greedy(step_timer(m.eval()), toks, args.steps)
        elif args.way == "jit":  # torch.jit.load of a module saved with its weights
            m = torch.jit.load(args.export)
            out = greedy(step_timer(m), toks, args.steps)
        else:  # baseline: the blocks with zero weights holding no memory, no sluice
            out = greedy(step_timer(unbound_blocks(args.export)), toks, args.steps)
    total = time.perf_counter() - t0
    # the last step's token and logits digest: the ways compared give the same
    print(f"{args.way}: first_token_ms {first[0] * 1e3:.1f} total_ms {total * 1e3:.1f} "
          f"rss_base_kb {base} peak_rss_kb {_rss_kb()} token {out[-1][0]} "
          f"logits_sha256 {digest(out[-1][1])[:16]}")
    return 0


def cmd_save_jit(args):
    """A whole scripted model saved WITH its weights (the torch.jit.load
    baseline of bench)."""
    cfg = config(args.preset, args.dtype, args.values)
    m = eager_model(args.preset, args.weights, args.dtype, args.values)
    if cfg.get("tied"):  # TiedHead does not script: a Linear sharing the parameter
        head = tt.Linear(cfg["hidden"], cfg["vocab"], "meta", tt.spec_of(cfg))
        head.weight = m.model.embed_tokens.weight
        m.lm_head = head
    torch.jit.save(torch.jit.script(m), args.out)
    print(f"{args.out}: {os.path.getsize(args.out)} bytes")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="write the blocks and plan.json (no weights)")
    e.add_argument("preset", choices=sorted(PRESETS))
    e.add_argument("out")
    e.add_argument("--vocab-parts", type=int, default=0, metavar="N",
                   help="the vocabulary in pieces (plan version 2): the head in N parts along "
                   "the vocabulary, each bound alone (give the weights' manifest their part "
                   "digests: sluice manifest --parts builtin --worlds N), the embedding read "
                   "by the prompt's rows; so a pool smaller than the embedding runs the model")
    r = sub.add_parser("run", help="ScriptedModel against eager torch, per decode step")
    r.add_argument("preset", choices=sorted(PRESETS))
    r.add_argument("export")
    r.add_argument("weights")
    r.add_argument("--pool", default="256K")
    r.add_argument("--steps", type=int, default=3)
    s = sub.add_parser("save-jit", help="a scripted whole model saved with its weights")
    s.add_argument("preset", choices=sorted(PRESETS))
    s.add_argument("weights")
    s.add_argument("out")
    b = sub.add_parser("bench-one", help="time one way: scripted (EXPORT is the export dir; "
                       "resident when every weight fits in --pool), eager (load_state_dict, "
                       "resident; EXPORT unused), jit (EXPORT is save-jit's file), baseline "
                       "(EXPORT's blocks with zero weights, no sluice; WEIGHTS unused)")
    b.add_argument("way", choices=["scripted", "eager", "jit", "baseline"])
    b.add_argument("preset", choices=sorted(PRESETS))
    b.add_argument("export")
    b.add_argument("weights")
    b.add_argument("--pool", default="512M")
    b.add_argument("--steps", type=int, default=4)
    for p in (e, r, b):
        p.add_argument("--prompt-len", type=int, default=12)
    for p in (e, r, s, b):
        p.add_argument("--dtype", choices=sorted(DTYPES), default="BF16",
                       help="the weights' dtype (sluice synth --dtype; default BF16)")
        p.add_argument("--values", action="store_true",
                       help="the weights are values (sluice synth --values), used as they "
                       "are; default: random bits, tame()d in every forward")
    args = ap.parse_args()
    return {"export": cmd_export, "run": cmd_run, "save-jit": cmd_save_jit,
            "bench-one": cmd_bench_one}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
