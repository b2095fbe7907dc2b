"""switchyard as a torch.compile backend: models against eager PyTorch,
training steps, ops handed back to PyTorch, graph breaks and shapes that
change between calls."""

import copy
import gc
import os

import numpy as np
import pytest

from conftest import need_models

try:
    import torch
except ImportError:
    torch = None

if torch is None:
    if os.environ.get("SWITCHYARD_REQUIRE_TORCH") == "1":
        raise RuntimeError("torch is not installed, and SWITCHYARD_REQUIRE_TORCH=1 requires it")
    pytest.skip("torch is not installed", allow_module_level=True)

import torch.nn as nn  # noqa: E402

import switchyard.torch as st  # noqa: E402
from torch_models import MLP, build  # noqa: E402


_BEFORE = set()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    gc.collect()
    _BEFORE.clear()
    # Graphs an earlier test left alive are not this test's.
    _BEFORE.update(id(g) for g in st.compiled_graphs())
    yield
    torch._dynamo.reset()


def graphs():
    """The graphs this test compiled, oldest first."""
    return [g for g in st.compiled_graphs() if id(g) not in _BEFORE]


def handed_back():
    """The ops each graph this test compiled hands back to PyTorch."""
    return {g.name: sorted(g.handed_back) for g in graphs()}


def assert_close(got, want, what, tol=1e-5):
    """Within `tol` of the reference's largest magnitude (at least 1)."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    scale = max(want.detach().double().abs().max().item(), 1.0) if want.numel() else 1.0
    err = (got.detach().double() - want.detach().double()).abs().max().item() if want.numel() else 0.0
    assert err <= tol * scale, f"{what}: largest error {err:.3e} (scale {scale:.3g})"


def inputs_for(name, batch=2, seq=16):
    g = torch.Generator().manual_seed(7)
    if name == "mlp":
        return (torch.randn(batch, seq, 64, generator=g),)
    ids = torch.randint(0, 256, (batch, seq), generator=g)
    if name == "bert-tiny":
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[0, seq - 3 :] = 0
        return ids, mask
    return (ids,)


@pytest.mark.parametrize("name", ["mlp", "gpt2-tiny", "llama-tiny", "bert-tiny"])
def test_model_forward_equals_eager(name):
    models = need_models()
    model = build(models, name)
    compiled = torch.compile(model, backend="switchyard")
    args = inputs_for(name)
    with torch.no_grad():
        want = model(*args)
        got = compiled(*args)
    assert_close(got, want, name)
    # The model's own ops all run in switchyard: none handed back.
    assert all(not ops for ops in handed_back().values()), handed_back()


def test_switchyard_compile_takes_session_options():
    model = MLP().eval()
    x = torch.randn(3, 64)
    compiled = st.compile(model, executors="fuser,fallback")
    with torch.no_grad():
        assert_close(compiled(x), model(x), "mlp on fuser,fallback")
    with pytest.raises(TypeError, match="unknown option"):
        st.compile(model, executor="fuser")


def training_steps(model, make_batch, steps=3, lr=0.05):
    """Three SGD steps of `model` and of a compiled copy from the same
    weights: each step's loss and every gradient agree. Gives both."""
    ours = copy.deepcopy(model).train()
    model = model.train()
    compiled = torch.compile(ours, backend="switchyard")
    opt_ref = torch.optim.SGD(model.parameters(), lr=lr)
    opt = torch.optim.SGD(ours.parameters(), lr=lr)
    for step in range(steps):
        args, target = make_batch(step)
        loss_ref = nn.functional.mse_loss(model(*args), target)
        loss = nn.functional.mse_loss(compiled(*args), target)
        assert_close(loss, loss_ref, f"loss at step {step}")
        opt_ref.zero_grad()
        opt.zero_grad()
        loss_ref.backward()
        loss.backward()
        for (pname, p_ref), p in zip(model.named_parameters(), ours.parameters()):
            assert p.grad is not None, f"{pname}: no gradient at step {step}"
            assert_close(p.grad, p_ref.grad, f"gradient of {pname} at step {step}", tol=1e-4)
        opt_ref.step()
        opt.step()
    by_graph = handed_back()
    assert any(g.startswith("backward") for g in by_graph), f"no backward graph was compiled: {by_graph}"
    return model, ours


