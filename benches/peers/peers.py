#!/usr/bin/env python3
"""switchyard beside PyTorch on the CPU, in one run.

Runs the same workloads with `switchyard bench` (the fuser) and with PyTorch
eager, torch.compile, and torch.compile writing into a preallocated output,
on this machine, one after the other, and prints each one's median time, the
ratios against switchyard, and the machine's copy bandwidth (bytes read and
written by a 64 MiB copy into a buffer touched before), so the figures compare
like with like. switchyard runs with the fuser (and the fallback for what the
fuser does not claim, such as matmul).

    python3 benches/peers/peers.py [--switchyard target/release/switchyard]
                                   [--only NAME,...] [--rounds N] [--json FILE]

With --rounds N every figure is measured N times, in N rounds that each run
everything once, and its median is printed: on a shared machine the load
changes over a run, and alternating the contestants spreads that over all.

PyTorch is optional for switchyard; this script needs it (`pip install
torch`). It uses every core PyTorch sees, as switchyard's bench does.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

N = 1 << 24  # 16M f32 = 64 MiB

# name: (trace text, inputs as shapes, torch function of the inputs)
WORKLOADS = {
    "chain": (
        f"input x: f32[{N}]\na = mul(x, 1.5)\nb = add(a, 0.5)\nc = tanh(b)\nd = mul(c, x)\n"
        "e = sigmoid(d)\nf = exp(x)\ng = add(e, f)\ny = mul(g, 0.5)\noutput y\n",
        [[N]],
        lambda x: (((x * 1.5 + 0.5).tanh() * x).sigmoid() + x.exp()) * 0.5,
    ),
    "cheap_chain": (
        f"input x: f32[{N}]\na = mul(x, 1.5)\nb = add(a, 0.5)\nc = mul(b, x)\nd = sub(c, 0.25)\n"
        "e = mul(d, 0.5)\nf = add(e, x)\ng = abs(f)\ny = mul(g, 2.0)\noutput y\n",
        [[N]],
        lambda x: ((((x * 1.5 + 0.5) * x - 0.25) * 0.5 + x).abs() * 2),
    ),
    "rms_norm": (
        "input x: f32[4096, 4096]\ninput w: f32[4096]\ny = rms_norm(x, w)\noutput y\n",
        [[4096, 4096], [4096]],
        lambda x, w: x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * w,
    ),
    "sum_dim0": (
        "input x: f32[4096, 4096]\ny = sum(x, dims=[0])\noutput y\n",
        [[4096, 4096]],
        lambda x: x.sum(0),
    ),
    "matmul_1024": (
        "input a: f32[1024, 1024]\ninput b: f32[1024, 1024]\nc = matmul(a, b)\noutput c\n",
        [[1024, 1024], [1024, 1024]],
        lambda a, b: a @ b,
    ),
    "matmul_2048": (
        "input a: f32[2048, 2048]\ninput b: f32[2048, 2048]\nc = matmul(a, b)\noutput c\n",
        [[2048, 2048], [2048, 2048]],
        lambda a, b: a @ b,
    ),
    "add_16x16": (
        "input x: f32[16, 16]\ninput y: f32[16, 16]\nz = add(x, y)\noutput z\n",
        [[16, 16], [16, 16]],
        lambda x, y: x + y,
    ),
}


def timed(fn, budget=2.0, min_runs=5):
    """Median seconds per call of `fn`, after a warm-up, over about `budget` s."""
    for _ in range(3):
        fn()
    samples = []
    start = time.perf_counter()
    while len(samples) < min_runs or time.perf_counter() - start < budget:
        t = time.perf_counter()
        reps = 0
        while True:
            fn()
            reps += 1
            if time.perf_counter() - t > 0.01:
                break
        samples.append((time.perf_counter() - t) / reps)
        if len(samples) >= 200:
            break
    return statistics.median(samples)


def torch_times(torch, name, shapes, f):
    inputs = [torch.rand(s, dtype=torch.float32) * 2 - 1 for s in shapes]
    out = f(*inputs)
    eager = timed(lambda: f(*inputs))
    compiled = torch.compile(f)
    compiled_t = timed(lambda: compiled(*inputs))

    def into(*args):
        args[-1].copy_(f(*args[:-1]))

    into_compiled = torch.compile(into)
    preallocated = torch.empty_like(out)
    into_t = timed(lambda: into_compiled(*inputs, preallocated))
    return {"eager": eager, "compile": compiled_t, "compile_into": into_t}


def copy_bandwidth(torch):
    src = torch.rand(N, dtype=torch.float32)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / t / 1e9


def switchyard_times(binary, names, repeat):
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for name in names:
            p = os.path.join(d, f"{name}.trace")
            with open(p, "w") as fh:
                fh.write(WORKLOADS[name][0])
            paths.append(p)
        out = os.path.join(d, "bench.json")
        cmd = [binary, "bench", *paths, "--executors-sets", "fuser,fallback",
               "--repeat", str(repeat), "--json", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as fh:
            report = json.load(fh)
    return {r["workload"]: r["stats"]["median_ns"] / 1e9 for r in report["results"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--switchyard", default="target/release/switchyard")
    ap.add_argument("--only", help="comma-separated workload names")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1, help="measure everything this many times; print medians")
    ap.add_argument("--json", help="write every figure to this file")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("PyTorch is needed: pip install torch")
    names = args.only.split(",") if args.only else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        sys.exit(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    if not os.path.exists(args.switchyard):
        sys.exit(f"{args.switchyard} not found: cargo build --release -p switchyard-cli")
    torch.set_num_threads(os.cpu_count())
    rounds = []
    for _ in range(max(args.rounds, 1)):
        ours = switchyard_times(args.switchyard, names, args.repeat)
        figures = {"copy_gb_s": copy_bandwidth(torch)}
        for name in names:
            _, shapes, f = WORKLOADS[name]
            figures[name] = {"switchyard": ours[name], **torch_times(torch, name, shapes, f)}
        rounds.append(figures)
    bandwidth = statistics.median(r["copy_gb_s"] for r in rounds)
    rows = []
    for name in names:
        cells = rounds[0][name].keys()
        rows.append({"workload": name, **{c: statistics.median(r[name][c] for r in rounds) for c in cells}})
    print(f"copy bandwidth (bytes read + written, 64 MiB into a touched buffer): {bandwidth:.1f} GB/s; "
          f"{torch.get_num_threads()} threads; torch {torch.__version__}; "
          f"median of {len(rounds)} round{'s' if len(rounds) > 1 else ''}")
    print(f"{'workload':<13}{'switchyard':>12}{'eager':>12}{'compile':>12}{'compile_into':>14}"
          f"{'ours/compile':>14}{'ours/into':>11}")
    for r in rows:
        ms = lambda s: f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.2f} µs"
        print(f"{r['workload']:<13}{ms(r['switchyard']):>12}{ms(r['eager']):>12}{ms(r['compile']):>12}"
              f"{ms(r['compile_into']):>14}{r['switchyard'] / r['compile']:>14.2f}"
              f"{r['switchyard'] / r['compile_into']:>11.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"copy_gb_s": bandwidth, "threads": torch.get_num_threads(),
                       "torch": torch.__version__, "results": rows, "rounds": rounds}, fh, indent=2)


if __name__ == "__main__":
    main()
