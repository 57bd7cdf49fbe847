"""``run_exported``: run any exported artifact on its runtime; outputs keyed by ``get_leaf_tensors`` names.

Each runtime registers a runner: a predicate telling whether it handles an artifact, and a function
``run(artifact, inputs) -> dict[str, Tensor]``. Backend runners live beside their exporter and are
imported lazily, only when an artifact of theirs shows up.

Every runner checks the inputs before its runtime sees them, by the same rules and in the same words, and raises
:class:`engine.InputError` naming what is wrong and what is allowed (:mod:`engine.input_checks`): unknown or missing
leaves, a value that is not a tensor (a list or array is converted), a wrong rank or dtype, a dim outside the
exported bounds, an index value out of its table's range (:mod:`engine.index_inputs`). What a runtime still refuses
is an :class:`engine.ExportStageError` in words that name its cause (:mod:`engine.runtime.errors`). For an
``ExportedProgram`` the bounds are its ``range_constraints`` over the symbols of
its input placeholders; whatever torch's own input checks still reject (a guard relating several dims) is converted
to an ``InputError`` too, never left as torch's ``AssertionError("Guard failed: ...")``.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from engine.errors import InputError, first_line
from engine.index_inputs import check_index_values, find_index_inputs
from engine.input_checks import (LeafSpec, as_tensor_inputs, check_leaves, exported_program_constraints,
                                 exported_program_specs, program_label)
from engine.runtime.errors import run_failure, shapes
from engine.prepare import split_inputs
from engine.pytree import fill_leaves, get_leaf_tensors, register_pytree_nodes
from engine.stacked_rows import expand_stacked_rows

Runner = Callable[[Any, dict[str, Any]], dict[str, torch.Tensor]]


def _is_artifact(artifact: Any, type_name: str, suffix: str) -> bool:
    """Whether ``artifact`` is a ``type_name`` object or a path ending in ``suffix``. Only a path is read as a
    string: ``str()`` of a program renders its whole graph (seconds for a large one)."""
    return type(artifact).__name__ == type_name or (
        isinstance(artifact, (str, os.PathLike)) and os.fspath(artifact).endswith(suffix))


def is_onnx_artifact(artifact: Any) -> bool:
    """An ``ONNXProgram`` or a ``.onnx`` path (read without importing the ONNX stack)."""
    return _is_artifact(artifact, "ONNXProgram", ".onnx")


def is_executorch_artifact(artifact: Any) -> bool:
    """An ``ExecutorchProgramManager`` or a ``.pte`` path (read without importing ExecuTorch)."""
    return _is_artifact(artifact, "ExecutorchProgramManager", ".pte")


#: (module that registers the runner, the predicate it registers it with)
_LAZY_RUNNERS: list[tuple[str, Callable[[Any], bool]]] = [
    ("engine.runtime.onnx", is_onnx_artifact),
    ("engine.runtime.executorch", is_executorch_artifact),
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
    label = program_label(program)
    specs = exported_program_specs(program)
    inputs = as_tensor_inputs(label, inputs, specs)
    inputs = check_exported_program_inputs(program, inputs, label, specs)
    check_index_values(label, find_index_inputs(program), get_leaf_tensors(inputs))
    module = program.module()
    with torch.no_grad():
        try:
            outputs = module(**inputs)
        except Exception as e:
            legend = _input_symbols(specs)
            if not _is_input_check_failure(e, legend):
                raise run_failure(label, get_leaf_tensors(inputs), f"{type(e).__name__}: {first_line(e)}", e) from e
            # torch's own input checks (its guards, the input tree, its runtime asserts on input sizes) on what the
            # checks above do not model
            said = _leaf_paths(first_line(e))
            if said.startswith("Trying to flatten user inputs"):  # the same leaf names in other containers
                said = ("the inputs are not nested as the traced ones were (their containers differ: another "
                        "cache class, a dict for a cache or a ModelOutput, ...)")
            used = {name: where for name, where in legend.items() if re.search(rf"\b{name}\b", said)}
            if used:
                said += " (" + ", ".join(f"{name}: {where}" for name, where in used.items()) + ")"
            raise InputError(f"{label}: the exported program rejects the inputs: {said}; given shapes: "
                             f"{shapes(get_leaf_tensors(inputs))}", problem="size") from e
    return get_leaf_tensors(outputs)


def check_exported_program_inputs(program: torch.export.ExportedProgram, inputs: dict[str, Any], label: str,
                                  specs: list[LeafSpec] | None) -> dict[str, Any]:
    """``inputs`` checked against the program's user inputs, by leaf name (:func:`engine.input_checks.check_leaves`:
    names, ranks, dims within ``range_constraints`` and tied by its symbols, its runtime asserts on input sizes,
    dtypes); tensors of another dtype of the same kind come back cast to the program's. :class:`InputError` on any
    mismatch."""
    if specs is None:  # a program whose inputs cannot be named: torch's own checks apply (converted when they fail)
        return inputs
    given = get_leaf_tensors(inputs)
    checked = check_leaves(label, specs, given,
                           constraints=exported_program_constraints(program))
    if all(checked[name] is given[name] for name in checked):
        return inputs
    return fill_leaves(inputs, checked)


#: the functions in which torch checks an ExportedProgram.module()'s inputs (the input tree, ranks, dims)
_TORCH_INPUT_CHECKS = frozenset({"_check_inputs_match", "_check_input_constraints_for_graph", "_check_symint"})


def _input_symbols(specs: list[LeafSpec] | None) -> dict[str, str]:
    """``{symbol name: "leaf dim d"}`` for the dims of the program's inputs that are bare symbols (first occurrence)."""
    legend: dict[str, str] = {}
    for spec in specs or ():
        for d, dim in enumerate(spec.dims):
            if dim.expr is not None and dim.expr.is_symbol:
                legend.setdefault(str(dim.expr), f"{spec.name} dim {d}")
    return legend


