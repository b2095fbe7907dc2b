#!/usr/bin/env python3
"""switchyard beside ONNX Runtime and PyTorch eager on real models, in one run.

Times, per inference, with the same inputs:

- every model of the ONNX corpus that has inputs beside it
  (`../shared/onnx/models/*/` and `tests/data/onnx/*/`), against ONNX
  Runtime;
- three full-size transformers built here in plain PyTorch with random
  weights, batch 1, sequence 128: BERT-base, GPT-2 small (its `gelu_new`
  through `pow`, as Hugging Face writes it) and a 134M Llama-style model
  (RMSNorm through `pow`, RoPE by rotate-half with `cat`, SwiGLU), exported
  by torch.onnx's dynamo exporter at opset 18; against ONNX Runtime and
  PyTorch eager;
- the matrix products of those models (sequence 128, width 768), a packaged
  decoder's `Gemm` with `transB = 1` at 2 and 4 rows, and attention's
  batched products, each as a one-node ONNX model with its weight as an
  initializer; against ONNX Runtime (MLAS), with GFLOP/s.

switchyard runs `switchyard run MODEL --inputs FILE --repeat N --json` with
the default executors; ONNX Runtime the CPUExecutionProvider with
intra_op_num_threads = this machine's cores; PyTorch every core. With
--rounds N everything is measured N times, alternating, and the medians are
printed, with the machine's copy bandwidth measured in the same rounds.

    python3 benches/peers/models.py [--switchyard target/release/switchyard]
                                    [--only corpus,full,gemm] [--rounds N]
                                    [--keep DIR] [--json FILE]

Needs `pip install torch onnx onnxscript onnxruntime safetensors` (in a venv of its
own); switchyard itself needs none of them.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

from peers import timed  # noqa: E402 (beside this script)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPORA = [os.path.join(ROOT, "..", "shared", "onnx", "models"), os.path.join(ROOT, "tests", "data", "onnx")]
SEQ = 128


# ---------------------------------------------------------------- switchyard


def switchyard_time(binary, model, inputs, repeat):
    """Median seconds per inference, or the error's last line."""
    r = subprocess.run([binary, "run", model, "--inputs", inputs, "--repeat", str(repeat), "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
        return lines[-1] if lines else f"exit {r.returncode}"
    return json.loads(r.stdout)["time_ns"] / 1e9


# ---------------------------------------------------------------- ONNX Runtime


def ort_session(ort, path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count()
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def ort_time(ort, path, feeds):
    s = ort_session(ort, path)
    return timed(lambda: s.run(None, feeds))


# ---------------------------------------------------------------- full-size models in PyTorch


def full_models(torch):
    nn = torch.nn
    F = torch.nn.functional

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    class Attention(nn.Module):
        def __init__(self, width, heads, bias, causal, rope=None):
            super().__init__()
            self.heads, self.causal, self.rope = heads, causal, rope
            self.qkv = nn.Linear(width, 3 * width, bias=bias)
            self.out = nn.Linear(width, width, bias=bias)

        def forward(self, x):
            b, s, w = x.shape
            q, k, v = self.qkv(x).split(w, dim=-1)
            shape = (b, s, self.heads, w // self.heads)
            q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
            if self.rope is not None:
                q, k = self.rope(q), self.rope(k)
            scores = q @ k.transpose(-1, -2) / math.sqrt(w // self.heads)
            if self.causal:
                mask = torch.triu(torch.full((s, s), float("-inf")), diagonal=1)
                scores = scores + mask
            o = torch.softmax(scores, dim=-1) @ v
            return self.out(o.transpose(1, 2).reshape(b, s, w))

    class Gpt2(nn.Module):
        def __init__(self, vocab=50257, width=768, layers=12, heads=12):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(1024, width)
            self.blocks = nn.ModuleList()
            for _ in range(layers):
                blk = nn.Module()
                blk.ln1, blk.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
                blk.attn = Attention(width, heads, True, True)
                blk.fc, blk.proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
                self.blocks.append(blk)
            self.ln_f = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
            for blk in self.blocks:
                x = x + blk.attn(blk.ln1(x))
                x = x + blk.proj(gelu_new(blk.fc(blk.ln2(x))))
            return self.head(self.ln_f(x))

    class Bert(nn.Module):
        def __init__(self, vocab=30522, width=768, layers=12, heads=12):
            super().__init__()
            self.words, self.positions = nn.Embedding(vocab, width), nn.Embedding(512, width)
            self.types = nn.Embedding(2, width)
            self.ln = nn.LayerNorm(width, eps=1e-12)
            self.blocks = nn.ModuleList()
            for _ in range(layers):
                blk = nn.Module()
                blk.attn = Attention(width, heads, True, False)
                blk.ln1, blk.ln2 = nn.LayerNorm(width, eps=1e-12), nn.LayerNorm(width, eps=1e-12)
                blk.fc, blk.proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
                self.blocks.append(blk)

        def forward(self, ids):
            x = self.words(ids) + self.positions(torch.arange(ids.shape[1])) + self.types(torch.zeros_like(ids))
            x = self.ln(x)
            for blk in self.blocks:
                x = blk.ln1(x + blk.attn(x))
                x = blk.ln2(x + blk.proj(F.gelu(blk.fc(x))))
            return x

    class Rope(nn.Module):
        def __init__(self, dim, seq):
            super().__init__()
            inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
            f = torch.outer(torch.arange(seq).float(), inv)
            emb = torch.cat([f, f], dim=-1)
            self.register_buffer("cos", emb.cos())
            self.register_buffer("sin", emb.sin())

        def forward(self, x):
            half = x.shape[-1] // 2
            rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
            return x * self.cos + rotated * self.sin

    class RmsNorm(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    class Llama(nn.Module):
        def __init__(self, vocab=32000, width=768, layers=12, heads=12, hidden=2048):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            rope = Rope(width // heads, SEQ)
            self.blocks = nn.ModuleList()
            for _ in range(layers):
                blk = nn.Module()
                blk.n1, blk.n2 = RmsNorm(width), RmsNorm(width)
                blk.attn = Attention(width, heads, False, True, rope)
                blk.gate, blk.up = nn.Linear(width, hidden, bias=False), nn.Linear(width, hidden, bias=False)
                blk.down = nn.Linear(hidden, width, bias=False)
                self.blocks.append(blk)
            self.norm = RmsNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, ids):
            x = self.embed(ids)
            for blk in self.blocks:
                x = x + blk.attn(blk.n1(x))
                h = blk.n2(x)
                x = x + blk.down(F.silu(blk.gate(h)) * blk.up(h))
            return self.head(self.norm(x))

    return {"bert-base": Bert, "gpt2-small": Gpt2, "llama-134m": Llama}


def export_full(torch, name, make, folder):
    path = os.path.join(folder, f"{name}.onnx")
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(0, 30000, (1, SEQ))
    if not os.path.exists(path):
        with torch.no_grad():
            torch.onnx.export(model, (ids,), path, dynamo=True, opset_version=18, external_data=False,
                              input_names=["input_ids"])
    return path, model, ids


# ---------------------------------------------------------------- matrix products


def gemm_models(onnx, np, folder):
    """(name, path, feeds, flops) for each one-node product."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    cases = []

    def save(name, nodes, inputs, inits, feeds, flops):
        g = helper.make_graph(nodes, name, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
        m.ir_version = 9
        path = os.path.join(folder, f"gemm_{name.replace(' ', '_')}.onnx")
        onnx.save(m, path)
        cases.append((name, path, feeds, flops))

    def f32(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    for name, m, k, n in [("qkv", SEQ, 768, 2304), ("fc1", SEQ, 768, 3072), ("fc2", SEQ, 3072, 768),
                          ("proj", SEQ, 768, 768), ("logits", SEQ, 768, 50257)]:
        save(f"{name} {m}x{k}x{n}", [helper.make_node("MatMul", ["a", "w"], ["y"])],
             [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, m, k])],
             [numpy_helper.from_array(f32(k, n), "w")], {"a": f32(1, m, k)}, 2 * m * k * n)
    for rows in (2, 4):
        k, n = 512, 2048
        save(f"Gemm transB {rows}x{k}x{n}", [helper.make_node("Gemm", ["a", "w", "b"], ["y"], transB=1)],
             [helper.make_tensor_value_info("a", TensorProto.FLOAT, [rows, k])],
             [numpy_helper.from_array(f32(n, k), "w"), numpy_helper.from_array(f32(n), "b")],
             {"a": f32(rows, k)}, 2 * rows * k * n)
    save("heads QK^T 12x128x64x128", [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
                                       helper.make_node("MatMul", ["q", "kt"], ["y"])],
         [helper.make_tensor_value_info("q", TensorProto.FLOAT, [12, SEQ, 64]),
          helper.make_tensor_value_info("k", TensorProto.FLOAT, [12, SEQ, 64])], [],
         {"q": f32(12, SEQ, 64), "k": f32(12, SEQ, 64)}, 2 * 12 * SEQ * 64 * SEQ)
    save("heads PV 12x128x128x64", [helper.make_node("MatMul", ["p", "v"], ["y"])],
         [helper.make_tensor_value_info("p", TensorProto.FLOAT, [12, SEQ, SEQ]),
          helper.make_tensor_value_info("v", TensorProto.FLOAT, [12, SEQ, 64])], [],
         {"p": f32(12, SEQ, SEQ), "v": f32(12, SEQ, 64)}, 2 * 12 * SEQ * SEQ * 64)
    return cases


# ---------------------------------------------------------------- the run


def copy_bandwidth(np):
    src = np.ones(16 << 20, dtype=np.float32)
    dst = np.zeros_like(src)
    return 2 * src.nbytes / timed(lambda: np.copyto(dst, src), budget=0.5) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--switchyard", default=os.path.join(ROOT, "target", "release", "switchyard"))
    ap.add_argument("--only", default="corpus,full,gemm", help="which groups: corpus, full, gemm")
    ap.add_argument("--repeat", type=int, default=20, help="switchyard's runs per measurement")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--keep", help="export the models into this folder and keep them")
    ap.add_argument("--json", help="write every figure to this file")
    args = ap.parse_args()
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
        import torch
        from safetensors.numpy import load_file, save_file
        if {"full", "gemm"} & set(args.only.split(",")):
            import onnxscript  # noqa: F401 (torch.onnx's exporter needs it)
    except ImportError as e:
        sys.exit(f"{e.name} is needed: pip install torch onnx onnxscript onnxruntime safetensors")
    groups = set(args.only.split(","))
    torch.set_num_threads(os.cpu_count())
    folder = args.keep or tempfile.mkdtemp()
    os.makedirs(folder, exist_ok=True)

    # What each group measures: (group, name, onnx path, inputs file, feeds, torch model or None, flops or None)
    work = []
    if "corpus" in groups:
        for corpus in CORPORA:
            if not os.path.isdir(corpus):
                print(f"(no corpus at {corpus})", file=sys.stderr)
                continue
            for name in sorted(os.listdir(corpus)):
                d = os.path.join(corpus, name)
                model, inputs = os.path.join(d, "model.onnx"), os.path.join(d, "inputs.safetensors")
                if os.path.exists(model) and os.path.exists(inputs):
                    work.append(("corpus", name, model, inputs, load_file(inputs), None, None))
    if "full" in groups:
        for name, make in full_models(torch).items():
            path, model, ids = export_full(torch, name, make, folder)
            inputs = os.path.join(folder, f"{name}.inputs.safetensors")
            feeds = {"input_ids": ids.numpy()}
            save_file(feeds, inputs)
            work.append(("full", name, path, inputs, feeds, (model, ids), None))
    if "gemm" in groups:
        for name, path, feeds, flops in gemm_models(onnx, np, folder):
            inputs = path.replace(".onnx", ".inputs.safetensors")
            save_file(feeds, inputs)
            work.append(("gemm", name, path, inputs, feeds, None, flops))

    rounds = []
    for _ in range(max(args.rounds, 1)):
        r = {"copy_gb_s": copy_bandwidth(np)}
        for group, name, path, inputs, feeds, torch_model, _ in work:
            f = {"switchyard": switchyard_time(args.switchyard, path, inputs, args.repeat),
                 "onnxruntime": ort_time(ort, path, feeds)}
            if torch_model is not None:
                model, ids = torch_model
                with torch.inference_mode():
                    f["torch_eager"] = timed(lambda: model(ids))
            r[name] = f
        rounds.append(r)

    def med(name, key):
        values = [r[name].get(key) for r in rounds]
        if any(isinstance(v, str) for v in values):
            return next(v for v in values if isinstance(v, str))
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    bandwidth = statistics.median(r["copy_gb_s"] for r in rounds)
    print(f"{os.cpu_count()} cores; onnxruntime {ort.__version__}; torch {torch.__version__}; "
          f"median of {len(rounds)} round(s); copy bandwidth {bandwidth:.1f} GB/s (64 MiB, read + written)")
    summary = {"copy_gb_s": bandwidth, "cores": os.cpu_count(), "models": {}}
    header = f"{'':<30}{'switchyard':>12}{'onnxruntime':>13}{'torch eager':>13}{'ours/ort':>10}{'ours/eager':>12}"
    last = None
    for group, name, _, _, _, _, flops in work:
        if group != last:
            print({"corpus": "\nONNX corpus", "full": "\nfull-size, batch 1, sequence 128",
                   "gemm": "\nmatrix products (GFLOP/s: switchyard / ONNX Runtime)"}[group])
            print(header)
            last = group
        ours, theirs, eager = med(name, "switchyard"), med(name, "onnxruntime"), med(name, "torch_eager")
        summary["models"][name] = {"group": group, "switchyard": ours, "onnxruntime": theirs, "torch_eager": eager}
        if isinstance(ours, str):
            print(f"{name:<30}{'fails':>12}{theirs * 1e3:>10.3f} ms   ({ours[:80]})")
            continue
        ms = lambda s: f"{s * 1e3:.3f} ms" if s is not None else "-"
        line = f"{name:<30}{ms(ours):>12}{ms(theirs):>13}{ms(eager):>13}{ours / theirs:>10.2f}"
        line += f"{ours / eager:>12.2f}" if eager else f"{'':>12}"
        if flops:
            line += f"   {flops / ours / 1e9:.1f} / {flops / theirs / 1e9:.1f}"
        print(line)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=1)


if __name__ == "__main__":
    main()
