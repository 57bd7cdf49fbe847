"""A runtime's failure in words a user can act on: ExecuTorch's error codes by name, onnxruntime's failing node, and
an empty input dim named as the cause.

The runners check what they can before a runtime sees the inputs (:mod:`engine.input_checks`,
:mod:`engine.index_inputs`); what a runtime still refuses comes back through here, its own text kept after ours.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from engine.errors import ExportStageError, InputError, first_line

#: ExecuTorch's ``Error`` codes (runtime/core/error.h): name, and what usually causes it from the Python runner
EXECUTORCH_ERRORS = {
    0x01: ("Internal", "an internal error of the runtime or a kernel"),
    0x02: ("InvalidState", "the method is not in a state to run (a failed earlier load or execute)"),
    0x03: ("EndOfMethod", "the method has no more instructions to run"),
    0x04: ("AlreadyLoaded", "the resource was loaded already"),
    0x10: ("NotSupported", "an operation the runtime or a delegate does not support in this context"),
    0x11: ("NotImplemented", "an operation not implemented yet in this runtime"),
    0x12: ("InvalidArgument", "a kernel refused its arguments: usually an input size the memory plan or a kernel "
                              "was not built for, or a value out of range (an index)"),
    0x13: ("InvalidType", "a value of the wrong type for the operation (an input's dtype)"),
    0x14: ("OperatorMissing", "the program calls an operator this runtime has no kernel for"),
    0x15: ("RegistrationExceedingMaxKernels", "more kernels registered than the runtime allows"),
    0x16: ("RegistrationAlreadyRegistered", "a kernel registered twice"),
    0x20: ("NotFound", "a method, input or resource the program names was not found"),
    0x21: ("MemoryAllocationFailed", "the runtime could not allocate memory (a memory plan sized for large bounds)"),
    0x22: ("AccessFailed", "a file or buffer could not be read"),
    0x23: ("InvalidProgram", "the program's contents are invalid (a corrupt or incompatible .pte)"),
    0x24: ("InvalidExternalData", "the program's external data is invalid"),
    0x25: ("OutOfResources", "not enough resources to run the operation"),
    0x30: ("DelegateInvalidCompatibility", "a delegate was built for another version of its backend"),
    0x31: ("DelegateMemoryAllocationFailed", "a delegate could not allocate memory"),
    0x32: ("DelegateInvalidHandle", "a delegate's handle is invalid"),
}

_CODE = re.compile(r"error (0x[0-9a-fA-F]+)")
_ORT_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)'")


def executorch_message(error: BaseException) -> str:
    """``InvalidArgument (0x12): <what usually causes it>; <the runtime's text>`` when the text holds a code."""
    text = first_line(error)
    found = _CODE.search(text)
    if found is None:
        return text
    code = int(found.group(1), 16)
    name, cause = EXECUTORCH_ERRORS.get(code, (f"error {found.group(1)}", "an error code this list does not know"))
    return f"{name} ({found.group(1)}): {cause}; {text}"


def onnxruntime_message(error: BaseException, inputs: Mapping[str, torch.Tensor]) -> str:
    """``node <name> (<op>) failed on inputs <shapes>: <the runtime's text>``."""
    text = " ".join(str(error).split())
    found = _ORT_NODE.search(text)
    where = f"node {found.group(2) or '(unnamed)'} ({found.group(1)})" if found else "onnxruntime"
    return f"{where} failed on inputs {shapes(inputs)}: {text}"


def shapes(inputs: Mapping[str, torch.Tensor]) -> str:
    return ", ".join(f"{name} {tuple(t.shape)}" for name, t in inputs.items() if isinstance(t, torch.Tensor)) or "(none)"


def run_failure(label: str, inputs: Mapping[str, torch.Tensor], message: str,
                cause: BaseException | None = None) -> InputError | ExportStageError:
    """What to raise when a runtime failed with ``message`` on ``inputs``: an empty input named as the cause
    (:func:`empty_input_error`), else the run stage's failure (``cause``, or ``message`` as a RuntimeError)."""
    return empty_input_error(label, inputs, message) or ExportStageError("run", label, cause or RuntimeError(message))


def empty_input_error(label: str, inputs: Mapping[str, torch.Tensor], raw: str) -> InputError | None:
    """The :class:`InputError` to raise when a runtime failed on inputs one of which has an empty dim (a sequence
    of 0 tokens): the cause, named, before the runtime's own text; None when no input is empty."""
    for name, tensor in inputs.items():
        if isinstance(tensor, torch.Tensor) and 0 in tensor.shape:
            d = tuple(tensor.shape).index(0)
            return InputError(f"{label}: input {name} dim {d} is 0 (shape {tuple(tensor.shape)}): the program fails on "
                              f"an empty input; the runtime said: {raw}", input=name, problem="empty")
    return None
