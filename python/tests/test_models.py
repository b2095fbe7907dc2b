"""The shared ONNX models through switchyard.InferenceSession, against their
expected outputs and, where it is installed, onnxruntime's."""

import numpy as np
import pytest

import switchyard
from conftest import assert_close, load_safetensors, shared_models

try:
    import onnxruntime
except ImportError:  # compared with the expected outputs alone
    onnxruntime = None

MODELS = shared_models()


def test_the_shared_models_are_found(models):
    assert len(MODELS) >= 20, f"found {MODELS} in {models}"


@pytest.mark.parametrize("name", MODELS)
def test_model_gives_its_expected_outputs(models, name):
    d = models / name
    session = switchyard.InferenceSession(str(d / "model.onnx"))
    feeds = load_safetensors(d / "inputs.safetensors")
    expected = load_safetensors(d / "expected.safetensors")
    names = [o.name for o in session.get_outputs()]
    outputs = session.run(None, feeds)
    assert len(outputs) == len(names)
    got = dict(zip(names, outputs))
    for k, want in expected.items():
        assert_close(got[k], want, f"{name}: {k}")
    # Some outputs by name, in the order asked.
    picked = session.run(list(reversed(names)), feeds)
    for k, out in zip(reversed(names), picked):
        assert_close(out, got[k], f"{name}: {k} by name")


@pytest.mark.skipif(onnxruntime is None, reason="onnxruntime is not installed")
@pytest.mark.parametrize("name", MODELS)
def test_model_matches_onnxruntime(models, name):
    d = models / name
    ours = switchyard.InferenceSession(str(d / "model.onnx"))
    theirs = onnxruntime.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"])
    for a, b in zip(ours.get_inputs(), theirs.get_inputs()):
        assert (a.name, a.type, a.shape) == (b.name, b.type, b.shape)
    for a, b in zip(ours.get_outputs(), theirs.get_outputs()):
        assert (a.name, a.type) == (b.name, b.type)
        # onnxruntime names the dims the exporter left unnamed; both agree
        # on every dim either fixes.
        assert len(a.shape) == len(b.shape)
        for x, y in zip(a.shape, b.shape):
            if isinstance(x, int) and isinstance(y, int):
                assert x == y
    feeds = load_safetensors(d / "inputs.safetensors")
    for k, (x, y) in enumerate(zip(ours.run(None, feeds), theirs.run(None, feeds))):
        assert_close(x, y, f"{name}: output {k} against onnxruntime")


def test_model_bytes_and_a_path_object_give_the_same_session(models):
    path = models / "mlp" / "model.onnx"
    feeds = load_safetensors(models / "mlp" / "inputs.safetensors")
    a = switchyard.InferenceSession(path).run(None, feeds)[0]
    b = switchyard.InferenceSession(path.read_bytes()).run(None, feeds)[0]
    np.testing.assert_array_equal(a, b)


def test_a_growing_kv_cache_compiles_each_length_once_and_gives_the_reference_tokens(models):
    import json

    d = models / "gpt2-kv-decode"
    reference = json.loads((d / "generate.json").read_text())
    session = switchyard.InferenceSession(str(d / "model.onnx"))
    inputs = {i.name: i for i in session.get_inputs()}
    assert any(isinstance(x, str) for x in inputs["past_key_values.0.key"].shape)
    pasts = sorted(n for n in inputs if n.startswith("past_key_values."))
    presents = [o.name for o in session.get_outputs() if o.name.startswith("present.")]
    ids = np.array([reference["runs"][0]["input_ids"]], dtype=np.int64)
    past = {n: np.zeros((1, 4, 0, 16), dtype=np.float32) for n in pasts}
    steps = 12
    tokens = []
    for step in range(steps):
        length = past[pasts[0]].shape[2]
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones((1, length + ids.shape[1]), dtype=np.int64),
            "position_ids": np.arange(length, length + ids.shape[1], dtype=np.int64)[None, :],
            **past,
        }
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        logits = outputs["logits"]
        token = int(np.argmax(logits[0, -1]))
        assert abs(float(logits[0, -1].max()) - reference["logits_max"][step]) < 1e-4
        tokens.append(token)
        ids = np.array([[token]], dtype=np.int64)
        past = {p: outputs[q] for p, q in zip(pasts, sorted(presents))}
    assert tokens == reference["generated"][:steps]
    stats = session.stats()
    assert stats["runs"] == steps
    assert stats["compiles"] + stats["reused"] == steps
    # Past lengths 0, 8 and 17 are planned afresh; 9 to 16 are placed as
    # 8 was, and 18 as 17 was.
    assert stats["placements_reused"] == stats["compiles"] - 3
