#!/usr/bin/env python3
"""torch.compile(backend="switchyard") beside PyTorch eager and
torch.compile's own backend (Inductor) on the CPU, in one run.

Times, per workload, the call of the eager function, of Inductor's compiled
one and of switchyard's, and prints the medians and the ratios:

- the peer workloads of benches/peers/peers.py (elementwise chains, an RMS
  norm, a reduction, matrix products, a tiny add);
- a Llama block (hidden 512, 8 heads, SwiGLU 1408, sequence 128) forward;
- llama-tiny (the shared model's config) forward, and its training step
  (forward, MSE loss, backward; the optimizer step is not timed);
- the first compile of a 32-layer Llama (llama-tiny's layers, 32 of them):
  the first call's time, once per backend, with Inductor's caches off.

    python3 benches/peers/torch_backend.py [--rounds N] [--only NAME,...] [--json FILE]
    python3 benches/peers/torch_backend.py --handed-back [--models DIR]

`--handed-back` instead lists, for the shared transformer models rebuilt in
PyTorch, the MLP and a small CNN, the ATen ops each compiled graph (the
inference graph, and the forward and backward of a training step) hands
back to PyTorch.

It needs torch and switchyard's Python package (`pip install ./python`,
a release build) in the interpreter that runs it. Each backend uses every
core PyTorch sees.
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "python" / "tests"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import switchyard.torch  # noqa: E402,F401  (registers nothing: the entry point does; imported to fail early)
from peers import WORKLOADS, timed  # noqa: E402
from torch_models import Llama, _LlamaLayer  # noqa: E402

LLAMA_TINY = {
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
}
BLOCK = dict(LLAMA_TINY, hidden_size=512, intermediate_size=1408, num_attention_heads=8, num_key_value_heads=8)


class Block(nn.Module):
    """One Llama layer with its rotary tables, as workload 3 writes it."""

    def __init__(self, c, seq):
        super().__init__()
        self.layer = _LlamaLayer(c)
        d = c["hidden_size"] // c["num_attention_heads"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        emb = torch.outer(torch.arange(seq, dtype=torch.float32), inv).repeat(1, 2)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, x):
        return self.layer(x, self.cos, self.sin)


def inference_workloads():
    """name: (module or function, inputs)."""
    out = {}
    for name, (_, shapes, f) in WORKLOADS.items():
        out[name] = (f, [torch.rand(s) * 2 - 1 for s in shapes])
    torch.manual_seed(0)
    out["llama_block"] = (Block(BLOCK, 128).eval(), [torch.randn(1, 128, 512)])
    out["llama_tiny"] = (Llama(LLAMA_TINY).eval(), [torch.randint(0, 256, (2, 32))])
    return out


def compiled(f, backend):
    torch._dynamo.reset()
    return f if backend == "eager" else torch.compile(f, backend=backend)


def time_inference(f, inputs, backend):
    g = compiled(f, backend)
    with torch.no_grad():
        return timed(lambda: g(*inputs), budget=1.0)


def time_training(backend):
    torch.manual_seed(0)
    model = Llama(LLAMA_TINY).train()
    ids = torch.randint(0, 256, (2, 32))
    target = torch.randn(2, 32, 256)
    g = compiled(model, backend)

    def step():
        loss = nn.functional.mse_loss(g(ids), target)
        loss.backward()

    return timed(step, budget=1.0)


def first_compile(backend, layers=32):
    torch.manual_seed(0)
    model = Llama(dict(LLAMA_TINY, num_hidden_layers=layers)).eval()
    ids = torch.randint(0, 256, (2, 32))
    torch._dynamo.reset()
    g = torch.compile(model, backend=backend)
    t = time.perf_counter()
    with torch.no_grad():
        g(ids)
    return time.perf_counter() - t


BACKENDS = ("eager", "inductor", "switchyard")


def handed_back_report(models_dir):
    """The ATen ops each model's graphs hand back to PyTorch."""
    import gc

    import switchyard.torch as st
    from torch_models import build
    from test_torch import SmallCNN, inputs_for

    names = ["mlp", "gpt2-tiny", "llama-tiny", "bert-tiny", "small-cnn"]
    for name in names:
        torch._dynamo.reset()
        gc.collect()
        before = {id(g) for g in st.compiled_graphs()}
        if name == "small-cnn":
            torch.manual_seed(0)
            model, args = SmallCNN(), (torch.randn(2, 3, 16, 16),)
        else:
            model, args = build(models_dir, name), inputs_for(name)
        compiled = torch.compile(model.eval(), backend="switchyard")
        with torch.no_grad():
            compiled(*args)
        graphs = [g for g in st.compiled_graphs() if id(g) not in before]
        torch._dynamo.reset()
        compiled = torch.compile(model.train(), backend="switchyard")
        compiled(*args).float().pow(2).mean().backward()
        graphs += [g for g in st.compiled_graphs() if id(g) not in before and g not in graphs]
        ops = {g.name.split()[0]: sorted(g.handed_back) for g in graphs}
        print(f"{name}: " + "; ".join(f"{k}: {', '.join(v) if v else 'none'}" for k, v in ops.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--handed-back", action="store_true", help="list the ops handed back to PyTorch, per model")
    ap.add_argument("--models", default=str(HERE.parents[2] / "shared" / "onnx" / "models"))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", help="comma-separated workload names")
    ap.add_argument("--json", help="write every figure to this file")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count())
    if args.handed_back:
        handed_back_report(Path(args.models))
        return
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    workloads = inference_workloads()
    names = list(workloads) + ["llama_tiny_train", "compile_32_layers"]
    if args.only:
        names = [n for n in args.only.split(",")]
    rounds = []
    for _ in range(max(args.rounds, 1)):
        figures = {}
        for name in names:
            row = {}
            for b in BACKENDS:
                if name == "llama_tiny_train":
                    row[b] = time_training(b)
                elif name == "compile_32_layers":
                    # aot_eager: Dynamo and AOTAutograd alone, the floor
                    # of every backend behind them.
                    row["aot_eager" if b == "eager" else b] = first_compile("aot_eager" if b == "eager" else b)
                else:
                    f, inputs = workloads[name]
                    row[b] = time_inference(f, inputs, b)
            figures[name] = row
        rounds.append(figures)
    rows = {n: {b: statistics.median(r[n][b] for r in rounds) for b in rounds[0][n]} for n in names}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {len(rounds)} round(s)")
    print(f"{'workload':<19}{'eager':>12}{'inductor':>12}{'switchyard':>12}{'ours/inductor':>15}{'ours/eager':>12}")

    def fmt(s):
        if s is None:
            return "-"
        return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} µs"

    for n, r in rows.items():
        if "aot_eager" in r:
            print(f"{n}: Dynamo and AOTAutograd alone (aot_eager) {fmt(r['aot_eager'])}; inductor {fmt(r['inductor'])}, "
                  f"switchyard {fmt(r['switchyard'])} ({r['switchyard'] / r['inductor']:.2f} of inductor's); "
                  f"switchyard's own part {fmt(r['switchyard'] - r['aot_eager'])}")
            continue
        eager = r.get("eager")
        print(f"{n:<19}{fmt(eager):>12}{fmt(r['inductor']):>12}{fmt(r['switchyard']):>12}"
              f"{r['switchyard'] / r['inductor']:>15.2f}"
              f"{(r['switchyard'] / eager) if eager else float('nan'):>12.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "rows": rows, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
