#!/usr/bin/env python3
"""switchyard's Python session beside ONNX Runtime's, in one run.

1. Overhead: the time a Python `session.run` call costs beyond the Rust
   `Session::run` it makes. The Rust figure is the same session, feeds and
   outputs run in a loop inside Rust (`InferenceSession._time_runs`, which
   converts the feeds once and runs with the GIL released); the Python
   figure is `run(None, feeds)` called from a Python loop. Both are the
   minimum over rounds of the mean per call.
2. The shared ONNX models through `switchyard.InferenceSession` and
   `onnxruntime.InferenceSession` (CPUExecutionProvider, intra_op_num_threads
   = cores), interleaved rounds, outputs compared; the median over rounds
   of the mean per call, and the ratio.
3. A greedy decoding loop of gpt2-kv-decode (its cache fed back), the same
   code with either session class: the loop's time, switchyard's share of
   it spent importing, planning and compiling (`session.stats()`), and
   whether the tokens agree. Median over rounds, a fresh session each.

    python3 benches/peers/python_session.py [--models ../shared/onnx/models]
                                            [--rounds 7] [--calls 200] [--steps 256]

Needs the package (`pip install ./python`), onnxruntime and numpy in one venv.
"""

import argparse
import json
import os
import statistics
import struct
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import switchyard

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "BOOL": np.bool_}


def load_safetensors(path):
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        s, e = spec["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + s : 8 + n + e], DTYPES[spec["dtype"]]).reshape(spec["shape"]).copy()
    return out


def per_call(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def overhead(rounds, calls):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "double.trace"
        path.write_text("input x: f32[2, 3]\ny = mul(x, 2.0)\noutput y\n")
        session = switchyard.InferenceSession(path)
        feeds = {"x": np.ones((2, 3), np.float32)}
        session.run(None, feeds)
        py, rust = [], []
        for _ in range(rounds):
            rust.append(session._time_runs(feeds, calls) / calls)
            py.append(per_call(lambda: session.run(None, feeds), calls))
    return min(py), min(rust)


def models(root, rounds, calls):
    rows = []
    threads = os.cpu_count()
    for d in sorted(Path(root).iterdir()):
        if not (d / "model.onnx").is_file() or not (d / "inputs.safetensors").is_file():
            continue
        feeds = load_safetensors(d / "inputs.safetensors")
        ours = switchyard.InferenceSession(str(d / "model.onnx"), threads=threads)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        theirs = ort.InferenceSession(str(d / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        a, b = ours.run(None, feeds), theirs.run(None, feeds)
        worst = 0.0
        for x, y in zip(a, b):
            if x.dtype.kind == "f" and x.size:
                scale = max(float(np.max(np.abs(y))), 1e-30)
                worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y))) / scale)
            elif not np.array_equal(x, y):
                worst = float("inf")
        t_ours, t_theirs = [], []
        for _ in range(rounds):
            t_ours.append(per_call(lambda: ours.run(None, feeds), calls))
            t_theirs.append(per_call(lambda: theirs.run(None, feeds), calls))
        o, t = statistics.median(t_ours), statistics.median(t_theirs)
        rows.append((d.name, o, t, worst))
    return rows


def greedy(session, steps, prompt):
    """Tokens of a greedy loop feeding the presents back, and its seconds."""
    inputs = session.get_inputs()
    pasts = sorted(i.name for i in inputs if i.name.startswith("past_key_values."))
    heads, size = next(i.shape for i in inputs if i.name == pasts[0])[1::2]
    outputs = [o.name for o in session.get_outputs()]
    presents = sorted(n for n in outputs if n.startswith("present."))
    past = {n: np.zeros((1, heads, 0, size), np.float32) for n in pasts}
    ids = np.array([prompt], np.int64)
    tokens = []
    t0 = time.perf_counter()
    for _ in range(steps):
        length = past[pasts[0]].shape[2]
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones((1, length + ids.shape[1]), np.int64),
            "position_ids": np.arange(length, length + ids.shape[1], dtype=np.int64)[None, :],
            **past,
        }
        got = dict(zip(outputs, session.run(None, feeds)))
        token = int(np.argmax(got["logits"][0, -1]))
        tokens.append(token)
        ids = np.array([[token]], np.int64)
        past = {p: got[q] for p, q in zip(pasts, presents)}
    return tokens, time.perf_counter() - t0


def generation(root, rounds, steps):
    model = str(Path(root) / "gpt2-kv-decode" / "model.onnx")
    prompt = [177, 24, 171, 137, 5, 234, 30, 251]
    threads = os.cpu_count()
    ours_t, theirs_t, shares = [], [], []
    for _ in range(rounds):
        ours = switchyard.InferenceSession(model, threads=threads)
        a, t = greedy(ours, steps, prompt)
        ours_t.append(t)
        shares.append(ours.stats()["compile_seconds"] / t)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        theirs = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        b, t = greedy(theirs, steps, prompt)
        theirs_t.append(t)
    return statistics.median(ours_t), statistics.median(theirs_t), statistics.median(shares), a == b, ours.stats()


def main():
    here = Path(__file__).resolve()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=str(here.parents[3] / "shared" / "onnx" / "models"))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--steps", type=int, default=256)
    args = p.parse_args()

    o, t, share, same, stats = generation(args.models, max(3, args.rounds // 2), args.steps)
    print(f"greedy loop of gpt2-kv-decode, {args.steps} steps: switchyard {o * 1e3:.0f} ms, "
          f"onnxruntime {t * 1e3:.0f} ms ({o / t:.1f}x); importing, planning and compiling "
          f"{100 * share:.0f}% of switchyard's loop ({stats['compiles']} signatures); tokens "
          f"{'equal' if same else 'DIFFER'}")
    print()

    py, rust = overhead(args.rounds, args.calls * 10)
    print(f"overhead of a Python run over the Rust call (f32[2, 3] * 2): "
          f"Python {py * 1e6:.2f} us, Rust {rust * 1e6:.2f} us, overhead {(py - rust) * 1e6:.2f} us per call")
    print()
    print(f"| model | switchyard (Python) | onnxruntime | ratio | largest difference |")
    print(f"|---|---|---|---|---|")
    ratios = []
    for name, o, t, worst in models(args.models, args.rounds, args.calls):
        ratios.append(o / t)
        print(f"| {name} | {o * 1e6:.1f} us | {t * 1e6:.1f} us | {o / t:.2f}x | {worst:.1e} |")
    geo = float(np.exp(np.mean(np.log(ratios)))) if ratios else float("nan")
    print(f"\ngeometric mean of the ratios: {geo:.2f}x ({len(ratios)} models)")


if __name__ == "__main__":
    main()
