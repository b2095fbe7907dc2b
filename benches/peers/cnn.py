#!/usr/bin/env python3
"""switchyard beside ONNX Runtime and PyTorch eager on convolutional nets, in one run.

Exports torchvision's resnet18, mobilenet_v2 and squeezenet1_1 (random
weights, full width, batch 1, 1x3x224x224, torch.onnx's dynamo exporter at
opset 18) into a temporary folder, then times each model per inference with:

- switchyard: `switchyard bench MODEL.onnx` with the default executors;
- ONNX Runtime: CPUExecutionProvider, intra_op_num_threads = this machine's
  cores, default graph optimisations;
- PyTorch eager, with every core.

and prints the medians and the ratios against ONNX Runtime. With --rounds N
everything is measured N times, alternating, and the medians are printed.

    python3 benches/peers/cnn.py [--switchyard target/release/switchyard]
                                 [--only resnet18,...] [--rounds N] [--keep DIR]

Needs `pip install torch torchvision onnx onnxruntime` (in a venv of its
own); switchyard itself needs none of them.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from peers import timed  # noqa: E402 (beside this script)

MODELS = ["resnet18", "mobilenet_v2", "squeezenet1_1"]


def export(torch, torchvision, name, folder):
    path = os.path.join(folder, f"{name}.onnx")
    if os.path.exists(path):
        return path
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    torch.onnx.export(model, (x,), path, dynamo=True, opset_version=18, external_data=False)
    return path


def switchyard_time(binary, path, repeat):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "bench.json")
        subprocess.run([binary, "bench", path, "--repeat", str(repeat), "--json", out],
                       check=True, stdout=subprocess.DEVNULL)
        with open(out) as fh:
            report = json.load(fh)
    # The last executor set is every enabled executor.
    return report["results"][-1]["stats"]["median_ns"] / 1e9


def ort_time(ort, np, path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count()
    s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    return timed(lambda: s.run(None, {name: x}))


def torch_time(torch, torchvision, name):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.inference_mode():
        return timed(lambda: model(x))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--switchyard", default="target/release/switchyard")
    ap.add_argument("--only", help="comma-separated model names")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--keep", help="export the models into this folder and keep them")
    args = ap.parse_args()
    try:
        import numpy as np
        import onnxruntime as ort
        import torch
        import torchvision
    except ImportError as e:
        sys.exit(f"{e.name} is needed: pip install torch torchvision onnx onnxruntime")
    names = args.only.split(",") if args.only else MODELS
    torch.set_num_threads(os.cpu_count())
    folder = args.keep or tempfile.mkdtemp()
    os.makedirs(folder, exist_ok=True)
    paths = {n: export(torch, torchvision, n, folder) for n in names}
    rounds = []
    for _ in range(max(args.rounds, 1)):
        r = {}
        for n in names:
            r[n] = {
                "switchyard": switchyard_time(args.switchyard, paths[n], args.repeat),
                "onnxruntime": ort_time(ort, np, paths[n]),
                "torch_eager": torch_time(torch, torchvision, n),
            }
        rounds.append(r)
    print(f"{os.cpu_count()} cores; onnxruntime {ort.__version__}; torch {torch.__version__}; "
          f"median of {len(rounds)} round(s); batch 1, 1x3x224x224, f32")
    print(f"{'model':<15}{'switchyard':>12}{'onnxruntime':>13}{'torch eager':>13}{'ours/ort':>10}{'ours/eager':>12}")
    for n in names:
        med = {k: statistics.median(r[n][k] for r in rounds) for k in rounds[0][n]}
        ms = lambda s: f"{s * 1e3:.2f} ms"
        print(f"{n:<15}{ms(med['switchyard']):>12}{ms(med['onnxruntime']):>13}{ms(med['torch_eager']):>13}"
              f"{med['switchyard'] / med['onnxruntime']:>10.2f}{med['switchyard'] / med['torch_eager']:>12.2f}")


if __name__ == "__main__":
    main()
