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

    python3 benches/peers/python_session.py [--models ../shared/onnx/models]
                                            [--rounds 7] [--calls 200]

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


def main():
    here = Path(__file__).resolve()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=str(here.parents[3] / "shared" / "onnx" / "models"))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()

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
