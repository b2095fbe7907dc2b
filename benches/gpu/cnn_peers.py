#!/usr/bin/env python3
"""PyTorch on the GPU beside switchyard: torchvision CNNs, batch 1, 1x3x224x224, random weights.

Prints one JSON line per model with PyTorch eager's median time per inference (and
torch.compile's with --compile), f32 as IEEE f32 (TF32 off for cuDNN and cuBLAS, as
switchyard computes f32 unless TF32 is allowed). With --export DIR, a model whose ONNX file
is missing from DIR is exported there (torch.onnx, TorchScript exporter) for switchyard.
"""
import argparse
import json
import os
import sys

import torch
from torch.utils.benchmark import Timer

MODELS = ["resnet18", "mobilenet_v2", "squeezenet1_1"]


def median(fn):
    fn()
    torch.cuda.synchronize()
    t = Timer("fn(); torch.cuda.synchronize()", globals={"fn": fn, "torch": torch})
    return t.blocked_autorange(min_run_time=1.0).median


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--export", default=None)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    try:
        import torchvision
    except ImportError as e:
        print(json.dumps({"skipped": f"no torchvision: {e}"}))
        return
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for name in MODELS:
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(weights=None).eval()
        x = torch.randn(1, 3, 224, 224)
        if a.export:
            path = os.path.join(a.export, f"{name}.onnx")
            if not os.path.exists(path):
                try:
                    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17)
                except Exception as e:  # noqa: BLE001 (a peer that cannot export is reported)
                    print(f"{name}: export failed: {e}", file=sys.stderr)
        model, x = model.cuda(), x.cuda()
        row = {"model": name, "device": torch.cuda.get_device_name()}
        with torch.no_grad():
            row["eager_ms"] = round(median(lambda: model(x)) * 1e3, 3)
            if a.compile:
                c = torch.compile(model)
                row["compile_ms"] = round(median(lambda: c(x)) * 1e3, 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
