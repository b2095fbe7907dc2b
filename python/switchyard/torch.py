"""switchyard as a ``torch.compile`` backend.

    import torch, switchyard.torch
    model = torch.compile(model, backend="switchyard")   # or:
    model = switchyard.torch.compile(model, executors="fuser,gemm,fallback")

Dynamo captures the model's graph; AOTAutograd lowers it to ATen ops, and
splits a training graph into its forward and its backward, both of which
are compiled here. Each graph is written as a switchyard trace (see
``_lower``) and run by an :class:`switchyard.InferenceSession` over it, one
compiled plan per input-shape signature.

An ATen op switchyard lacks becomes an ``extern`` op of the trace, which
only the ``torch`` executor claims: it calls the op back in PyTorch. The
partitioner places it as any other op, so the graph is cut into
switchyard's regions and PyTorch's by the plan's cost, and the session's
``plan(...).explain()`` shows the cut. :func:`handed_back` lists the ops
a compiled graph hands back.

Tensors cross without copies: inputs are read in place where contiguous
(``torch.Tensor`` gives ``__dlpack__``), and outputs are tensors over the
memory the run wrote. Only the CPU is supported; a graph with a tensor
elsewhere is refused with an error naming it.
"""

from __future__ import annotations

import math
import operator
import threading
import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.utils.dlpack
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd

from . import InferenceSession, SwitchyardError

__all__ = ["backend", "compile", "compiled_graphs", "handed_back", "CompiledGraph", "SESSION_OPTIONS"]

aten = torch.ops.aten
prims = torch.ops.prims

#: The keyword options a backend passes on to each graph's session.
SESSION_OPTIONS = (
    "executors",
    "config",
    "threads",
    "memory_limit",
    "autotune",
    "shapes_kept",
    "reuse_plans",
)

_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "bool",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int16: "i16",
}


def compile(model: Any, *, dynamic: Optional[bool] = None, fullgraph: bool = False, **options: Any) -> Any:
    """``torch.compile(model, backend=switchyard)`` with these session
    options (``executors``, ``config``, ``threads``, ``memory_limit``,
    ``autotune``, ``shapes_kept``, ``reuse_plans``: as
    :class:`switchyard.InferenceSession` takes them)."""
    return torch.compile(model, backend=_Backend(options), dynamic=dynamic, fullgraph=fullgraph)


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any) -> Callable:
    """The Dynamo backend (``torch.compile(model, backend="switchyard")``):
    the graph through AOTAutograd, its forward and backward compiled here."""
    return _Backend(options)(gm, example_inputs)


class _Backend:
    """A backend with its session options, which Dynamo calls once per
    captured graph (a graph break makes several)."""

    def __init__(self, options: Dict[str, Any]):
        unknown = sorted(set(options) - set(SESSION_OPTIONS))
        if unknown:
            raise TypeError(
                f"switchyard.torch: unknown option(s) {', '.join(unknown)} (known: {', '.join(SESSION_OPTIONS)})"
            )
        self.options = options

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        training = torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
        )

        if training:
            _attention_as_math(gm)
        def compiler(kind: str) -> Callable:
            def compile_graph(g: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable:
                return CompiledGraph(g, kind, self.options)

            return compile_graph

        return aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
            decompositions=_decompositions(),
        )(gm, example_inputs)


_SDPA = (torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)


