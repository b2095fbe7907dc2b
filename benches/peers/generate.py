#!/usr/bin/env python3
"""A greedy decoding loop of a decoder with a key/value cache, in switchyard
and in ONNX Runtime, in one run: the same model, prompt and steps.

switchyard runs `cargo run --release -p switchyard --example generate`'s
binary (built by `cargo build --release -p switchyard --example generate`);
ONNX Runtime the CPUExecutionProvider with intra_op_num_threads = cores. The
tokens of both loops are compared.

    python3 benches/peers/generate.py MODEL.onnx [--steps 256] [--rounds 3]
                                      [--binary target/release/examples/generate]

Needs `pip install onnxruntime numpy` (in a venv of its own).
"""

import argparse
import os
import re
import statistics
import subprocess
import time

import numpy as np
import onnxruntime as ort

PROMPT = [177, 24, 171, 137, 5, 234, 30, 251]


def ort_loop(model, steps):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count()
    s = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    past_inputs = [i for i in s.get_inputs() if i.name.startswith("past_key_values.")]
    heads, size = past_inputs[0].shape[1], past_inputs[0].shape[3]
    outputs = [o.name for o in s.get_outputs()]
    past = {i.name: np.zeros((1, heads, 0, size), np.float32) for i in past_inputs}
    tokens = list(PROMPT)
    t0 = time.perf_counter()
    for step in range(steps):
        past_len = next(iter(past.values())).shape[2]
        new = PROMPT if step == 0 else [tokens[-1]]
        feeds = {
            "input_ids": np.array([new], np.int64),
            "attention_mask": np.ones((1, past_len + len(new)), np.int64),
            "position_ids": np.arange(past_len, past_len + len(new), dtype=np.int64)[None, :],
            **past,
        }
        got = dict(zip(outputs, s.run(None, feeds)))
        tokens.append(int(np.argmax(got["logits"][0, -1])))
        past = {n: got[n.replace("past_key_values", "present")] for n in past}
    return time.perf_counter() - t0, tokens[len(PROMPT):]


def ours_loop(binary, model, steps):
    out = subprocess.run([binary, model, str(steps), ",".join(map(str, PROMPT))],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"in ([0-9.]+) ms .*: ([0-9.]+) ms, ([0-9.]+)% of the loop", out)
    tokens = [int(t) for t in re.search(r"tokens: \[([^\]]*)\]", out).group(1).split(",")]
    return float(m.group(1)) / 1e3, float(m.group(2)) / 1e3, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--binary", default="target/release/examples/generate")
    args = ap.parse_args()
    ours, planning, theirs = [], [], []
    for _ in range(args.rounds):
        t, p, our_tokens = ours_loop(args.binary, args.model, args.steps)
        ours.append(t)
        planning.append(p)
        t, ort_tokens = ort_loop(args.model, args.steps)
        theirs.append(t)
    o, p, r = statistics.median(ours), statistics.median(planning), statistics.median(theirs)
    same = sum(a == b for a, b in zip(our_tokens, ort_tokens))
    print(f"{args.steps} steps, median of {args.rounds} round(s), {os.cpu_count()} cores")
    print(f"switchyard    {o * 1e3:10.1f} ms  (importing, planning, compiling {p * 1e3:.1f} ms: {100 * p / o:.1f}%)")
    print(f"onnxruntime   {r * 1e3:10.1f} ms")
    print(f"ours/ort      {o / r:10.2f}")
    print(f"tokens equal  {same} of {args.steps}")


if __name__ == "__main__":
    main()
