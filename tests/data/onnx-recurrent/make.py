"""Writes the recurrent-net regression models in this folder: one LSTM, GRU
or RNN node each, over the options the shared corpus's models leave out
(reverse and bidirectional runs with per-item lengths, clip, input_forget,
peepholes, linear_before_reset, other activations with their alpha and
beta), with seeded random weights and inputs, and ONNX Runtime's
outputs (CPUExecutionProvider) as expected.safetensors.

    python make.py [folder]        # needs onnx, onnxruntime, safetensors, numpy
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from safetensors.numpy import save_file

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}

CASES = [
    # ONNX Runtime runs only layout 0; the node suite's *_batchwise cases
    # cover layout 1.
    # name, op, direction, layout, steps, batch, input, hidden, lens, extras, attrs
    ("lstm_reverse_lens", "LSTM", "reverse", 0, 5, 3, 4, 6, [5, 2, 3], [], {}),
    ("lstm_bidir_clip_forget_peep", "LSTM", "bidirectional", 0, 4, 2, 3, 5, [4, 3],
     ["initial_h", "initial_c", "P"], {"clip": 0.8, "input_forget": 1}),
    ("lstm_activations", "LSTM", "bidirectional", 0, 3, 2, 4, 3, None, ["initial_h"],
     {"activations": ["HardSigmoid", "LeakyRelu", "Softsign", "Sigmoid", "ScaledTanh", "Elu"],
      "activation_alpha": [0.3, 0.05, 0.7, 0.9], "activation_beta": [0.4, 1.2]}),
    ("gru_linear_before_reset", "GRU", "bidirectional", 0, 5, 2, 3, 4, [5, 1],
     ["initial_h"], {"linear_before_reset": 1}),
    ("gru_reverse_clip_activations", "GRU", "reverse", 0, 4, 2, 3, 5, [2, 4], [],
     {"clip": 1.1, "activations": ["Affine", "Softplus"], "activation_alpha": [0.6],
      "activation_beta": [0.1]}),
    ("rnn_bidir_relu_lens", "RNN", "bidirectional", 0, 4, 3, 2, 5, [1, 4, 3], ["initial_h"],
     {"activations": ["Relu", "ThresholdedRelu"], "activation_alpha": [0.2]}),
]


def case(out_dir, name, op, direction, layout, s, n, i, h, lens, extras, attrs, seed):
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    f32 = lambda *shape: rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    x = f32(*((n, s, i) if layout else (s, n, i)))
    inits = {"W": f32(d, g * h, i), "R": f32(d, g * h, h), "B": f32(d, 2 * g * h)}
    feeds = {"X": x}
    names = ["X", "W", "R", "B"]
    if lens is not None:
        feeds["sequence_lens"] = np.array(lens, dtype=np.int32)
        names.append("sequence_lens")
    else:
        names.append("")
    state = (n, d, h) if layout else (d, n, h)
    for extra in ["initial_h", "initial_c", "P"]:
        if op != "LSTM" and extra != "initial_h":
            continue
        if extra in extras:
            feeds[extra] = f32(d, 3 * h) if extra == "P" else f32(*state)
            names.append(extra)
        else:
            names.append("")
    while names and names[-1] == "":
        names.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, direction=direction, hidden_size=h, layout=layout, **attrs)
    graph_inputs = [
        helper.make_tensor_value_info(k, TensorProto.INT32 if k == "sequence_lens" else TensorProto.FLOAT, v.shape)
        for k, v in feeds.items()
    ]
    shapes = {"Y": [s, d, n, h], "Y_h": [d, n, h], "Y_c": [d, n, h]}
    graph_outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, shapes[o]) for o in outs]
    initializers = [helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.flatten()) for k, v in inits.items()]
    graph = helper.make_graph([node], name, graph_inputs, graph_outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    got = sess.run(outs, feeds)
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    onnx.save(model, os.path.join(folder, "model.onnx"))
    save_file(feeds, os.path.join(folder, "inputs.safetensors"))
    save_file(dict(zip(outs, got)), os.path.join(folder, "expected.safetensors"))
    print(name, [o.shape for o in got])


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    print("onnxruntime", ort.__version__)
    for seed, c in enumerate(CASES):
        case(out_dir, *c, seed=2000 + seed)


if __name__ == "__main__":
    main()
