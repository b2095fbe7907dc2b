"""Shared fixtures: where the shared ONNX models are, and a reader for the
safetensors files beside them (the format is a length, a JSON header and
the raw elements, so no package is needed to read it)."""

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U64": np.uint64,
    "U32": np.uint32,
    "U16": np.uint16,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def load_safetensors(path):
    """The tensors of a safetensors file, by name, in the file's order."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        start, end = spec["data_offsets"]
        array = np.frombuffer(body[start:end], dtype=_DTYPES[spec["dtype"]])
        out[name] = array.reshape(spec["shape"]).copy()
    return out


def models_dir():
    """The shared ONNX models, or None where this checkout has none."""
    root = os.environ.get("SWITCHYARD_SHARED")
    path = Path(root) if root else REPO.parent / "shared"
    path = path / "onnx" / "models"
    return path if path.is_dir() else None


def shared_models():
    """Names of the shared models with a model, inputs and expected outputs."""
    root = models_dir()
    if root is None:
        return []
    return sorted(
        d.name
        for d in root.iterdir()
        if all((d / f).is_file() for f in ("model.onnx", "inputs.safetensors", "expected.safetensors"))
    )


def need_models():
    """Skips with the reason where the shared models are absent, unless the
    run requires them (SWITCHYARD_REQUIRE_DATA=1, as CI sets), then fails."""
    root = models_dir()
    if root is None:
        why = "the shared ONNX models (../shared/onnx/models) are absent"
        if os.environ.get("SWITCHYARD_REQUIRE_DATA") == "1":
            pytest.fail(why + ", and SWITCHYARD_REQUIRE_DATA=1 requires them")
        pytest.skip(why)
    return root


@pytest.fixture
def models():
    return need_models()


@pytest.fixture
def double_trace(tmp_path):
    """A trace with one input and one output: y = x * 2, f32[2, 3]."""
    path = tmp_path / "double.trace"
    path.write_text("input x: f32[2, 3]\ny = mul(x, 2.0)\noutput y\n")
    return path


def assert_close(got, want, name):
    """Floats within 1e-4 of the reference's largest magnitude; others exact."""
    assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}"
    if want.dtype.kind == "f" and want.size:
        scale = max(float(np.max(np.abs(want))), 1e-30)
        err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale
        assert err < 1e-4, f"{name}: largest error {err:.2e} of the output's magnitude"
    else:
        assert np.array_equal(got, want), f"{name}: values differ"
