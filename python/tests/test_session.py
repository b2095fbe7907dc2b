"""The session's call shapes, its errors, zero-copy arrays, DLPack, threads
and the GIL, on small traces and models."""

import threading
import time

import numpy as np
import pytest

import switchyard
from conftest import load_safetensors


def test_inputs_outputs_and_a_run(double_trace):
    session = switchyard.InferenceSession(double_trace)
    (x,) = session.get_inputs()
    assert (x.name, x.type, x.shape) == ("x", "tensor(float)", [2, 3])
    (y,) = session.get_outputs()
    assert y.name == "y"
    out = session.run(None, {"x": np.arange(6, dtype=np.float32).reshape(2, 3)})
    np.testing.assert_array_equal(out[0], np.arange(6, dtype=np.float32).reshape(2, 3) * 2)
    assert session.run(["y"], {"x": np.ones((2, 3), np.float32)})[0].sum() == 12


def test_outputs_are_arrays_over_the_runs_memory_and_writable(double_trace):
    session = switchyard.InferenceSession(double_trace)
    (out,) = session.run(None, {"x": np.ones((2, 3), np.float32)})
    assert isinstance(out.base, switchyard.OutputBuffer)
    assert not out.base.copied, "the run's output was copied"
    assert out.base.address == out.ctypes.data
    assert out.flags.writeable and out.flags.c_contiguous
    out[0, 0] = 7.0
    # The next run writes elsewhere: the array is the caller's.
    (again,) = session.run(None, {"x": np.ones((2, 3), np.float32)})
    assert out[0, 0] == 7.0 and again[0, 0] == 2.0


def test_an_output_that_is_a_view_of_an_input_is_copied(tmp_path):
    path = tmp_path / "view.trace"
    path.write_text("input x: f32[2, 3]\ny = transpose(x, perm=[1, 0])\noutput y\n")
    session = switchyard.InferenceSession(path)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_array_equal(y, x.T)
    y[0, 0] = 99.0
    assert x[0, 0] == 0.0, "writing the output wrote the caller's input"


def test_contiguous_inputs_are_read_in_place_and_others_copied():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert switchyard._switchyard._input_address(a) == a.ctypes.data
    t = a.T
    assert switchyard._switchyard._input_address(t) != t.ctypes.data
    # Not aligned for its type: copied, not read in place.
    raw = np.zeros(4 * 6 + 1, dtype=np.uint8)
    odd = raw[1:].view(np.float32)
    assert not odd.flags.aligned
    assert switchyard._switchyard._input_address(odd) != odd.ctypes.data


def test_strided_byteswapped_and_dlpack_inputs_give_the_same_results(double_trace):
    session = switchyard.InferenceSession(double_trace)
    base = np.arange(6, dtype=np.float32).reshape(3, 2)
    want = base.T * 2
    for x in (base.T, np.ascontiguousarray(base.T).astype(">f4")):
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], want)

    class OnlyDlpack:
        """An array of another library: it speaks DLPack and nothing else."""

        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    (out,) = session.run(None, {"x": OnlyDlpack(np.ascontiguousarray(base.T))})
    np.testing.assert_array_equal(out, want)
    # Outputs leave through DLPack too, without a copy.
    back = np.from_dlpack(out)
    assert back.ctypes.data == out.ctypes.data


