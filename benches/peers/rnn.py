#!/usr/bin/env python3
"""switchyard beside ONNX Runtime on recurrent nets, in one run.

Builds, with seeded random weights (onnx.helper, opset 17), into a folder:

- lstm: a bidirectional LSTM, hidden 256, input 256, 100 steps, batch 1;
- gru: the same as a GRU;
- silero: a Silero-style voice-activity model on one 512-sample chunk: a
  top-level If on the sample rate (16 kHz or 8 kHz branches), each a
  strided Conv stem, four Conv + Relu layers, an LSTM of hidden 128 over the
  frames carrying its state in and out, and a 1x1 Conv + Sigmoid head;
- lstm1000: the LSTM over 1 000 steps, for the time to import, plan and
  compile (not run).

then times each per inference with switchyard (`switchyard run --inputs
--repeat`, the default executors; the models' inputs fixed where the
import needs them, as for the sample rate) and ONNX Runtime
(CPUExecutionProvider, intra_op_num_threads = this machine's cores),
alternating over --rounds rounds, and prints the medians and ratios; and for
lstm1000, the wall time of `switchyard plan` and the compile time `run`
reports.

    python3 benches/peers/rnn.py [--switchyard target/release/switchyard]
                                 [--rounds N] [--keep DIR]

Needs `pip install onnx onnxruntime safetensors numpy`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from peers import timed  # noqa: E402 (beside this script)


def rnn_model(helper, TensorProto, np, op, steps, hidden, inputs, seed):
    rng = np.random.default_rng(seed)
    g = {"LSTM": 4, "GRU": 3}[op]
    s = 1.0 / np.sqrt(hidden)
    w = lambda *shape: rng.uniform(-s, s, shape).astype(np.float32)
    inits = {"W": w(2, g * hidden, inputs), "R": w(2, g * hidden, hidden), "B": w(2, 2 * g * hidden)}
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, ["X", "W", "R", "B"], outs, direction="bidirectional", hidden_size=hidden)
    shapes = {"Y": [steps, 2, 1, hidden], "Y_h": [2, 1, hidden], "Y_c": [2, 1, hidden]}
    graph = helper.make_graph(
        [node], op.lower(),
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [steps, 1, inputs])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shapes[o]) for o in outs],
        [helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.flatten()) for k, v in inits.items()],
    )
    feeds = {"X": rng.standard_normal((steps, 1, inputs)).astype(np.float32)}
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


def silero_model(helper, TensorProto, np, seed):
    rng = np.random.default_rng(seed)
    inits, hidden = [], 128

    def weight(name, *shape):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        v = rng.uniform(-1, 1, shape).astype(np.float32) / np.sqrt(fan_in)
        inits.append(helper.make_tensor(name, TensorProto.FLOAT, v.shape, v.flatten()))
        return name

    def branch(tag, stem_kernel, stem_stride):
        nodes = [helper.make_node("Reshape", ["input", "shape3"], [f"{tag}_x"])]
        cur, channels = f"{tag}_x", 1
        layers = [(129, stem_kernel, stem_stride), (128, 3, 1), (64, 3, 2), (64, 3, 2), (128, 3, 1)]
        for k, (out_c, kernel, stride) in enumerate(layers):
            wn = weight(f"{tag}_conv{k}_w", out_c, channels, kernel)
            bn = weight(f"{tag}_conv{k}_b", out_c)
            pad = 0 if k == 0 else kernel // 2
            nodes.append(helper.make_node("Conv", [cur, wn, bn], [f"{tag}_conv{k}"], strides=[stride], pads=[pad, pad]))
            nodes.append(helper.make_node("Relu", [f"{tag}_conv{k}"], [f"{tag}_r{k}"]))
            cur, channels = f"{tag}_r{k}", out_c
        # [1, C, T] -> [T, 1, C] for the LSTM.
        nodes.append(helper.make_node("Transpose", [cur], [f"{tag}_seq"], perm=[2, 0, 1]))
        nodes += [
            helper.make_node("Gather", ["state", "zero"], [f"{tag}_h0"], axis=0),
            helper.make_node("Gather", ["state", "one"], [f"{tag}_c0"], axis=0),
            helper.make_node("LSTM", [f"{tag}_seq", weight(f"{tag}_W", 1, 4 * hidden, channels),
                                      weight(f"{tag}_R", 1, 4 * hidden, hidden), weight(f"{tag}_B", 1, 8 * hidden),
                                      "", f"{tag}_h0", f"{tag}_c0"],
                             [f"{tag}_Y", f"{tag}_Yh", f"{tag}_Yc"], hidden_size=hidden),
            helper.make_node("Concat", [f"{tag}_Yh", f"{tag}_Yc"], [f"{tag}_state"], axis=0),
            # [T, 1, 1, H] -> [1, H, T]
            helper.make_node("Reshape", [f"{tag}_Y", "shape_thw"], [f"{tag}_y3"]),
            helper.make_node("Transpose", [f"{tag}_y3"], [f"{tag}_yt"], perm=[1, 2, 0]),
            helper.make_node("Relu", [f"{tag}_yt"], [f"{tag}_yr"]),
            helper.make_node("Conv", [f"{tag}_yr", weight(f"{tag}_head_w", 1, hidden, 1),
                                      weight(f"{tag}_head_b", 1)], [f"{tag}_logit"]),
            helper.make_node("Sigmoid", [f"{tag}_logit"], [f"{tag}_p"]),
            helper.make_node("ReduceMean", [f"{tag}_p"], [f"{tag}_out"], axes=[2], keepdims=0),
        ]
        outs = [helper.make_tensor_value_info(f"{tag}_out", TensorProto.FLOAT, [1, 1]),
                helper.make_tensor_value_info(f"{tag}_state", TensorProto.FLOAT, [2, 1, hidden])]
        return helper.make_graph(nodes, tag, [], outs)

    consts = {
        "shape3": np.array([1, 1, 512], np.int64), "shape_thw": np.array([0, 1, hidden], np.int64),
        "zero": np.array([0], np.int64), "one": np.array([1], np.int64),
        "rate": np.array([16000], np.int64),
    }
    then_g, else_g = branch("k16", 256, 128), branch("k8", 128, 64)
    for k, v in consts.items():
        inits.append(helper.make_tensor(k, TensorProto.INT64, v.shape, v.flatten()))
    nodes = [
        helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["output", "stateN"], then_branch=then_g, else_branch=else_g),
    ]
    graph = helper.make_graph(
        nodes, "silero",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 512]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, hidden]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1]),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, 1, hidden])],
        inits,
    )
    feeds = {
        "input": rng.standard_normal((1, 512)).astype(np.float32),
        "state": np.zeros((2, 1, hidden), np.float32),
        "sr": np.array([16000], np.int64),
    }
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


def switchyard_time(binary, path, inputs, repeat):
    out = subprocess.run([binary, "run", path, "--inputs", inputs, "--repeat", str(repeat), "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["time_ns"] / 1e9


def ort_time(ort, path, feeds):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count()
    s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return timed(lambda: s.run(None, feeds))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--switchyard", default="target/release/switchyard")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--keep", help="write the models into this folder and keep them")
    args = ap.parse_args()
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper
        from safetensors.numpy import save_file
    except ImportError as e:
        sys.exit(f"{e.name} is needed: pip install onnx onnxruntime safetensors numpy")
    folder = args.keep or tempfile.mkdtemp()
    os.makedirs(folder, exist_ok=True)
    built = {
        "lstm": rnn_model(helper, TensorProto, np, "LSTM", 100, 256, 256, 1),
        "gru": rnn_model(helper, TensorProto, np, "GRU", 100, 256, 256, 2),
        "silero": silero_model(helper, TensorProto, np, 3),
        "lstm1000": rnn_model(helper, TensorProto, np, "LSTM", 1000, 256, 256, 4),
    }
    paths = {}
    for name, (model, feeds) in built.items():
        onnx.checker.check_model(model)
        path = os.path.join(folder, f"{name}.onnx")
        onnx.save(model, path)
        save_file(feeds, os.path.join(folder, f"{name}.inputs.safetensors"))
        paths[name] = path
    timed_models = ["lstm", "gru", "silero"]
    rounds = []
    for _ in range(max(args.rounds, 1)):
        r = {}
        for n in timed_models:
            inputs = os.path.join(folder, f"{n}.inputs.safetensors")
            r[n] = {
                "switchyard": switchyard_time(args.switchyard, paths[n], inputs, args.repeat),
                "onnxruntime": ort_time(ort, paths[n], built[n][1]),
            }
        rounds.append(r)
    print(f"{os.cpu_count()} cores; onnxruntime {ort.__version__}; median of {len(rounds)} round(s); f32, batch 1")
    print(f"{'model':<10}{'switchyard':>12}{'onnxruntime':>13}{'ours/ort':>10}")
    for n in timed_models:
        med = {k: statistics.median(r[n][k] for r in rounds) for k in rounds[0][n]}
        ms = lambda s: f"{s * 1e3:.2f} ms"
        print(f"{n:<10}{ms(med['switchyard']):>12}{ms(med['onnxruntime']):>13}"
              f"{med['switchyard'] / med['onnxruntime']:>10.2f}")
    t0 = time.perf_counter()
    subprocess.run([args.switchyard, "plan", paths["lstm1000"]], check=True, stdout=subprocess.DEVNULL)
    plan_s = time.perf_counter() - t0
    out = subprocess.run([args.switchyard, "run", paths["lstm1000"], "--inputs",
                          os.path.join(folder, "lstm1000.inputs.safetensors"), "--json"],
                         check=True, capture_output=True, text=True).stdout
    compile_s = json.loads(out)["compile_ns"] / 1e9
    print(f"lstm over 1000 steps (hidden 256): import + plan {plan_s * 1e3:.1f} ms (wall, the whole command), "
          f"compile {compile_s * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
