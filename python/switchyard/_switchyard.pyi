"""Type stubs for switchyard's extension module."""

import os
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

_Path = Union[str, "os.PathLike[str]"]

class SwitchyardError(Exception):
    """An error from switchyard: reading, planning, compiling or running a model."""

class InvalidArgument(SwitchyardError):
    """The inputs or outputs a run named, or its tensors, do not fit the model."""

class NodeArg:
    """A graph input or output as the model declares it."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str:
        """ONNX Runtime's type name, such as ``tensor(float)``."""
    @property
    def shape(self) -> list[Union[int, str, None]]:
        """Ints for fixed dims, strings for named ones, None for unnamed ones."""

class Plan:
    """A plan to read."""

    def summary(self) -> str:
        """Each region, its executor, the estimated time and the planned peak memory."""
    def explain(self) -> str:
        """The summary, and every op's candidate executors, costs and the choice."""

class OutputBuffer:
    """The base object of an output array: holds the memory the run wrote."""

    @property
    def address(self) -> int: ...

class InferenceSession:
    """A model ready to run, planned and compiled once per input-shape signature."""

    def __init__(
        self,
        path_or_bytes: Union[_Path, bytes],
        sess_options: Optional[Any] = None,
        providers: Optional[Sequence[str]] = None,
        provider_options: Optional[Any] = None,
        *,
        executors: Optional[str] = None,
        config: Optional[_Path] = None,
        threads: Optional[int] = None,
        memory_limit: Union[int, str, None] = None,
        autotune: Optional[str] = None,
        plugins: Optional[Sequence[_Path]] = None,
        shapes_kept: int = 16,
        shapes_kept_bytes: Union[int, str, None] = None,
        target: Optional[str] = None,
        device_model: Optional[str] = None,
        reuse_plans: bool = True,
    ) -> None: ...
    @staticmethod
    def from_trace(
        text: str,
        *,
        name: str = "<trace>",
        constants: Optional[Mapping[str, Any]] = None,
        extern_runner: Optional[Callable[[str, list[Any]], Sequence[Any]]] = None,
        extern_executor: str = "torch",
        executors: Optional[str] = None,
        config: Optional[_Path] = None,
        threads: Optional[int] = None,
        memory_limit: Union[int, str, None] = None,
        autotune: Optional[str] = None,
        shapes_kept: int = 16,
        reuse_plans: bool = True,
    ) -> "InferenceSession":
        """A session for a trace given as text; its `extern` ops run by
        calling `extern_runner(fn, operands)`; `constants` binds inputs to
        tensors every run reads unchanged."""
    def run(
        self,
        output_names: Optional[Sequence[str]],
        input_feed: Mapping[str, Any],
        run_options: Optional[Any] = None,
    ) -> list[np.ndarray]: ...
    def run_dlpack(self, inputs: Sequence[Any]) -> list[Any]:
        """Runs on one input per `get_inputs()` entry (DLPack capsules, or
        anything `run` takes); gives the outputs as DLPack capsules."""
    def get_inputs(self) -> list[NodeArg]: ...
    def get_outputs(self) -> list[NodeArg]: ...
    def get_providers(self) -> list[str]:
        """The executors this session plans onto, in order of preference."""
    def stats(self) -> dict[str, Union[int, float]]:
        """runs, compiles, reused and compile_seconds so far."""
    def plan(self, input_shapes: Optional[Mapping[str, Sequence[int]]] = None) -> Plan: ...
    def _time_runs(self, input_feed: Mapping[str, Any], n: int) -> float:
        """Seconds n runs take inside Rust (the overhead benchmark's baseline)."""

def plan(
    path: _Path,
    input_shapes: Optional[Mapping[str, Sequence[int]]] = None,
    *,
    executors: Optional[str] = None,
    config: Optional[_Path] = None,
) -> Plan:
    """The plan switchyard makes for the model at ``path``."""

def get_available_providers() -> list[str]:
    """Every executor linked into switchyard."""

def _input_address(value: Any) -> int: ...