def test_errors_are_exceptions_with_switchyards_messages(double_trace, tmp_path):
    session = switchyard.InferenceSession(double_trace)
    x = np.ones((2, 3), np.float32)
    with pytest.raises(switchyard.InvalidArgument, match=r"input `z`: the model has no input of this name \(inputs: x\)"):
        session.run(None, {"x": x, "z": x})
    with pytest.raises(switchyard.InvalidArgument, match=r"input `x`: no tensor was given for it"):
        session.run(None, {})
    with pytest.raises(switchyard.InvalidArgument, match=r"output `w`: the model has no output of this name"):
        session.run(["w"], {"x": x})
    with pytest.raises(switchyard.SwitchyardError, match=r"x"):
        session.run(None, {"x": np.ones((2, 3), np.float64)})
    with pytest.raises(switchyard.SwitchyardError, match=r"x"):
        session.run(None, {"x": np.ones((3, 2), np.float32)})
    with pytest.raises(switchyard.InvalidArgument, match=r"input `x`: numpy dtype complex64"):
        session.run(None, {"x": np.ones((2, 3), np.complex64)})
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(switchyard.SwitchyardError, match="bad.onnx"):
        switchyard.InferenceSession(bad)
    with pytest.raises(switchyard.SwitchyardError, match="missing.onnx"):
        switchyard.InferenceSession(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="CUDAExecutionProvider"):
        switchyard.InferenceSession(double_trace, providers=["CUDAExecutionProvider"])
    with pytest.raises(ValueError, match="memory_limit"):
        switchyard.InferenceSession(double_trace, memory_limit="lots")
    with pytest.raises(switchyard.SwitchyardError, match="nope"):
        switchyard.InferenceSession(double_trace, executors="nope")
    with pytest.raises(ValueError, match="gpu0"):
        switchyard.InferenceSession(double_trace, target="gpu0")
    with pytest.raises(switchyard.SwitchyardError, match="target cuda:0 needs a GPU cost model"):
        switchyard.InferenceSession(double_trace, target="cuda:0")
    assert issubclass(switchyard.InvalidArgument, switchyard.SwitchyardError)


def test_what_the_session_warns_of_is_a_python_warning(double_trace, tmp_path):
    config = tmp_path / "optional.toml"
    config.write_text('[[plugin]]\npath = "/no/such/plugin.so"\noptional = true\n')
    with pytest.warns(UserWarning, match=r"/no/such/plugin.so.*optional: skipped"):
        switchyard.InferenceSession(double_trace, config=config)


def test_executors_are_chosen_as_providers(double_trace):
    assert "fallback" in switchyard.get_available_providers()
    session = switchyard.InferenceSession(double_trace, providers=["fallback"])
    assert session.get_providers() == ["fallback"]
    default = switchyard.InferenceSession(double_trace, providers=["CPUExecutionProvider"])
    assert default.get_providers()[-1] == "fallback" and len(default.get_providers()) > 1
    assert set(default.get_providers()) <= set(switchyard.get_available_providers())
    assert "fallback" in session.plan().summary()


def test_plan_explains_the_choice(double_trace):
    p = switchyard.plan(double_trace)
    assert "region" in p.summary() and p.summary() == str(p)
    assert len(p.explain()) > len(p.summary())


def test_plan_of_a_model_with_symbolic_dims_needs_their_shapes(tmp_path):
    path = _onnx_add_one(tmp_path / "add_one.onnx")
    with pytest.raises(switchyard.InvalidArgument, match=r"input `x`: its dims are not all fixed \(x: f32\[batch, 4\]\)"):
        switchyard.plan(path)
    session = switchyard.InferenceSession(path)
    assert "region" in session.plan({"x": [3, 4]}).explain()
    with pytest.raises(switchyard.InvalidArgument, match="input `y`: the model has no input of this name"):
        session.plan({"x": [3, 4], "y": [1]})


def test_eight_threads_share_one_session(models):
    d = models / "mlp"
    session = switchyard.InferenceSession(str(d / "model.onnx"))
    x = load_safetensors(d / "inputs.safetensors")["x"]
    feeds = [x * (k + 1) for k in range(8)]
    want = [session.run(None, {"x": f})[0] for f in feeds]
    got = [None] * 8
    errors = []

    def worker(k):
        try:
            for _ in range(20):
                got[k] = session.run(None, {"x": feeds[k]})[0]
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in range(8):
        np.testing.assert_array_equal(got[k], want[k])