def test_training_step_of_the_mlp():
    torch.manual_seed(3)

    def batch(step):
        g = torch.Generator().manual_seed(step)
        return (torch.randn(4, 64, generator=g),), torch.randn(4, 64, generator=g)

    training_steps(MLP(), batch)


def test_training_step_of_llama_tiny():
    models = need_models()
    model = build(models, "llama-tiny")

    def batch(step):
        g = torch.Generator().manual_seed(step)
        return (torch.randint(0, 256, (2, 12), generator=g),), torch.randn(2, 12, 256, generator=g)

    training_steps(model, batch)


class WithCumprod(nn.Module):
    """A graph with an op switchyard lacks (cumprod) between two it has."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.cumprod(torch.sigmoid(self.a(x)), dim=-1))


def test_an_op_switchyard_lacks_runs_in_pytorch():
    torch.manual_seed(0)
    model = WithCumprod()
    compiled = torch.compile(model, backend="switchyard")
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert_close(compiled(x), model(x), "cumprod model")
    handed = handed_back()
    assert list(handed.values()) == [["aten.cumprod.default"]], handed
    assert list(handed)[0].startswith("inference"), handed
    # The plan shows the cut: the extern op on the `torch` executor, the
    # ops around it on switchyard's.
    (graph,) = graphs()
    explain = graph.plans()[0].explain()
    assert "extern" in explain and "torch" in explain, explain
    assert "matmul" in explain or "linear" in explain, explain
    # Its gradient goes through PyTorch's cumprod backward, and agrees.
    torch._dynamo.reset()
    training_steps(WithCumprod(), lambda s: ((torch.randn(4, 8),), torch.randn(4, 8)))


def test_a_graph_break_compiles_both_sides():
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)

    def f(x):
        y = torch.relu(lin(x))
        torch._dynamo.graph_break()
        return torch.tanh(lin(y)) * 2

    compiled = torch.compile(f, backend="switchyard")
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert_close(compiled(x), f(x), "graph break")
    assert len(handed_back()) == 2, handed_back()


@pytest.mark.parametrize("dynamic", [False, True])
def test_shapes_that_change_between_calls(dynamic):
    models = need_models()
    model = build(models, "gpt2-tiny")
    compiled = torch.compile(model, backend="switchyard", dynamic=dynamic)
    with torch.no_grad():
        for batch, seq in [(2, 8), (2, 12), (3, 12), (2, 8)]:
            (ids,) = inputs_for("gpt2-tiny", batch, seq)
            assert_close(compiled(ids), model(ids), f"gpt2-tiny at [{batch}, {seq}], dynamic={dynamic}")
    compiled_graphs = graphs()
    if dynamic:
        # One graph with symbolic sizes; switchyard compiles a program per
        # shape, the last call reusing the first's.
        assert len(compiled_graphs) == 1, [g.name for g in compiled_graphs]
        assert len(compiled_graphs[0].programs) == 3
    else:
        assert len(compiled_graphs) >= 2


def test_outputs_keep_the_strides_pytorch_traced():
    def f(x):
        return (x * 2).t(), x + 1

    compiled = torch.compile(f, backend="switchyard")
    x = torch.randn(4, 6)
    got_t, got = compiled(x)
    want_t, want = f(x)
    assert_close(got_t, want_t, "transposed output")
    assert got_t.stride() == want_t.stride()
    assert_close(got, want, "plain output")


def test_inputs_are_read_in_place_and_outputs_are_tensors_over_the_run():
    def f(x):
        return x * 3

    compiled = torch.compile(f, backend="switchyard")
    x = torch.randn(8, 8)
    y = compiled(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    assert np.allclose(y.numpy(), x.numpy() * 3)


def test_a_tensor_off_the_cpu_is_refused_with_its_name():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    compiled = torch.compile(lambda x: x + 1, backend="switchyard")
    with pytest.raises(Exception, match="CPU"):
        compiled(torch.ones(2, device="cuda"))


def test_weights_are_constants_until_they_change():
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torch.compile(model, backend="switchyard")
    x = torch.randn(5, 64)
    with torch.no_grad():
        assert_close(compiled(x), model(x), "first call")
        (graph,) = graphs()
        # The parameters are constants of the program: not fed per call.
        assert len(graph.programs) == 1
        (program,) = graph.programs.values()
        assert len(program.weights) == len(list(model.parameters()))
        # Written in place: the program is made again, with the new weights.
        model[0].weight.mul_(-1.0)
        assert_close(compiled(x), model(x), "after an in-place write")
        assert graph.weight_changes == 1
        # Replaced by another tensor of the same shape.
        model[2].weight.data = torch.randn_like(model[2].weight)
        assert_close(compiled(x), model(x), "after replacing a weight")
        assert graph.weight_changes == 2
        compiled(x)
        assert graph.weight_changes == 2, "an unchanged weight made the program again"


F = nn.functional
OPS = {
    "add_alpha": (lambda x, y: torch.add(x, y, alpha=2.0), "ff"),
    "sub_alpha_rsub": (lambda x, y: torch.sub(x, y, alpha=0.5) + (1.0 - x), "ff"),
    "int_true_div": (lambda x, y: (x * 10).int() / 3, "ff"),
    "bool_sum": (lambda x, y: (x > 0).sum(-1), "ff"),
    "clamp_masked_fill_where": (lambda x, y: torch.where(x > 0, x.clamp(-0.5, 0.5), y.masked_fill(y < 0, 1.5)), "ff"),
    "gelu_tanh_softmax0_log_softmax": (lambda x, y: F.gelu(x, approximate="tanh") + x.softmax(0) + y.log_softmax(-1), "ff"),
    "reductions": (lambda x, y: x.amax(0) + x.mean((0, 1), keepdim=True).sum() + x.prod(1).sum() + y.amin(-1).sum(), "ff"),
    "any_all": (lambda x, y: (x > 0).any(-1) | (y > 0).all(0)[:2].sum().bool(), "ff"),
    "slices_select_split": (lambda x, y: x[1:, ::2].sum() + x.select(0, 1).sum() + sum(p.sum() for p in y.split(2, dim=1)), "ff"),
    "cat_t_matmul": (lambda x, y: torch.cat([x, y * 2], 1).t() @ x, "ff"),
    "arange_full_zeros": (lambda x, y: torch.arange(4) * x[0, :4] + torch.full((3, 4), 2.0) + torch.zeros_like(y), "ff"),
    "cumsum_cast": (lambda x, y: torch.cumsum(x, 0).double() + y.to(torch.float64), "ff"),
    "layer_norm": (lambda x, y: F.layer_norm(x, (4,), y[0], y[1]), "ff"),
    "pow_remainder_fmod": (lambda x, y: x.abs() ** 0.5 + x ** 2 + x % 0.7 + torch.fmod(y, 0.3), "ff"),
    "index_gather_embedding": (
        lambda x, i: x[i] .sum() + torch.gather(x, 1, i.view(2, 2) % 4).sum() + F.embedding(i % 3, x).sum(), "fi"),
    "scatter_add": (lambda x, i: torch.zeros(3, 4).scatter_add(0, (i.view(1, 4) % 3).expand(3, 4), x), "fi"),
}


@pytest.mark.parametrize("name", list(OPS))
def test_aten_ops_are_mapped_and_equal_eager(name):
    f, kinds = OPS[name]
    g = torch.Generator().manual_seed(1)
    args = [torch.randn(3, 4, generator=g) if k == "f" else torch.tensor([2, 0, -1, 1]) for k in kinds]
    compiled = torch.compile(f, backend="switchyard")
    want = f(*args)
    got = compiled(*args)
    assert_close(got, want, name)
    assert all(not ops for ops in handed_back().values()), handed_back()


def test_run_dlpack_reads_capsules_in_place_and_gives_capsules():
    import switchyard

    session = switchyard.InferenceSession.from_trace("input x: f32[2, 3]\ny = mul(x, 2.0)\noutput y, x\n")
    x = torch.randn(2, 3)
    capsule = torch.utils.dlpack.to_dlpack(x)
    y, x_again = [torch.from_dlpack(c) for c in session.run_dlpack([capsule])]
    assert torch.equal(y, x * 2)
    # An output that is the input itself is a copy, never the caller's memory.
    assert torch.equal(x_again, x) and x_again.data_ptr() != x.data_ptr()
    with pytest.raises(switchyard.InvalidArgument, match="consumed"):
        session.run_dlpack([capsule])
    with pytest.raises(switchyard.InvalidArgument, match="0 input.s. given, the model has 1"):
        session.run_dlpack([])
    # Anything run takes is taken too; an output capsule no one consumes is freed.
    (out, _) = session.run_dlpack([np.ones((2, 3), np.float32)])
    del out


class SmallCNN(nn.Sequential):
    """Convolution, batch norm, max and average pools, a grouped strided
    convolution, global pooling and a linear head."""

    def __init__(self):
        super().__init__(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=2, groups=2), nn.ReLU(), nn.AvgPool2d(2, ceil_mode=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
        )


def test_a_small_cnn_equals_eager():
    torch.manual_seed(0)
    model = SmallCNN()
    with torch.no_grad():  # statistics that are not the defaults
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    model.eval()
    compiled = torch.compile(model, backend="switchyard")
    x = torch.randn(2, 3, 17, 17)
    with torch.no_grad():
        assert_close(compiled(x), model(x), "small CNN")
    assert all(not ops for ops in handed_back().values()), handed_back()
    explain = graphs()[0].plans()[0].explain()
    assert "conv" in explain and "max_pool" in explain, explain


def test_training_step_of_a_small_cnn():
    torch.manual_seed(0)

    def batch(step):
        g = torch.Generator().manual_seed(step)
        return (torch.randn(4, 3, 16, 16, generator=g),), torch.randn(4, 10, generator=g)

    eager, ours = training_steps(SmallCNN(), batch)
    # The batch norm's running statistics were updated as eager's were.
    assert_close(ours[1].running_mean, eager[1].running_mean, "running mean")
    assert_close(ours[1].running_var, eager[1].running_var, "running variance")
    assert int(ours[1].num_batches_tracked) == 3
    # What switchyard lacks in the backward runs in PyTorch.
    backward = [ops for name, ops in handed_back().items() if name.startswith("backward")]
    assert any("aten.convolution_backward.default" in ops for ops in backward), handed_back()


class CachedAttention(nn.Module):
    """One head of attention over a key/value cache kept in buffers and
    written in place at each step, as a decoder's KV cache is."""

    def __init__(self, width=8, length=6):
        super().__init__()
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * width)
        self.register_buffer("k_cache", torch.zeros(1, length, width))
        self.register_buffer("v_cache", torch.zeros(1, length, width))

    def forward(self, x, pos: int):
        k, v = self.kv(x).chunk(2, dim=-1)
        self.k_cache[:, pos : pos + 1] = k
        self.v_cache[:, pos : pos + 1] = v
        keys, values = self.k_cache[:, : pos + 1], self.v_cache[:, : pos + 1]
        scores = (self.q(x) @ keys.transpose(1, 2)).softmax(-1)
        return scores @ values


