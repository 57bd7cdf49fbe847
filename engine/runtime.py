"""``run_exported``: run any exported artifact on its runtime; outputs keyed by ``get_leaf_tensors`` names.

Each runtime registers a runner: a predicate telling whether it handles an artifact, and a function
``run(artifact, inputs) -> dict[str, Tensor]``. Backend runners live beside their exporter and are
imported lazily, only when an artifact of theirs shows up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from engine.errors import InputError
from engine.prepare import split_inputs
from engine.pytree import get_leaf_tensors, register_pytree_nodes

Runner = Callable[[Any, dict[str, Any]], dict[str, torch.Tensor]]

#: (module that registers the runner, predicate on the artifact's type/path without importing the backend)
_LAZY_RUNNERS: list[tuple[str, Callable[[Any], bool]]] = [
    ("engine.runtime_onnx", lambda a: type(a).__name__ == "ONNXProgram" or str(a).endswith(".onnx")),
    ("engine.runtime_executorch", lambda a: type(a).__name__ == "ExecutorchProgramManager" or str(a).endswith(".pte")),
]
_RUNNERS: list[tuple[Callable[[Any], bool], Runner]] = []


def register_runner(handles: Callable[[Any], bool]):
    def decorator(fn: Runner) -> Runner:
        _RUNNERS.append((handles, fn))
        return fn

    return decorator


@register_runner(lambda a: isinstance(a, torch.export.ExportedProgram))
def _run_exported_program(program: torch.export.ExportedProgram, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    register_pytree_nodes(inputs)
    with torch.no_grad():
        return get_leaf_tensors(program.module()(**inputs))


def run_exported(artifact: Any, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Run ``artifact`` (an ``ExportedProgram``, ``ONNXProgram``, ``.onnx`` path, ExecuTorch program or
    ``.pte`` path) on ``inputs``, the same kind of dict given to ``export``; labels and output flags in it
    are ignored as they were at export. Returns ``{leaf name: tensor}`` like ``get_leaf_tensors(eager_outputs)``."""
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a mapping of input names to values, got {type(inputs).__name__}")
    traced, _ = split_inputs(inputs)
    for module, handles in _LAZY_RUNNERS:
        if handles(artifact):
            importlib.import_module(module)
    for handles, run in _RUNNERS:
        if handles(artifact):
            return run(artifact, traced)
    raise InputError(
        f"no runtime for {type(artifact).__name__}; run_exported takes an ExportedProgram, an ONNXProgram or "
        f".onnx path, or an ExecutorchProgramManager or .pte path"
    )