def test_runs_release_the_gil(tmp_path):
    # A run long enough that a thread holding the GIL would stop the
    # counting loop below for all of it.
    path = tmp_path / "slow.trace"
    path.write_text(
        "input a: f32[384, 384]\n"
        + "".join(f"m{k} = matmul({'a' if k == 0 else f'm{k - 1}'}, a)\n" for k in range(60))
        + "output m59\n"
    )
    session = switchyard.InferenceSession(path, executors="fallback")
    a = np.full((384, 384), 1.0 / 384, dtype=np.float32)
    session.run(None, {"a": a})
    done = threading.Event()
    spans = []
    ticks = []

    def run():
        for _ in range(3):
            t0 = time.perf_counter()
            session.run(None, {"a": a})
            spans.append((t0, time.perf_counter()))
        done.set()

    t = threading.Thread(target=run)
    t.start()
    while not done.is_set():
        ticks.append(time.perf_counter())
    t.join()
    # A run holding the GIL would let this thread tick only at its edges;
    # released, this thread ticks through the middle half of every run.
    for t0, t1 in spans:
        quarter = (t1 - t0) / 4
        inside = sum(1 for x in ticks if t0 + quarter < x < t1 - quarter)
        assert inside > 0, f"no tick in the middle of a run of {1000 * (t1 - t0):.0f} ms"


def test_stats_count_compiles_per_shape(tmp_path):
    session = switchyard.InferenceSession(_onnx_add_one(tmp_path / "add_one.onnx"))
    assert session.get_inputs()[0].shape == ["batch", 4]
    for b in (1, 2, 1, 3, 2):
        (out,) = session.run(None, {"x": np.ones((b, 4), np.float32)})
        assert out.shape == (b, 4)
    s = session.stats()
    assert (s["runs"], s["compiles"], s["reused"]) == (5, 3, 2)
    assert s["compile_seconds"] > 0
    # Batch 2 is placed as batch 1 was; batch 3, past twice the batch that
    # placement was chosen at, is planned afresh. Without reuse, none is.
    assert s["placements_reused"] == 1
    fresh = switchyard.InferenceSession(tmp_path / "add_one.onnx", reuse_plans=False)
    for b in (1, 2, 3):
        fresh.run(None, {"x": np.ones((b, 4), np.float32)})
    assert fresh.stats()["placements_reused"] == 0


def _onnx_add_one(path):
    """An ONNX model y = x + 1 with x: float[batch, 4], at `path`."""
    # The protobuf by hand: a Graph with one Add node, one initializer and
    # a symbolic batch dim. Field numbers from onnx.proto.
    def varint(n):
        out = bytearray()
        while True:
            b = n & 0x7F
            n >>= 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)

    def field(num, wire, payload):
        key = varint((num << 3) | wire)
        if wire == 2:
            return key + varint(len(payload)) + payload
        return key + payload

    def s(num, text):
        return field(num, 2, text.encode())

    def dim(value=None, param=None):
        return field(1, 0, varint(value)) if value is not None else s(2, param)

    def value_info(name, dims):
        shape = b"".join(field(1, 2, d) for d in dims)
        tensor_type = field(1, 0, varint(1)) + field(2, 2, shape)
        return s(1, name) + field(2, 2, field(1, 2, tensor_type))

    one = field(1, 0, varint(1)) + field(2, 0, varint(1)) + s(8, "one") + field(9, 2, np.float32(1).tobytes())
    node = s(1, "x") + s(1, "one") + s(2, "y") + s(3, "add") + s(4, "Add")
    graph = (
        field(1, 2, node)
        + s(2, "g")
        + field(5, 2, one)
        + field(11, 2, value_info("x", [dim(param="batch"), dim(4)]))
        + field(12, 2, value_info("y", [dim(param="batch"), dim(4)]))
    )
    model = field(1, 0, varint(8)) + field(7, 2, graph) + field(8, 2, s(1, "") + field(2, 0, varint(17)))
    path.write_bytes(model)
    return path
