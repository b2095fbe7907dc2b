"""Writes the control-flow and quantization regression models in this
folder, each with seeded random inputs and ONNX Runtime's outputs
(CPUExecutionProvider, one thread) as expected.safetensors:

- scan_bidir: a Scan over two inputs, one read backwards, a running sum
  and a running product as states, and scan outputs stacked along axis 1
  (one of them in reverse);
- loop_fixed_trip: a Loop of 6 iterations (a constant trip count) whose
  body uses the iteration number, with a carried value and a scan output;
- loop_data_cond: a Loop of at most 8 iterations that stops when a value
  computed from the input passes a threshold (here after 2; it runs
  masked);
- loop_grows: a Loop whose carried value grows by one row each iteration;
- dynamic_quant_linear: a dynamically quantized linear layer as ONNX
  Runtime's quantize_dynamic writes it (DynamicQuantizeLinear,
  MatMulInteger, scale and cast back), with a per-column weight zero
  point.

    python make.py [folder]        # needs onnx, onnxruntime, safetensors, numpy
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import save_file

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def scan_bidir():
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "a"], ["s_out"]),
            helper.make_node("Mul", ["p_in", "b"], ["p_raw"]),
            helper.make_node("Tanh", ["p_raw"], ["p_out"]),
            helper.make_node("Mul", ["s_out", "p_out"], ["y"]),
            helper.make_node("Sub", ["a", "b"], ["z"]),
        ],
        "body",
        [vi("s_in", F, [3]), vi("p_in", F, [3]), vi("a", F, [3]), vi("b", F, [3])],
        [vi("s_out", F, [3]), vi("p_out", F, [3]), vi("y", F, [3]), vi("z", F, [3])],
    )
    node = helper.make_node(
        "Scan",
        ["s0", "p0", "A", "Bt"],
        ["s", "p", "Y", "Z"],
        body=body,
        num_scan_inputs=2,
        scan_input_axes=[0, 1],
        scan_input_directions=[0, 1],
        scan_output_axes=[1, 0],
        scan_output_directions=[0, 1],
    )
    g = helper.make_graph(
        [node],
        "scan_bidir",
        [vi("s0", F, [3]), vi("p0", F, [3]), vi("A", F, [5, 3]), vi("Bt", F, [3, 5])],
        [vi("s", F, [3]), vi("p", F, [3]), vi("Y", F, [3, 5]), vi("Z", F, [5, 3])],
    )
    return g, {"s0": (3,), "p0": (3,), "A": (5, 3), "Bt": (3, 5)}


def loop_fixed_trip():
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Mul", ["y_in", "half"], ["h"]),
            helper.make_node("Mul", ["x", "fi"], ["xi"]),
            helper.make_node("Add", ["h", "xi"], ["y_out"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("ReduceSum", ["y_out"], ["total"], keepdims=0),
        ],
        "body",
        [vi("i", I64, []), vi("c_in", B, []), vi("y_in", F, [2, 3])],
        [vi("c_out", B, []), vi("y_out", F, [2, 3]), vi("total", F, [])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "y0"], ["y", "totals"], body=body)],
        "loop_fixed_trip",
        [vi("x", F, [2, 3]), vi("y0", F, [2, 3])],
        [vi("y", F, [2, 3]), vi("totals", F, [6])],
        [numpy_helper.from_array(np.array(6, np.int64), "M")],
    )
    return g, {"x": (2, 3), "y0": (2, 3)}


def loop_data_cond():
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["y_in", "two"], ["m"]),
            helper.make_node("Add", ["m", "x"], ["m1"]),
            helper.make_node("Add", ["m1", "one"], ["y_out"]),
            helper.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
            helper.make_node("Less", ["s", "limit"], ["c_out"]),
            helper.make_node("Add", ["n_in", "onei"], ["n_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("c_in", B, []), vi("y_in", F, [4]), vi("n_in", I64, [])],
        [vi("c_out", B, []), vi("y_out", F, [4]), vi("n_out", I64, [])],
        [
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
            numpy_helper.from_array(np.array(1, np.int64), "onei"),
            numpy_helper.from_array(np.array(12.0, np.float32), "limit"),
        ],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "c0", "y0", "n0"], ["y", "n"], body=body)],
        "loop_data_cond",
        [vi("x", F, [4]), vi("y0", F, [4])],
        [vi("y", F, [4]), vi("n", I64, [])],
        [
            numpy_helper.from_array(np.array(8, np.int64), "M"),
            numpy_helper.from_array(np.array(True), "c0"),
            numpy_helper.from_array(np.array(0, np.int64), "n0"),
        ],
    )
    return g, {"x": (4,), "y0": (4,)}


def loop_grows():
    body = helper.make_graph(
        [
            helper.make_node("Gather", ["rows_in", "last"], ["tail"], axis=0),
            helper.make_node("Mul", ["tail", "x"], ["next"]),
            helper.make_node("Unsqueeze", ["next", "zero"], ["row"]),
            helper.make_node("Concat", ["rows_in", "row"], ["rows_out"], axis=0),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("c_in", B, []), vi("rows_in", F, None)],
        [vi("c_out", B, []), vi("rows_out", F, None)],
        [
            numpy_helper.from_array(np.array(-1, np.int64), "last"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
        ],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "r0"], ["rows"], body=body)],
        "loop_grows",
        [vi("x", F, [3]), vi("r0", F, [1, 3])],
        [vi("rows", F, [5, 3])],
        [numpy_helper.from_array(np.array(4, np.int64), "M")],
    )
    return g, {"x": (3,), "r0": (1, 3)}


def dynamic_quant_linear():
    rng = np.random.default_rng(7)
    w = rng.integers(0, 256, (8, 5), dtype=np.uint8)
    w_zp = rng.integers(100, 156, (5,), dtype=np.uint8)
    w_scale = np.array(0.02, np.float32)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "W", "xz", "Wz"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=F),
        helper.make_node("Mul", ["xs", "Ws"], ["scale"]),
        helper.make_node("Mul", ["accf", "scale"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "dynamic_quant_linear",
        [vi("x", F, [3, 8])],
        [vi("y", F, [3, 5])],
        [
            numpy_helper.from_array(w, "W"),
            numpy_helper.from_array(w_zp, "Wz"),
            numpy_helper.from_array(w_scale, "Ws"),
        ],
    )
    return g, {"x": (3, 8)}


CASES = [scan_bidir, loop_fixed_trip, loop_data_cond, loop_grows, dynamic_quant_linear]


def main(out):
    for k, make in enumerate(CASES):
        g, shapes = make()
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        rng = np.random.default_rng(100 + k)
        feeds = {n: rng.uniform(-1.0, 1.0, s).astype(np.float32) for n, s in shapes.items()}
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        outs = sess.run(None, feeds)
        d = os.path.join(out, make.__name__)
        os.makedirs(d, exist_ok=True)
        onnx.save(model, os.path.join(d, "model.onnx"))
        save_file(feeds, os.path.join(d, "inputs.safetensors"))
        save_file({n: np.ascontiguousarray(o) for n, o in zip(names, outs)}, os.path.join(d, "expected.safetensors"))
        print(make.__name__, {n: o.shape for n, o in zip(names, outs)})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
