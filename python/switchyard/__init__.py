"""switchyard: runs ONNX models (and switchyard traces) through switchyard's
executors, with ONNX Runtime's call shapes.

    import switchyard
    session = switchyard.InferenceSession("model.onnx")
    outputs = session.run(None, {"x": x})

Feeds are numpy arrays (read in place when C-contiguous, aligned and in
native byte order), objects with ``__dlpack__`` in host memory, or anything
``numpy.asarray`` takes. Outputs are numpy arrays over the memory the run
wrote, without a copy; they give ``__dlpack__`` as numpy does. Runs release
the GIL, and one session may be run from several threads at once.
"""

from ._switchyard import (
    InferenceSession,
    InvalidArgument,
    NodeArg,
    OutputBuffer,
    Plan,
    SwitchyardError,
    get_available_providers,
    plan,
)

__all__ = [
    "InferenceSession",
    "InvalidArgument",
    "NodeArg",
    "OutputBuffer",
    "Plan",
    "SwitchyardError",
    "get_available_providers",
    "plan",
]