def _is_input_check_failure(error: BaseException, input_symbols: Mapping[str, str]) -> bool:
    """Whether ``error`` comes from torch's checks of the inputs of ``ExportedProgram.module()``: its guards
    function (``AssertionError("Guard failed: ...")``), its input-constraint pre-hook, or a runtime assert of the
    graph on input sizes only (``Runtime assertion failed for expression s64 <= s27 + s55``); not from the graph's
    computation."""
    message = str(error)
    if isinstance(error, AssertionError) and message.startswith("Guard failed"):
        return True
    if isinstance(error, RuntimeError) and message.startswith("Runtime assertion failed for expression"):
        expression = message.removeprefix("Runtime assertion failed for expression").split(" on node")[0]
        symbols = set(re.findall(r"\b[a-z]+\d+\b", expression))
        return bool(symbols) and symbols <= set(input_symbols)
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in _TORCH_INPUT_CHECKS:
            return True
        tb = tb.tb_next
    return False


def _leaf_paths(text: str) -> str:
    """torch's input paths in ``get_leaf_tensors`` names: ``past_key_values.layers[0].keys.size()[2]`` becomes
    ``past_key_values.0.keys dim 2``."""
    text = re.sub(r"\.size\(\)\[(\d+)\]", r" dim \1", text)
    text = re.sub(r"\.layers\[(\d+)\]", r".\1", text)
    text = re.sub(r"\[(\d+)\]", r".\1", text)
    return re.sub(r"\[['\"]([^'\"]+)['\"]\]", r".\1", text)


def run_exported(artifact: Any, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Run ``artifact`` (an ``ExportedProgram``, ``ONNXProgram``, ``.onnx`` path, ExecuTorch program or
    ``.pte`` path) on ``inputs``, the same kind of dict given to ``export``; labels and output flags in it
    are ignored as they were at export. Returns ``{leaf name: tensor}`` like ``get_leaf_tensors(eager_outputs)``.
    Inputs the artifact cannot take raise :class:`InputError`."""
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a mapping of input names to values, got {type(inputs).__name__}",
                         problem="type")
    traced, _ = split_inputs(inputs)
    # a string stays, for the runner to refuse where the program takes a tensor (a constant flag elsewhere)
    traced.update({name: value for name, value in inputs.items() if isinstance(value, (str, bytes)) and name not in traced})
    for module, handles in _LAZY_RUNNERS:
        if handles(artifact):
            importlib.import_module(module)
    for handles, run in _RUNNERS:
        if handles(artifact):
            return expand_stacked_rows(run(artifact, traced))
    raise InputError(
        f"no runtime for {type(artifact).__name__}; run_exported takes an ExportedProgram, an ONNXProgram or "
        f".onnx path, or an ExecutorchProgramManager or .pte path"
    )