def _sdpa_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None, dropout_p: float = 0.0,
               is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> torch.Tensor:
    """Scaled dot-product attention in plain ops, as PyTorch defines it."""
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    scale = 1.0 / float(q.shape[-1]) ** 0.5 if scale is None else scale
    scores = (q * scale) @ k.transpose(-2, -1)
    if is_causal:
        l, s = q.shape[-2], k.shape[-2]
        keep = torch.ones(l, s, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    p = scores.softmax(-1)
    if dropout_p:
        p = torch.nn.functional.dropout(p, dropout_p)
    return p @ v


def _attention_as_math(gm: torch.fx.GraphModule) -> None:
    """Attention in a graph to be trained, written as plain ops: its
    backward is then theirs, which switchyard runs and fuses. (Through
    PyTorch's CPU flash-attention op, AOTAutograd with the core
    decompositions gave wrong gradients in torch 2.15, run eagerly too:
    a block whose output feeds `cumprod`.)"""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _SDPA:
            node.target = _sdpa_math
            changed = True
    if changed:
        gm.recompile()


def _decompositions() -> Dict[Any, Callable]:
    """PyTorch's core ATen decompositions, less those of the ops this
    backend maps whole onto switchyard's composites."""
    table = dict(core_aten_decompositions())
    keep = [aten.silu, aten.scaled_dot_product_attention, aten._scaled_dot_product_flash_attention_for_cpu]
    for op in list(table):
        if getattr(op, "overloadpacket", None) in keep:
            del table[op]
    return table


_REGISTRY_LOCK = threading.Lock()
_GRAPHS: List["weakref.ref[CompiledGraph]"] = []


def compiled_graphs() -> List["CompiledGraph"]:
    """The graphs compiled by this backend that are still in use, oldest
    first (``torch._dynamo.reset()`` lets go of them)."""
    with _REGISTRY_LOCK:
        alive = [g for g in (r() for r in _GRAPHS) if g is not None]
        _GRAPHS[:] = [weakref.ref(g) for g in alive]
        return alive


def handed_back() -> Dict[str, List[str]]:
    """The ATen ops each graph in use hands back to PyTorch, by graph
    (``forward 0``, ``backward 0``, ``inference 0``...): the ``extern``
    ops of its traces."""
    return {g.name: sorted(g.handed_back) for g in compiled_graphs()}


class CompiledGraph:
    """One ATen graph, run by switchyard: a trace and a session per
    signature of its inputs (shapes, dtypes and the values of its integer
    inputs), made at the first call with that signature. It is called
    with its inputs in one list, which it empties (AOTAutograd's boxed
    convention), so that they may be freed as soon as they are read."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str, options: Dict[str, Any]):
        self.kind = kind  # inference, forward or backward
        # An attribute of the instance: PyTorch's wrappers copy `__dict__`.
        self._boxed_call = True
        self.gm = gm
        self.options = options
        self.programs: Dict[Tuple, _Program] = {}
        self.keyed: Optional[List[Tuple[int, Optional[bool]]]] = None
        self.handed_back: set = set()
        #: Programs made again because a weight they took as a constant
        #: was changed in place or replaced.
        self.weight_changes = 0
        self.lock = threading.Lock()
        same_kind = sum(g.name.startswith(kind) for g in compiled_graphs())
        self.name = f"{kind} {same_kind}"
        with _REGISTRY_LOCK:
            _GRAPHS.append(weakref.ref(self))

    def __call__(self, args: List[Any]) -> List[Any]:
        if self.keyed is None:
            self.keyed = self._keyed(args)
        key = tuple(args[i] if shaped is None else args[i].shape for i, shaped in self.keyed)
        program = self.programs.get(key)
        if program is None or (program.weights and not program.weights_unchanged(args)):
            with self.lock:
                program = self.programs.get(key)
                if program is None or not program.weights_unchanged(args):
                    if program is not None:
                        self.weight_changes += 1
                    program = _Program(self.gm, args, self.frozen(args), self.options, f"{self.name} {len(self.programs)}")
                    self.handed_back |= program.handed_back
                    self.programs[key] = program
        inputs = list(args)
        args.clear()  # the boxed convention: the caller's list lets go of the inputs
        return program.run(inputs)

    def _keyed(self, args: Sequence[Any]) -> List[Tuple[int, Optional[bool]]]:
        """What tells one signature from another: the numbers among the
        inputs (Dynamo's symbolic sizes), and the shape of each tensor
        input that PyTorch traced with a symbolic size. Dynamo's guards
        hold the rest (dtypes, devices, static shapes) fixed for this
        graph."""
        placeholders = list(self.gm.graph.find_nodes(op="placeholder"))
        keyed = []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                keyed.append((i, None))
                continue
            val = placeholders[i].meta.get("val") if i < len(placeholders) else None
            if not isinstance(val, torch.Tensor) or not _static(val):
                keyed.append((i, True))
        return keyed

    def frozen(self, args: Sequence[Any]) -> List[int]:
        """The inputs an inference graph's programs take as constants: the
        model's parameters, which their kernels then prepare once (a GEMM
        packs its weight). A training graph's parameters change every
        step, so it takes none."""
        if self.kind != "inference":
            return []
        return [i for i, a in enumerate(args) if isinstance(a, torch.nn.Parameter)]

    def plans(self) -> List[Any]:
        """The plan of each program compiled so far, in the order they
        were made (a plan's ``explain()`` says which executor runs each
        op, and why)."""
        return [p.session.plan() for p in list(self.programs.values())]

    def traces(self) -> List[str]:
        """The trace text of each program compiled so far."""
        return [p.text for p in list(self.programs.values())]


class _Value:
    """A value of the trace being written: its name, dtype and shape."""

    __slots__ = ("name", "shape", "dtype", "known", "transpose_of", "reshape_of")

    def __init__(self, name: str, shape: Sequence[int], dtype: torch.dtype):
        self.name = name
        self.shape = list(shape)
        self.dtype = dtype
        #: Its contents where no input of the graph reaches it, else None.
        self.known: Optional[torch.Tensor] = None
        #: The matrix it is the transpose of, where it is one.
        self.transpose_of: Optional["_Value"] = None
        #: The value it is a reshape of, where it is one.
        self.reshape_of: Optional["_Value"] = None

    @property
    def meta(self) -> torch.Tensor:
        """A tensor of its dtype and shape on the meta device."""
        return torch.empty(self.shape, dtype=self.dtype, device="meta")


class _M(NamedTuple):
    """The dtype and shape of a value a rule is about to write."""

    shape: List[int]
    dtype: torch.dtype


class _Unsupported(Exception):
    """The op is not mapped onto switchyard's IR with these arguments: it
    is handed back to PyTorch."""


class _Program:
    """A graph at one input signature: its trace, the session over it, and
    how to assemble the graph's outputs from the session's."""

    def __init__(self, gm: torch.fx.GraphModule, args: List[Any], frozen: Sequence[int], options: Dict[str, Any],
                 name: str):
        self.name = name
        lowered = _Lower(gm, args)
        self.text = lowered.text()
        self.handed_back = {str(target) for target, _ in lowered.externs.values()}
        self.externs = lowered.externs
        self.outputs = lowered.outputs  # per graph output: ("out", k) | ("arg", i) | ("const", v)
        # Constants: the graph's own tensors, and the inputs taken as
        # weights, each with what says it is unchanged at the next call.
        constants = {}
        self.feeds: List[Tuple[str, int]] = []
        self.weights: List[Tuple[int, torch.Tensor, int, int]] = []
        for input_name, source in lowered.feeds:
            if not isinstance(source, int):
                constants[input_name] = source
            elif source in frozen:
                w = args[source]
                constants[input_name] = w.detach()
                self.weights.append((source, w, w._version, w.data_ptr()))
            else:
                self.feeds.append((input_name, source))
        for input_name, t in constants.items():
            self._check_device(input_name, t)
        self.session = InferenceSession.from_trace(
            self.text,
            name=name,
            constants={k: _readable(t) for k, t in constants.items()},
            extern_runner=self._run_extern if self.externs else None,
            **{k: v for k, v in options.items() if k in SESSION_OPTIONS},
        )
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.feed_args = [i for _, i in self.feeds]
        # Each output's layout where PyTorch traced one other than the
        # contiguous layout the session gives.
        self.layouts: List[Optional[Tuple[tuple, tuple, torch.dtype]]] = []
        for o, (shape, stride, dtype) in zip(self.session.get_outputs(), lowered.out_meta):
            if tuple(o.shape) != shape:
                raise SwitchyardError(f"{name}: the trace's output {o.name} has shape {o.shape}, PyTorch's {shape}")
            contiguous = stride is None or stride == _contiguous_strides(shape) or math.prod(shape) <= 1
            self.layouts.append(None if contiguous else (shape, stride, dtype))

    def weights_unchanged(self, args: Sequence[Any]) -> bool:
        """Whether the weights this program took as constants are the same
        tensors, unwritten since (PyTorch counts each in-place write)."""
        return all(
            args[i] is w and w._version == version and w.data_ptr() == ptr for i, w, version, ptr in self.weights
        )

    def _check_device(self, name: str, t: torch.Tensor) -> None:
        if t.device.type != "cpu":
            raise SwitchyardError(f"{self.name}: input `{name}` is on {t.device}; switchyard.torch runs on the CPU")

    def run(self, args: List[Any]) -> List[Any]:
        feeds = [_dlpack(args[i]) for i in self.feed_args]
        results = [_from_dlpack(c) for c in self.session.run_dlpack(feeds)] if self.output_names else []
        outs = []
        for kind, v in self.outputs:
            if kind == "out":
                t = results[v]
                layout = self.layouts[v]
                outs.append(t if layout is None else torch.empty_strided(layout[0], layout[1], dtype=layout[2]).copy_(t))
            elif kind == "arg":
                outs.append(args[v])
            else:
                outs.append(v)
        return outs

    def _run_extern(self, fn: str, operands: List[Any]) -> List[torch.Tensor]:
        target, template = self.externs[fn]
        tensors = [torch.from_numpy(o) if not isinstance(o, (int, float, bool)) else o for o in operands]
        args, kwargs = _fill(template, tensors)
        with torch.no_grad():
            result = target(*args, **kwargs)
        flat = [result] if isinstance(result, torch.Tensor) else [r for r in result if isinstance(r, torch.Tensor)]
        inputs = [t for t in tensors if isinstance(t, torch.Tensor)]
        out = []
        for r in flat:
            r = r.contiguous()
            # an output over an operand's memory would outlive the call
            if any(_overlaps(r, i) for i in inputs):
                r = r.clone()
            out.append(r)
        return out


def _dlpack(t: torch.Tensor) -> Any:
    """A DLPack capsule over `t`'s memory (a contiguous copy where it is not
    contiguous), which the session consumes."""
    return _to_dlpack(t if t.is_contiguous() else t.contiguous())


_to_dlpack = torch.utils.dlpack.to_dlpack
_from_dlpack = getattr(torch._C, "_from_dlpack", torch.utils.dlpack.from_dlpack)


def _readable(t: torch.Tensor) -> torch.Tensor:
    """`t` as a session reads it in place: detached, contiguous."""
    if t.requires_grad:
        t = t.detach()
    return t if t.is_contiguous() else t.contiguous()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


class _Slot:
    """Where an extern op's k-th operand goes in its call's arguments."""

    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k


def _fill(template: Tuple[tuple, dict], operands: List[Any]) -> Tuple[list, dict]:
    def fill(x: Any) -> Any:
        if isinstance(x, _Slot):
            return operands[x.k]
        if isinstance(x, (list, tuple)):
            return type(x)(fill(y) for y in x)
        return x

    args, kwargs = template
    return [fill(a) for a in args], {k: fill(v) for k, v in kwargs.items()}


def _fmt(x: Any) -> str:
    """A scalar or attribute value in the trace text format."""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        r = repr(x)
        return r if any(c in r for c in ".ein") else r + ".0"
    if isinstance(x, torch.dtype):
        return _dtype(x)
    if isinstance(x, str):
        return '"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_fmt(y) for y in x) + "]"
    raise TypeError(f"cannot write {x!r} into a trace")


def _dtype(dt: torch.dtype) -> str:
    name = _DTYPES.get(dt)
    if name is None:
        raise _Unsupported(f"dtype {dt}")
    return name


_PROBES: Dict[Tuple[torch.dtype, bool], torch.Tensor] = {}


def _probe(x: Any) -> Any:
    """What decides a value's part in type promotion: its dtype and
    whether it has dims (a meta tensor of that kind, made once); a number
    as it is."""
    if not isinstance(x, _Value):
        return x
    key = (x.dtype, len(x.shape) == 0)
    probe = _PROBES.get(key)
    if probe is None:
        probe = _PROBES[key] = torch.empty(() if key[1] else (1,), dtype=x.dtype, device="meta")
    return probe


def _map_values(x: Any, f: Callable[["_Value"], Any]) -> Any:
    """`x` (an op's arguments: lists, tuples, dicts) with `f` of each value."""
    if isinstance(x, _Value):
        return f(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map_values(y, f) for y in x)
    if isinstance(x, dict):
        return {k: _map_values(v, f) for k, v in x.items()}
    return x


def _to_meta(x: Any) -> Any:
    return _map_values(x, lambda v: v.meta)


class _Lower:
    """Writes an ATen graph, at the shapes of the given inputs, as a
    switchyard trace. Every node is run on the meta device as it is
    written, so that each op's dtypes and shapes (and any symbolic size)
    are concrete; an op is mapped onto switchyard's ops by ``_RULES``, or
    becomes an ``extern`` op that PyTorch runs."""

    def __init__(self, gm: torch.fx.GraphModule, args: List[Any]):
        # (statement, names it defines, names it reads), in program order;
        # no names defined for the declarations that are always kept.
        self.lines: List[Tuple[str, Tuple[str, ...], Tuple[str, ...]]] = []
        self.count = 0
        self.feeds: List[Tuple[str, Any]] = []
        self.externs: Dict[str, Tuple[Any, Tuple[tuple, dict]]] = {}
        self.outputs: List[Tuple[str, Any]] = []
        self.out_meta: List[Tuple[tuple, Optional[tuple], torch.dtype]] = []
        self.gm = gm
        env: Dict[torch.fx.Node, Any] = {}
        placeholders = iter(range(len(args)))
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                i = next(placeholders)
                env[node] = self.placeholder(node, args[i], i)
            elif node.op == "get_attr":
                value = getattr(gm, node.target)
                env[node] = self.constant(node, value) if isinstance(value, torch.Tensor) else value
            elif node.op == "call_function":
                env[node] = self.call(node, env)
            elif node.op == "output":
                self.output(node.args[0], env, args)
            else:
                raise SwitchyardError(f"switchyard.torch: graph node {node.name} is a `{node.op}`, which is not supported")

    def text(self) -> str:
        """The trace, less the ops no output depends on (the transposed
        weight that a `linear` took whole, a value only an unused output
        of a rule read)."""
        live: set = set()
        kept = []
        for statement, defines, reads in reversed(self.lines):
            if defines and not any(d in live for d in defines):
                continue
            live.update(reads)
            kept.append(statement)
        return "\n".join(reversed(kept)) + "\n"

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def placeholder(self, node: torch.fx.Node, arg: Any, i: int) -> Any:
        if not isinstance(arg, torch.Tensor):
            return arg
        if arg.device.type != "cpu":
            raise SwitchyardError(
                f"switchyard.torch: input {node.name} is on {arg.device}; switchyard.torch runs on the CPU"
            )
        if arg.dtype not in _DTYPES or arg.dtype == torch.bfloat16:
            raise SwitchyardError(
                f"switchyard.torch: input {node.name} is {arg.dtype}, which switchyard.torch does not take yet"
            )
        name = f"in{i}"
        self.lines.append((f"input {name}: {_dtype(arg.dtype)}{list(arg.shape)}", (), ()))
        self.feeds.append((name, i))
        return _Value(name, arg.shape, arg.dtype)

    def constant(self, node: torch.fx.Node, value: torch.Tensor) -> _Value:
        name = f"c_{node.name}"
        self.lines.append((f"input {name}: {_dtype(value.dtype)}{list(value.shape)}", (), ()))
        self.feeds.append((name, value.detach()))
        v = _Value(name, value.shape, value.dtype)
        v.known = value.detach()
        return v

    def emit(self, kind: str, operands: Sequence[Any], out: torch.Tensor, **attrs: Any) -> _Value:
        """``v = kind(operands, attrs)``, whose result is `out` (meta)."""
        name = self.fresh()
        ops = ", ".join(o.name if isinstance(o, _Value) else _fmt(o) for o in operands)
        at = ", ".join(f"{k}={_fmt(v)}" for k, v in attrs.items() if v is not None)
        sep = ", " if ops and at else ""
        reads = tuple(o.name for o in operands if isinstance(o, _Value))
        self.lines.append((f"{name} = {kind}({ops}{sep}{at})", (name,), reads))
        return _Value(name, out.shape, out.dtype)

    def cast(self, x: Any, dtype: torch.dtype) -> Any:
        if not isinstance(x, _Value) or x.dtype == dtype:
            return x
        return self.emit("cast", [x], _M(list(x.shape), dtype), dtype=dtype)

    def call(self, node: torch.fx.Node, env: Dict[torch.fx.Node, Any]) -> Any:
        args = torch.fx.node.map_arg(node.args, lambda n: env[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
        target = node.target
        if target is operator.getitem:
            return args[0][args[1]]
        if not isinstance(target, torch._ops.OpOverload):
            # Python arithmetic on sizes (`sym_size * 2`): concrete here.
            return target(*_to_meta(args), **_to_meta(kwargs))
        out = node.meta.get("val")
        if not _static(out):
            # Symbolic sizes, or no traced value: run it on the meta device
            # with this signature's concrete inputs.
            try:
                out = target(*_to_meta(args), **_to_meta(kwargs))
            except Exception as e:  # an op without a meta kernel
                raise SwitchyardError(f"switchyard.torch: {node.name} = {target}: {e}") from e
        if not _has_tensor(out):
            return out  # a size (`sym_size`) or another number, concrete here
        rule = _RULES.get(target) or _RULES.get(target.overloadpacket)
        if rule is not None and _all_known(args) and _all_known(kwargs):
            # No input reaches it (a causal mask, an `arange`): computed
            # once, here, and bound as a constant of the program.
            return self.fold(node, target, args, kwargs)
        if rule is not None:
            mark = len(self.lines), self.count
            try:
                return rule(self, node, out, *args, **kwargs)
            except _Unsupported:
                del self.lines[mark[0] :]
                self.count = mark[1]
        return self.extern(node, target, out, args, kwargs)

    def fold(self, node: torch.fx.Node, target: Any, args: tuple, kwargs: dict) -> Any:
        """The op computed now by PyTorch on its operands' known values;
        each tensor of the result an input of the trace bound to it."""
        with torch.no_grad():
            result = target(*_known(args), **_known(kwargs))

        def bind(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            name = f"k{len(self.feeds)}_{node.name}"
            self.lines.append((f"input {name}: {_dtype(t.dtype)}{list(t.shape)}", (), ()))
            t = t.contiguous()
            self.feeds.append((name, t))
            v = _Value(name, t.shape, t.dtype)
            v.known = t
            return v

        if isinstance(result, torch.Tensor):
            return bind(result)
        return type(result)(bind(t) for t in result)

    def extern(self, node: torch.fx.Node, target: Any, out: Any, args: tuple, kwargs: dict) -> Any:
        """The op as an `extern` op of the trace: PyTorch runs it."""
        operands: List[_Value] = []

        def slot(x: Any) -> Any:
            if isinstance(x, _Value):
                operands.append(x)
                return _Slot(len(operands) - 1)
            if isinstance(x, (list, tuple)):
                return type(x)(slot(y) for y in x)
            return x

        template = ([slot(a) for a in args], {k: slot(v) for k, v in kwargs.items()})
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        tensors = [o for o in outs if isinstance(o, torch.Tensor)]
        if not tensors:
            raise SwitchyardError(f"switchyard.torch: {node.name} = {target} gives no tensor; it cannot be run")
        fn = f"{node.name}:{target}"
        self.externs[fn] = (target, template)
        names = [self.fresh() for _ in tensors]
        dtypes = "[" + ", ".join(_dtype(t.dtype) for t in tensors) + "]"
        shapes = "[" + ", ".join(str(list(t.shape)) for t in tensors) + "]"
        ops = "".join(f"{o.name}, " for o in operands)
        statement = f"{', '.join(names)} = extern({ops}fn={_fmt(fn)}, dtypes={dtypes}, shapes={shapes})"
        self.lines.append((statement, tuple(names), tuple(o.name for o in operands)))
        values = iter(_Value(n, t.shape, t.dtype) for n, t in zip(names, tensors))
        if isinstance(out, torch.Tensor):
            return next(values)
        return type(out)(next(values) if isinstance(o, torch.Tensor) else o for o in outs)

    def output(self, results: Any, env: Dict[torch.fx.Node, Any], args: List[Any]) -> None:
        values = torch.fx.node.map_arg(results, lambda n: env[n])
        placeholders = {id(v): i for i, v in ((i, env[n]) for i, n in enumerate(self.gm.graph.find_nodes(op="placeholder")))}
        names: List[str] = []
        for v in values:
            if isinstance(v, _Value):
                if id(v) in placeholders:
                    self.outputs.append(("arg", placeholders[id(v)]))
                    continue
                if v.name not in names:
                    names.append(v.name)
                self.outputs.append(("out", names.index(v.name)))
            else:
                self.outputs.append(("const", v))
        # Each output's strides as PyTorch traced them (None: not known).
        fx_outputs = results if isinstance(results, (list, tuple)) else [results]
        metas: Dict[str, Tuple[tuple, Optional[tuple], torch.dtype]] = {}
        for v, n in zip(values, fx_outputs):
            if isinstance(v, _Value) and v.name not in metas:
                val = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
                stride = tuple(val.stride()) if isinstance(val, torch.Tensor) and _concrete(val.stride()) else None
                shape = tuple(v.shape)
                metas[v.name] = (shape, stride, v.dtype)
        self.out_meta = [metas[n] for n in names]
        if names:
            self.lines.append(("output " + ", ".join(names), (), tuple(names)))


def _static(val: Any) -> bool:
    """Whether a node's traced value holds tensors, all of fixed sizes."""
    if isinstance(val, torch.Tensor):
        return all(type(d) is int for d in val.shape)
    if isinstance(val, (list, tuple)) and val:
        return all(v is None or _static(v) for v in val) and _has_tensor(val)
    return False


def _all_known(x: Any) -> bool:
    """Whether every value among an op's arguments has known contents."""
    if isinstance(x, _Value):
        return x.known is not None
    if isinstance(x, (list, tuple)):
        return all(_all_known(y) for y in x)
    if isinstance(x, dict):
        return all(_all_known(y) for y in x.values())
    return True


def _known(x: Any) -> Any:
    return _map_values(x, lambda v: v.known)


def _has_tensor(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    return isinstance(x, (list, tuple)) and any(_has_tensor(y) for y in x)


def _concrete(xs: Sequence[Any]) -> bool:
    return all(isinstance(x, int) for x in xs)


def _contiguous_strides(shape: Sequence[int]) -> tuple:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


# ---------------------------------------------------------------------------
# The rules: ATen op -> switchyard ops. Each takes the lowering, the node,
# the op's result on the meta device, then the node's arguments (trace
# values for tensors); it returns the result's value(s), or raises
# `_Unsupported` to hand the op back to PyTorch.

_RULES: Dict[Any, Callable] = {}


def _rule(*ops: Any) -> Callable:
    def register(f: Callable) -> Callable:
        for op in ops:
            _RULES[op] = f
        return f

    return register


def _tensor(x: Any) -> _Value:
    if not isinstance(x, _Value):
        raise _Unsupported("a tensor operand is not a value")
    return x


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


_UNARY = {
    aten.neg: "neg",
    aten.abs: "abs",
    aten.exp: "exp",
    aten.log: "log",
    aten.sqrt: "sqrt",
    aten.rsqrt: "rsqrt",
    aten.reciprocal: "reciprocal",
    aten.tanh: "tanh",
    aten.sigmoid: "sigmoid",
    aten.relu: "relu",
    aten.sin: "sin",
    aten.cos: "cos",
    aten.erf: "erf",
    aten.floor: "floor",
    aten.ceil: "ceil",
    aten.asin: "asin",
    aten.acos: "acos",
    aten.atan: "atan",
    aten.asinh: "asinh",
    aten.acosh: "acosh",
    aten.atanh: "atanh",
    aten.silu: "silu",
}


def _unary_rule(kind: str) -> Callable:
    def rule(lw: _Lower, node: Any, out: torch.Tensor, x: Any) -> _Value:
        x = lw.cast(_tensor(x), out.dtype)
        return lw.emit(kind, [x], out)

    return rule


for _op, _kind in _UNARY.items():
    _RULES[_op] = _unary_rule(_kind)


@_rule(aten.round.default)
def _round(lw: _Lower, node: Any, out: torch.Tensor, x: Any) -> _Value:
    return lw.emit("round", [_tensor(x)], out)


@_rule(aten.logical_not)
def _logical_not(lw: _Lower, node: Any, out: torch.Tensor, x: Any) -> _Value:
    return lw.emit("logical_not", [_tensor(x)], out)


@_rule(aten.bitwise_not)
def _bitwise_not(lw: _Lower, node: Any, out: torch.Tensor, x: Any) -> _Value:
    x = _tensor(x)
    return lw.emit("logical_not" if x.dtype == torch.bool else "bitwise_not", [x], out)


_BINARY = {
    aten.add: "add",
    aten.sub: "sub",
    aten.mul: "mul",
    aten.div: "div",
    aten.maximum: "maximum",
    aten.minimum: "minimum",
    aten.eq: "eq",
    aten.ne: "ne",
    aten.lt: "lt",
    aten.le: "le",
    aten.gt: "gt",
    aten.ge: "ge",
    aten.logical_and: "logical_and",
    aten.logical_or: "logical_or",
    aten.fmod: "fmod",
    aten.remainder: "remainder",
    aten.pow: "pow",
}


def _binary(lw: _Lower, kind: str, a: Any, b: Any, out: torch.Tensor) -> _Value:
    """`kind(a, b)` computed in the dtype PyTorch computes it in."""
    if not isinstance(a, _Value) and not isinstance(b, _Value):
        raise _Unsupported("no tensor operand")
    compute = torch.result_type(_probe(a), _probe(b))
    if kind in ("logical_and", "logical_or"):
        compute = torch.bool
    if kind == "div" and not compute.is_floating_point:
        compute = out.dtype  # true division of integers
    if kind == "pow" and not compute.is_floating_point:
        raise _Unsupported("integer pow")
    a, b = lw.cast(a, compute), lw.cast(b, compute)
    if isinstance(a, _Value) and isinstance(b, _Value) and a.dtype != b.dtype:
        raise _Unsupported("mixed dtypes")
    for s in (a, b):
        if not isinstance(s, _Value) and not isinstance(s, (bool, int, float)):
            raise _Unsupported(f"operand {s!r}")
    meta = _M(list(out.shape), torch.bool if out.dtype == torch.bool else compute)
    r = lw.emit(kind, [a, b], meta)
    return lw.cast(r, out.dtype)


def _binary_rule(kind: str) -> Callable:
    def rule(lw: _Lower, node: Any, out: torch.Tensor, a: Any, b: Any, *, alpha: Any = None, rounding_mode: Any = None) -> _Value:
        if rounding_mode is not None:
            raise _Unsupported("rounding_mode")
        if alpha is not None and alpha != 1:
            b = _binary(lw, "mul", b, alpha, _M(b.shape if isinstance(b, _Value) else [], out.dtype))
        return _binary(lw, kind, a, b, out)

    return rule


for _op, _kind in _BINARY.items():
    _RULES[_op] = _binary_rule(_kind)


@_rule(aten.rsub)
def _rsub(lw: _Lower, node: Any, out: torch.Tensor, a: Any, b: Any, *, alpha: Any = 1) -> _Value:
    if alpha != 1:
        raise _Unsupported("alpha")
    return _binary(lw, "sub", b, a, out)


@_rule(aten.bitwise_and, aten.bitwise_or, aten.bitwise_xor)
def _bitwise(lw: _Lower, node: Any, out: torch.Tensor, a: Any, b: Any) -> _Value:
    kind = node.target.overloadpacket.__name__
    if out.dtype == torch.bool and kind != "bitwise_xor":
        kind = {"bitwise_and": "logical_and", "bitwise_or": "logical_or"}[kind]
    return _binary(lw, kind, a, b, out)


@_rule(aten.where.self)
def _where(lw: _Lower, node: Any, out: torch.Tensor, c: Any, a: Any, b: Any) -> _Value:
    c = lw.cast(_tensor(c), torch.bool)
    return lw.emit("where", [c, lw.cast(a, out.dtype), lw.cast(b, out.dtype)], out)


@_rule(aten.masked_fill.Scalar)
def _masked_fill(lw: _Lower, node: Any, out: torch.Tensor, x: Any, mask: Any, value: Any) -> _Value:
    return lw.emit("where", [lw.cast(_tensor(mask), torch.bool), value, lw.cast(x, out.dtype)], out)


@_rule(aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default)
def _clamp(lw: _Lower, node: Any, out: torch.Tensor, x: Any, lo: Any = None, hi: Any = None) -> _Value:
    if node.target == aten.clamp_max.default:
        lo, hi = None, lo
    x = lw.cast(_tensor(x), out.dtype)
    if lo is not None:
        x = lw.emit("maximum", [x, lo], out)
    if hi is not None:
        x = lw.emit("minimum", [x, hi], out)
    return x


@_rule(aten.gelu.default)
def _gelu(lw: _Lower, node: Any, out: torch.Tensor, x: Any, *, approximate: str = "none") -> _Value:
    return lw.emit("gelu", [_tensor(x)], out, approximate=approximate)


@_rule(aten._softmax.default, aten._log_softmax.default)
def _softmax(lw: _Lower, node: Any, out: torch.Tensor, x: Any, dim: int, half_to_float: bool) -> _Value:
    kind = "softmax" if node.target == aten._softmax.default else "log_softmax"
    x = lw.cast(_tensor(x), out.dtype)
    return lw.emit(kind, [x], out, dim=dim)


def _reduce(lw: _Lower, kind: str, x: Any, dims: Any, keepdim: bool, out: torch.Tensor) -> _Value:
    x = _tensor(x)
    rank = len(x.shape)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(rank))
    elif isinstance(dims, int):
        dims = [dims]
    dims = sorted({_dim(d, rank) for d in dims})
    if rank == 0:
        return lw.cast(x, out.dtype)
    x = lw.cast(x, out.dtype)
    return lw.emit(kind, [x], out, dims=dims, keepdim=keepdim)


@_rule(aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default)
def _reduce_dims(lw: _Lower, node: Any, out: torch.Tensor, x: Any, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> _Value:
    kind = {aten.sum: "sum", aten.mean: "mean", aten.amax: "amax", aten.amin: "amin"}[node.target.overloadpacket]
    if kind in ("amax", "amin") and _tensor(x).dtype == torch.bool:
        raise _Unsupported("bool amax")
    return _reduce(lw, kind, x, dims, keepdim, out)


@_rule(aten.sum.default, aten.mean.default)
def _reduce_all(lw: _Lower, node: Any, out: torch.Tensor, x: Any, *, dtype: Any = None) -> _Value:
    kind = "sum" if node.target == aten.sum.default else "mean"
    return _reduce(lw, kind, x, None, False, out)


@_rule(aten.prod.dim_int)
def _prod(lw: _Lower, node: Any, out: torch.Tensor, x: Any, dim: int, keepdim: bool = False, *, dtype: Any = None) -> _Value:
    return _reduce(lw, "prod", x, [dim], keepdim, out)


@_rule(aten.any.dim, aten.any.dims, aten.any.default, aten.all.dim, aten.all.default)
def _any_all(lw: _Lower, node: Any, out: torch.Tensor, x: Any, dims: Any = None, keepdim: bool = False) -> _Value:
    kind = "amax" if node.target.overloadpacket == aten.any else "amin"
    x = _tensor(x)
    nonzero = x if x.dtype == torch.bool else lw.emit("ne", [x, 0], _M(list(x.shape), torch.bool))
    ints = lw.cast(nonzero, torch.int32)
    r = _reduce(lw, kind, ints, dims, keepdim, _M(list(out.shape), torch.int32))
    return lw.cast(r, torch.bool)


@_rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
       aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.view_copy.default, aten.flatten.using_ints)
def _reshape(lw: _Lower, node: Any, out: torch.Tensor, x: Any, *rest: Any) -> _Value:
    return _reshaped(lw, _tensor(x), list(out.shape))


def _reshaped(lw: _Lower, x: _Value, shape: List[int]) -> _Value:
    """`x` as `shape`: a reshape of a reshape reads the first one's source
    (so that `view(view(y, [B*T, N]), [B, T, N])` is `y` itself, and the
    view in between goes where nothing reads it)."""
    if x.reshape_of is not None:
        x = x.reshape_of
    if shape == x.shape:
        return x
    r = lw.emit("reshape", [x], _M(shape, x.dtype), shape=shape)
    r.reshape_of = x
    return r


@_rule(aten.expand.default, aten.expand_copy.default)
def _expand(lw: _Lower, node: Any, out: torch.Tensor, x: Any, size: Any, *, implicit: bool = False) -> _Value:
    x = _tensor(x)
    if list(out.shape) == x.shape:
        return x
    return lw.emit("broadcast", [x], out, shape=list(out.shape))


def _transpose2(lw: _Lower, x: _Value, out: Any, perm: List[int]) -> _Value:
    t = lw.emit("transpose", [x], out, perm=perm)
    if perm == [1, 0]:
        t.transpose_of = x
    return t


@_rule(aten.permute.default, aten.permute_copy.default)
def _permute(lw: _Lower, node: Any, out: torch.Tensor, x: Any, dims: Sequence[int]) -> _Value:
    x = _tensor(x)
    perm = [_dim(d, len(x.shape)) for d in dims]
    if perm == sorted(perm):
        return x
    return _transpose2(lw, x, out, perm)


@_rule(aten.t.default)
def _t(lw: _Lower, node: Any, out: torch.Tensor, x: Any) -> _Value:
    x = _tensor(x)
    if len(x.shape) < 2:
        return x
    return _transpose2(lw, x, out, [1, 0])


@_rule(aten.transpose.int)
def _transpose(lw: _Lower, node: Any, out: torch.Tensor, x: Any, d0: int, d1: int) -> _Value:
    x = _tensor(x)
    rank = len(x.shape)
    perm = list(range(rank))
    a, b = _dim(d0, rank), _dim(d1, rank)
    if a == b:
        return x
    perm[a], perm[b] = perm[b], perm[a]
    return lw.emit("transpose", [x], out, perm=perm)


def _slice(lw: _Lower, x: _Value, dim: int, start: int, end: int, step: int, out: torch.Tensor) -> _Value:
    shape = x.shape
    dim = _dim(dim, len(shape))
    s, e, st = slice(start, end, step).indices(shape[dim])
    if st < 1:
        raise _Unsupported("a negative step")
    starts = [0] * len(shape)
    ends = list(shape)
    steps = [1] * len(shape)
    starts[dim], ends[dim], steps[dim] = s, max(e, s), st
    if s == 0 and e >= shape[dim] and st == 1:
        return x
    return lw.emit("slice", [x], out, start=starts, end=ends, step=steps)


@_rule(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice_rule(lw: _Lower, node: Any, out: torch.Tensor, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> _Value:
    x = _tensor(x)
    sliced = _M(list(out.shape), out.dtype)
    return _slice(lw, x, dim, start, end, step, sliced)


@_rule(aten.select.int, aten.select_copy.int)
def _select(lw: _Lower, node: Any, out: torch.Tensor, x: Any, dim: int, index: int) -> _Value:
    x = _tensor(x)
    dim = _dim(dim, len(x.shape))
    index = index + x.shape[dim] if index < 0 else index
    kept = list(x.shape)
    kept[dim] = 1
    s = _slice(lw, x, dim, index, index + 1, 1, _M(list(kept), x.dtype))
    return lw.emit("reshape", [s], out, shape=list(out.shape))


@_rule(aten.split.Tensor, aten.split_with_sizes.default)
def _split(lw: _Lower, node: Any, out: Any, x: Any, sizes: Any, dim: int = 0) -> List[_Value]:
    x = _tensor(x)
    dim = _dim(dim, len(x.shape))
    parts, at = [], 0
    for o in out:
        n = o.shape[dim]
        parts.append(_slice(lw, x, dim, at, at + n, 1, o))
        at += n
    return parts


@_rule(aten.cat.default)
def _cat(lw: _Lower, node: Any, out: torch.Tensor, tensors: Sequence[Any], dim: int = 0) -> _Value:
    parts = [lw.cast(_tensor(t), out.dtype) for t in tensors if not (len(t.shape) == 1 and t.shape[0] == 0)]
    if len(parts) == 1:
        return parts[0]
    return lw.emit("cat", parts, out, dim=_dim(dim, len(out.shape)))


@_rule(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
       aten.contiguous.default)
def _identity(lw: _Lower, node: Any, out: torch.Tensor, x: Any, *rest: Any, **kw: Any) -> _Value:
    return _tensor(x)


@_rule(aten._to_copy.default)
def _to_copy(lw: _Lower, node: Any, out: torch.Tensor, x: Any, **kw: Any) -> _Value:
    if out.device.type not in ("cpu", "meta") or kw.get("device") not in (None, torch.device("cpu")):
        raise _Unsupported("a copy to another device")
    return lw.cast(_tensor(x), out.dtype)


@_rule(prims.convert_element_type.default)
def _convert(lw: _Lower, node: Any, out: torch.Tensor, x: Any, dtype: torch.dtype) -> _Value:
    return lw.cast(_tensor(x), dtype)


def _full(lw: _Lower, out: torch.Tensor, value: Any) -> _Value:
    dt = out.dtype
    if isinstance(value, _Value):
        raise _Unsupported("a tensor fill value")
    value = bool(value) if dt == torch.bool else (float(value) if dt.is_floating_point else int(value))
    return lw.emit("full", [], out, shape=list(out.shape), value=value, dtype=dt)


@_rule(aten.full.default, aten.full_like.default, aten.new_full.default, aten.fill.Scalar)
def _full_rule(lw: _Lower, node: Any, out: torch.Tensor, a: Any, value: Any, *rest: Any, **kw: Any) -> _Value:
    return _full(lw, out, value)


@_rule(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty.memory_format,
       aten.empty_like.default, aten.new_empty.default, aten.empty_strided.default)
def _zeros(lw: _Lower, node: Any, out: torch.Tensor, *rest: Any, **kw: Any) -> _Value:
    return _full(lw, out, 0)


@_rule(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(lw: _Lower, node: Any, out: torch.Tensor, *rest: Any, **kw: Any) -> _Value:
    return _full(lw, out, 1)


@_rule(aten.scalar_tensor.default)
def _scalar_tensor(lw: _Lower, node: Any, out: torch.Tensor, value: Any, **kw: Any) -> _Value:
    return _full(lw, out, value)


@_rule(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(lw: _Lower, node: Any, out: torch.Tensor, *args: Any, **kw: Any) -> _Value:
    nums = [a for a in args if isinstance(a, (int, float))]
    if node.target == aten.arange.default:
        start, step = 0, 1
    else:
        start = nums[0]
        step = nums[2] if len(nums) > 2 else 1
    if not all(isinstance(v, int) for v in (start, step)):
        raise _Unsupported("a fractional arange")
    r = lw.emit("iota", [], _M(list(out.shape), torch.int64),
                shape=list(out.shape), dim=0, start=start, step=step, dtype=torch.int64)
    return lw.cast(r, out.dtype)


@_rule(aten.copy.default)
def _copy(lw: _Lower, node: Any, out: torch.Tensor, dst: Any, src: Any, non_blocking: bool = False) -> _Value:
    src = lw.cast(_tensor(src), out.dtype)
    if src.shape == list(out.shape):
        return src
    return lw.emit("broadcast", [src], out, shape=list(out.shape))


def _product(lw: _Lower, a: _Value, b: _Value, out: Any, bias: Optional[_Value] = None) -> _Value:
    """`a @ b` (+ `bias`): `linear(a, w, bias)` where `b` is the transpose
    of a matrix `w` (PyTorch's `nn.Linear`), which the GEMM executor takes
    whole with the weight in its own layout."""
    w = b.transpose_of
    if w is not None and len(a.shape) == 2 and a.dtype == w.dtype:
        operands = [w] + ([bias] if bias is not None else [])
        x = a.reshape_of
        if x is not None and len(x.shape) > 2 and x.shape[-1] == a.shape[-1]:
            # `x` flattened to rows, as `nn.Linear` does: the product of
            # `x` itself, flattened after (a view a later reshape undoes).
            y = lw.emit("linear", [x] + operands, _M(x.shape[:-1] + [w.shape[0]], out.dtype))
            return _reshaped(lw, y, list(out.shape))
        return lw.emit("linear", [a] + operands, out)
    prod = lw.emit("matmul", [a, b], out)
    return prod if bias is None else lw.emit("add", [prod, bias], out)


@_rule(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(lw: _Lower, node: Any, out: torch.Tensor, a: Any, b: Any) -> _Value:
    return _product(lw, _tensor(a), _tensor(b), out)


@_rule(aten.addmm.default)
def _addmm(lw: _Lower, node: Any, out: torch.Tensor, bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> _Value:
    bias = _tensor(bias)
    if alpha == 1 and beta == 1 and bias.shape == [out.shape[-1]] and bias.dtype == out.dtype:
        return _product(lw, _tensor(a), _tensor(b), out, bias)
    prod = _product(lw, _tensor(a), _tensor(b), out)
    if alpha != 1:
        prod = lw.emit("mul", [prod, float(alpha)], out)
    if beta == 0:
        return prod
    if beta != 1:
        bias = lw.emit("mul", [_tensor(bias), float(beta)], _tensor(bias))
    return lw.emit("add", [prod, _tensor(bias)], out)


@_rule(aten.native_layer_norm.default)
def _layer_norm(lw: _Lower, node: Any, out: Tuple, x: Any, shape: Sequence[int], weight: Any, bias: Any, eps: float) -> Tuple:
    x = _tensor(x)
    if len(shape) != 1 or not x.dtype.is_floating_point:
        raise _Unsupported("normalised over several dims")
    y_meta, mean_meta, rstd_meta = out
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    if used <= {0}:
        operands = [x] + ([_tensor(weight)] if weight is not None else [])
        if bias is not None:
            if weight is None:
                raise _Unsupported("a bias without a weight")
            operands.append(_tensor(bias))
        return (lw.emit("layer_norm", operands, y_meta, eps=float(eps)), None, None)
    # Training: the mean and 1/std are outputs too.
    keep = _M(list(mean_meta.shape), x.dtype)
    full = _M(list(x.shape), x.dtype)
    mean = lw.emit("mean", [x], keep, dims=[len(x.shape) - 1], keepdim=True)
    xc = lw.emit("sub", [x, mean], full)
    sq = lw.emit("mul", [xc, xc], full)
    var = lw.emit("mean", [sq], keep, dims=[len(x.shape) - 1], keepdim=True)
    ve = lw.emit("add", [var, float(eps)], keep)
    rstd = lw.emit("rsqrt", [ve], keep)
    y = lw.emit("mul", [xc, rstd], full)
    if weight is not None:
        y = lw.emit("mul", [y, _tensor(weight)], full)
    if bias is not None:
        y = lw.emit("add", [y, _tensor(bias)], full)
    return (y, mean, rstd)


@_rule(aten.embedding.default)
def _embedding(lw: _Lower, node: Any, out: torch.Tensor, weight: Any, indices: Any, *rest: Any) -> _Value:
    return lw.emit("embedding", [_tensor(indices), _tensor(weight)], out)


@_rule(aten.index_select.default)
def _index_select(lw: _Lower, node: Any, out: torch.Tensor, x: Any, dim: int, index: Any) -> _Value:
    return lw.emit("index_select", [_tensor(x), _tensor(index)], out, dim=dim)


@_rule(aten.gather.default)
def _gather(lw: _Lower, node: Any, out: torch.Tensor, x: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> _Value:
    return lw.emit("gather", [_tensor(x), _tensor(index)], out, dim=dim)


@_rule(aten.cumsum.default)
def _cumsum(lw: _Lower, node: Any, out: torch.Tensor, x: Any, dim: int, *, dtype: Any = None) -> _Value:
    return lw.emit("cumsum", [lw.cast(_tensor(x), out.dtype)], out, dim=dim)


@_rule(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_flash(lw: _Lower, node: Any, out: Tuple, q: Any, k: Any, v: Any, dropout_p: float = 0.0,
                is_causal: bool = False, *, attn_mask: Any = None, scale: Any = None) -> Tuple:
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    if dropout_p != 0.0 or attn_mask is not None or not used <= {0}:
        raise _Unsupported("dropout, a mask, or the log-sum-exp")
    return (lw.emit("sdpa", [_tensor(q), _tensor(k), _tensor(v)], out[0], causal=bool(is_causal), scale=scale), None)


@_rule(aten.scaled_dot_product_attention.default)
def _sdpa(lw: _Lower, node: Any, out: torch.Tensor, q: Any, k: Any, v: Any, attn_mask: Any = None,
          dropout_p: float = 0.0, is_causal: bool = False, *, scale: Any = None, enable_gqa: bool = False) -> _Value:
    if dropout_p != 0.0 or attn_mask is not None or enable_gqa:
        raise _Unsupported("dropout, a mask or GQA")
    return lw.emit("sdpa", [_tensor(q), _tensor(k), _tensor(v)], out, causal=bool(is_causal), scale=scale)


@_rule(aten.threshold_backward.default)
def _threshold_backward(lw: _Lower, node: Any, out: torch.Tensor, grad: Any, x: Any, threshold: Any) -> _Value:
    x = _tensor(x)
    le = lw.emit("le", [x, threshold], _M(list(x.shape), torch.bool))
    return lw.emit("where", [le, 0.0 if out.dtype.is_floating_point else 0, _tensor(grad)], out)


@_rule(aten.slice_scatter.default)
def _slice_scatter(lw: _Lower, node: Any, out: torch.Tensor, x: Any, src: Any, dim: int = 0, start: Any = None,
                   end: Any = None, step: int = 1) -> _Value:
    """`x` with `src` in the slice: the parts of `x` around it, catenated."""
    x, src = _tensor(x), lw.cast(_tensor(src), out.dtype)
    dim = _dim(dim, len(x.shape))
    s, e, st = slice(start, end, step).indices(x.shape[dim])
    if st != 1:
        raise _Unsupported("a step")
    e = max(e, s)
    parts = []
    for lo, hi in ((0, s), (e, x.shape[dim])):
        if hi > lo:
            shape = list(x.shape)
            shape[dim] = hi - lo
            parts.append(_slice(lw, x, dim, lo, hi, 1, _M(list(shape), x.dtype)))
    if s > 0:
        parts.insert(1, src)
    else:
        parts.insert(0, src)
    return parts[0] if len(parts) == 1 else lw.emit("cat", parts, out, dim=dim)


def _scatter(lw: _Lower, x: _Value, index: _Value, updates: Any, dim: int, reduce: str, out: torch.Tensor) -> _Value:
    return lw.emit("scatter", [lw.cast(x, out.dtype), index, lw.cast(updates, out.dtype)], out, dim=dim, reduce=reduce)


@_rule(aten.scatter.src, aten.scatter_add.default)
def _scatter_rule(lw: _Lower, node: Any, out: torch.Tensor, x: Any, dim: int, index: Any, src: Any) -> _Value:
    index, src = _tensor(index), _tensor(src)
    if index.shape != src.shape:
        raise _Unsupported("an index of another shape than the updates")
    reduce = "add" if node.target == aten.scatter_add.default else "none"
    return _scatter(lw, _tensor(x), index, src, _dim(dim, len(out.shape)), reduce, out)


@_rule(aten.index_put.default)
def _index_put(lw: _Lower, node: Any, out: torch.Tensor, x: Any, indices: Sequence[Any], values: Any,
               accumulate: bool = False) -> _Value:
    """`x[idx] = values` (or `+=`) with one integer index along dim 0, as
    an embedding's gradient is accumulated: a scatter along dim 0."""
    x, values = _tensor(x), _tensor(values)
    if len(indices) != 1 or not isinstance(indices[0], _Value) or indices[0].dtype in (torch.bool,):
        raise _Unsupported("indices other than one integer tensor")
    idx = indices[0]
    rows = 1
    for d in idx.shape:
        rows *= d
    row_shape = x.shape[1:]
    if values.shape != idx.shape + row_shape:
        raise _Unsupported("values broadcast over the index")
    flat = [rows] + row_shape
    idx_flat = lw.emit("reshape", [idx], _M([rows], idx.dtype), shape=[rows])
    idx_col = lw.emit("reshape", [idx_flat], _M(list([rows] + [1] * len(row_shape)), idx.dtype),
                      shape=[rows] + [1] * len(row_shape))
    idx_full = lw.emit("broadcast", [idx_col], _M(list(flat), idx.dtype), shape=flat)
    vals = values if values.shape == flat else lw.emit("reshape", [values], _M(list(flat), values.dtype), shape=flat)
    # A negative index counts from the end, as PyTorch's does.
    if idx.dtype != torch.bool:
        neg = lw.emit("lt", [idx_full, 0], _M(list(flat), torch.bool))
        wrapped = lw.emit("add", [idx_full, x.shape[0]], idx_full)
        idx_full = lw.emit("where", [neg, wrapped, idx_full], idx_full)
    return _scatter(lw, x, idx_full, vals, 0, "add" if accumulate else "none", out)


@_rule(aten.index.Tensor)
def _index(lw: _Lower, node: Any, out: torch.Tensor, x: Any, indices: Sequence[Any]) -> _Value:
    """`x[idx]` with one integer index tensor on the first dim."""
    x = _tensor(x)
    if len(indices) != 1 or not isinstance(indices[0], _Value) or indices[0].dtype not in (torch.int64, torch.int32):
        raise _Unsupported("indices other than one integer tensor on the first dim")
    idx = indices[0]
    n = 1
    for d in idx.shape:
        n *= d
    flat = idx if len(idx.shape) == 1 else lw.emit("reshape", [idx], _M([n], idx.dtype), shape=[n])
    # A negative index counts from the end, as PyTorch's does.
    neg = lw.emit("lt", [flat, 0], _M([n], torch.bool))
    wrapped = lw.emit("add", [flat, x.shape[0]], flat)
    flat = lw.emit("where", [neg, wrapped, flat], flat)
    picked_shape = [n] + x.shape[1:]
    picked = lw.emit("index_select", [x, flat], _M(list(picked_shape), x.dtype), dim=0)
    if picked_shape == list(out.shape):
        return picked
    return lw.emit("reshape", [picked], out, shape=list(out.shape))


def _spatial(v: Any, rank: int) -> List[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * rank if len(v) == 1 else v


@_rule(aten.convolution.default)
def _convolution(lw: _Lower, node: Any, out: torch.Tensor, x: Any, w: Any, bias: Any, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
                 groups: int) -> _Value:
    x, w = _tensor(x), _tensor(w)
    rank = len(x.shape) - 2
    if rank < 1 or isinstance(padding, str):
        raise _Unsupported("padding by name, or no spatial dims")
    pad = _spatial(padding, rank)
    operands = [x, w] + ([_tensor(bias)] if bias is not None else [])
    attrs = dict(stride=_spatial(stride, rank), dilation=_spatial(dilation, rank), pad=pad + pad, groups=groups)
    if transposed:
        return lw.emit("conv_transpose", operands, out, output_padding=_spatial(output_padding, rank), **attrs)
    return lw.emit("conv", operands, out, **attrs)


def _per_channel(lw: _Lower, v: _Value, rank: int) -> _Value:
    """A `[C]` vector as `[C, 1, ...]`, to broadcast over `[N, C, S...]`."""
    shape = v.shape + [1] * (rank - 2)
    return lw.emit("reshape", [v], _M(shape, v.dtype), shape=shape)


def _normalise(lw: _Lower, x: _Value, mean: _Value, var: _Value, weight: Any, bias: Any, eps: float,
               out: Any) -> Tuple[_Value, _Value]:
    """`(x - mean) / sqrt(var + eps) * weight + bias` per channel, and
    the `1/sqrt(var + eps)` it used."""
    rank = len(x.shape)
    c = [x.shape[1]]
    rstd = lw.emit("rsqrt", [lw.emit("add", [var, float(eps)], _M(c, x.dtype))], _M(c, x.dtype))
    y = lw.emit("sub", [x, _per_channel(lw, mean, rank)], _M(x.shape, x.dtype))
    y = lw.emit("mul", [y, _per_channel(lw, rstd, rank)], _M(x.shape, x.dtype))
    if weight is not None:
        y = lw.emit("mul", [y, _per_channel(lw, _tensor(weight), rank)], _M(x.shape, x.dtype))
    if bias is not None:
        y = lw.emit("add", [y, _per_channel(lw, _tensor(bias), rank)], out)
    return y, rstd


@_rule(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_eval(lw: _Lower, node: Any, out: Tuple, x: Any, weight: Any, bias: Any, running_mean: Any,
                     running_var: Any, momentum: float, eps: float) -> Tuple:
    x = _tensor(x)
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    if not used <= {0} or not x.dtype.is_floating_point:
        raise _Unsupported("the saved statistics")
    y, _ = _normalise(lw, x, _tensor(running_mean), _tensor(running_var), weight, bias, eps, out[0])
    return (y, None, None)


@_rule(aten._native_batch_norm_legit_functional.default)
def _batch_norm_train(lw: _Lower, node: Any, out: Tuple, x: Any, weight: Any, bias: Any, running_mean: Any,
                      running_var: Any, training: bool, momentum: float, eps: float) -> Tuple:
    """Batch statistics: the output, the mean and 1/std saved for the
    backward, and the running mean and (unbiased) variance updated."""
    x = _tensor(x)
    if not training or not x.dtype.is_floating_point:
        raise _Unsupported("eval mode through the training op")
    rank = len(x.shape)
    c = [x.shape[1]]
    dims = [0] + list(range(2, rank))
    n = x.shape[0]
    for d in x.shape[2:]:
        n *= d
    mean = lw.emit("mean", [x], _M(c, x.dtype), dims=dims, keepdim=False)
    xc = lw.emit("sub", [x, _per_channel(lw, mean, rank)], _M(x.shape, x.dtype))
    sq = lw.emit("mul", [xc, xc], _M(x.shape, x.dtype))
    var = lw.emit("mean", [sq], _M(c, x.dtype), dims=dims, keepdim=False)
    y, rstd = _normalise(lw, x, mean, var, weight, bias, eps, out[0])
    running = []
    for old, new in ((running_mean, mean), (running_var, var)):
        old = _tensor(old)
        if new is var and n > 1:
            new = lw.emit("mul", [var, n / (n - 1)], _M(c, x.dtype))
        kept = lw.emit("mul", [old, 1.0 - momentum], _M(c, old.dtype))
        moved = lw.emit("mul", [lw.cast(new, old.dtype), float(momentum)], _M(c, old.dtype))
        running.append(lw.emit("add", [kept, moved], _M(c, old.dtype)))
    return (y, mean, rstd, running[0], running[1])


@_rule(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def _max_pool(lw: _Lower, node: Any, out: Tuple, x: Any, kernel: Sequence[int], stride: Any = (), padding: Any = 0,
              dilation: Any = 1, ceil_mode: bool = False) -> Tuple:
    x = _tensor(x)
    rank = len(x.shape) - 2
    kernel = _spatial(kernel, rank)
    stride = _spatial(stride, rank) if stride else kernel
    pad = _spatial(padding, rank)
    attrs = dict(kernel=kernel, stride=stride, dilation=_spatial(dilation, rank), pad=pad + pad, ceil_mode=ceil_mode)
    y = lw.emit("max_pool", [x], out[0], **attrs)
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    if 1 not in used:
        return (y, None)
    # PyTorch's indices count within each [n, c] plane; argmax_pool's
    # within the whole input: take off each plane's start.
    flat = lw.emit("argmax_pool", [x], _M(list(out[1].shape), torch.int64), **attrs)
    plane = 1
    for d in x.shape[2:]:
        plane *= d
    nc = list(out[1].shape[:2])
    starts = lw.emit("iota", [], _M(nc, torch.int64), shape=nc, dim=0, start=0, step=x.shape[1] * plane,
                     dtype=torch.int64)
    channel = lw.emit("iota", [], _M(nc, torch.int64), shape=nc, dim=1, start=0, step=plane, dtype=torch.int64)
    starts = lw.emit("add", [starts, channel], _M(nc, torch.int64))
    shape = nc + [1] * rank
    starts = lw.emit("reshape", [starts], _M(shape, torch.int64), shape=shape)
    return (y, lw.emit("sub", [flat, starts], out[1]))


@_rule(aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(lw: _Lower, node: Any, out: torch.Tensor, x: Any, kernel: Sequence[int], stride: Any = (),
              padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
              divisor_override: Any = None) -> _Value:
    x = _tensor(x)
    if divisor_override is not None:
        raise _Unsupported("divisor_override")
    rank = len(x.shape) - 2
    kernel = _spatial(kernel, rank)
    stride = _spatial(stride, rank) if stride else kernel
    pad = _spatial(padding, rank)
    return lw.emit("avg_pool", [x], out, kernel=kernel, stride=stride, pad=pad + pad, ceil_mode=ceil_mode,
                   count_include_pad=count_include_pad)


@_rule(aten.pow.Tensor_Scalar)
def _pow_scalar(lw: _Lower, node: Any, out: torch.Tensor, x: Any, e: Any) -> _Value:
    """`x ** e`: small whole and half exponents as products, square roots
    and reciprocals (as PyTorch computes them), others through `pow`."""
    x = _tensor(x)
    if not out.dtype.is_floating_point or isinstance(e, bool) or not isinstance(e, (int, float)):
        raise _Unsupported("an integer power")
    x = lw.cast(x, out.dtype)
    if e == 0:
        return _full(lw, out, 1.0)
    if e == 1:
        return x
    if e == 0.5:
        return lw.emit("sqrt", [x], out)
    if e == -0.5:
        return lw.emit("rsqrt", [x], out)
    if e == -1:
        return lw.emit("reciprocal", [x], out)
    if e in (2, 3, 4, -2):
        square = lw.emit("mul", [x, x], out)
        if e == 2:
            return square
        if e == -2:
            return lw.emit("reciprocal", [square], out)
        return lw.emit("mul", [square, x if e == 3 else square], out)
    return _binary(lw, "pow", x, float(e), out)