def test_a_cache_written_in_place_is_honoured():
    torch.manual_seed(0)
    model = CachedAttention().eval()
    ours = copy.deepcopy(model)
    compiled = torch.compile(ours, backend="switchyard")
    with torch.no_grad():
        for pos in range(4):
            x = torch.randn(1, 1, 8)
            assert_close(compiled(x, pos), model(x, pos), f"step {pos}")
            assert_close(ours.k_cache, model.k_cache, f"key cache after step {pos}")
            assert_close(ours.v_cache, model.v_cache, f"value cache after step {pos}")


def test_an_output_that_views_an_input_stays_a_view():
    def f(x):
        return x[1:].t(), x * 2

    compiled = torch.compile(f, backend="switchyard")
    x = torch.randn(3, 4)
    view, doubled = compiled(x)
    assert_close(doubled, x * 2, "doubled")
    # Writing the view writes the input, as eager's view would.
    view[0, 0] = 42.0
    assert x[1, 0].item() == 42.0


@pytest.mark.parametrize("e", [0, 1, 2, 3, 4, -2, 0.5, -0.5, -1, 1.7])
def test_powers_by_a_number(e):
    f = lambda x: (x.abs() + 0.1) ** e  # noqa: E731
    x = torch.randn(4, 5)
    compiled = torch.compile(f, backend="switchyard")
    assert_close(compiled(x), f(x), f"x ** {e}")
    assert all(not ops for ops in handed_back().values()), handed_back()
