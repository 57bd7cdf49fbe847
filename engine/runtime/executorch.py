"""Runner for ExecuTorch artifacts: an ``ExecutorchProgramManager`` or a ``.pte`` path, on ``executorch.runtime``.

The program's metadata (a JSON string returned by the constant method ``export_sweep_meta``, written by
:class:`engine.exporter_executorch.ExecutorchExporter`) gives the input leaves in the program's order with
their dtypes and per-dim ``[min, max]`` bounds, and the ``get_leaf_tensors`` name of every output. Inputs
are checked against the bounds before the native runtime sees them: an out-of-bounds shape raises
:class:`engine.InputError` naming the input, the dim and its bounds.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from engine import shape_guards
from engine.artifact_meta import META_METHOD
from engine.errors import ExportStageError, InputError, require
from engine.index_inputs import check_index_values
from engine.input_checks import as_tensor_inputs, check_leaves, specs_from_json
from engine.pytree import get_leaf_tensors
from engine.random_draws import draw_inputs
from engine.runtime.dispatch import is_executorch_artifact, register_runner
from engine.runtime.errors import executorch_message, run_failure, shapes


def load_program(artifact: Any):
    """``(executorch.runtime.Program, metadata dict)`` for a manager or a ``.pte`` path."""
    runtime = require("executorch.runtime", "executorch")
    label = os.fspath(artifact) if isinstance(artifact, (str, os.PathLike)) else "ExecutorchProgramManager"
    try:
        if isinstance(artifact, (str, os.PathLike)):
            if not os.path.isfile(artifact):
                raise FileNotFoundError(f"no such .pte file: {label}")
            program = runtime.Runtime.get().load_program(os.fspath(artifact))
        else:
            program = runtime.Runtime.get().load_program(artifact.buffer)
    except MemoryError as e:  # the memory plan (every dynamic dim at its upper bound) is allocated at load
        hint = MemoryError(f"{e}: the runtime could not allocate the program's memory plan, which is sized for every "
                           "dynamic dim at its upper bound; export with smaller bounds (ExecutorchConfig.max_seq_len, "
                           "or dynamic_shapes with Dim(max=)); the UnboundedDimWarning at export lists the bounds chosen")
        raise ExportStageError("load", label, hint) from e
    except Exception as e:
        raise ExportStageError("load", label, e) from e
    if META_METHOD not in program.method_names:
        raise InputError(
            f"{label} has no '{META_METHOD}' method: it was not written by engine.ExecutorchExporter, so its input "
            "order and output names are unknown; run it with executorch.runtime directly"
        )
    meta = json.loads(program.load_method(META_METHOD).execute([])[0])
    return program, meta


def check_inputs(meta: dict, inputs: dict[str, Any]) -> list[torch.Tensor]:
    """The method inputs in the program's order (tensors cast to its dtypes, constant leaves as traced);
    :class:`InputError` on any mismatch (the checks every runner makes: :func:`engine.input_checks.check_leaves`,
    :func:`engine.index_inputs.check_index_values`)."""
    label = meta.get("model", "program")
    specs = specs_from_json(meta["inputs"])
    leaves = get_leaf_tensors(as_tensor_inputs(label, inputs, specs))
    leaves.update(draw_inputs(meta.get("random_draws"), leaves))  # the forward's own draws, made as eager makes them
    checked = check_leaves(label, specs, leaves)
    check_index_values(label, meta.get("index_inputs", {}), checked)
    # sizes that break a trace guard would reach kernels planned for others (error 0x12, or a native crash)
    shape_guards.check(label, meta.get("guards"), checked)
    flat = [_runtime_tensor(tensor) for tensor in checked.values()]
    for position, value in meta.get("constant_inputs", ()):  # None leaves the trace kept as method inputs
        flat.insert(position, value)
    return flat


def _runtime_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor; an empty one made anew, with the strides of its shape (a slice keeps its base's, which
    the runtime's ``make_tensor_ptr`` asserts on and aborts the process)."""
    tensor = tensor.detach().cpu()
    return torch.empty(tensor.shape, dtype=tensor.dtype) if tensor.numel() == 0 else tensor.contiguous()


def missing_kernels(artifact: Any) -> list[str]:
    """The operators the program calls outside its delegates for which this runtime registered no kernel: what
    makes ``load_method`` fail with 0x14 (OperatorMissing), which names none of them (only a native log line does)."""
    from executorch.extension.pybindings.portable_lib import _get_operator_names

    if isinstance(artifact, (str, os.PathLike)):
        from executorch.exir._serialize._program import deserialize_pte_binary

        with open(artifact, "rb") as f:
            plans = deserialize_pte_binary(f.read()).program.execution_plan
    else:
        plans = artifact.executorch_program.execution_plan
    registered = set(_get_operator_names())
    called = {f"{op.name}.{op.overload}" if op.overload else op.name for plan in plans for op in plan.operators}
    return sorted(called - registered)


@register_runner(is_executorch_artifact)
def run_executorch(artifact: Any, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    program, meta = load_program(artifact)
    flat = check_inputs(meta, inputs)
    model = meta.get("model", "program")
    try:
        method = program.load_method("forward")
    except Exception as e:
        missing = missing_kernels(artifact)
        if missing:
            raise ExportStageError("run", model, RuntimeError(
                f"the ExecuTorch runtime has no kernel for {', '.join(missing)}, which the program calls outside its "
                f"delegates ({executorch_message(e)})")) from e
        raise ExportStageError("run", model, RuntimeError(executorch_message(e))) from e
    try:
        outputs = method.execute(flat)
    except Exception as e:
        leaves = get_leaf_tensors(inputs)
        raise run_failure(model, leaves, f"{executorch_message(e)}; inputs {shapes(leaves)}") from e
    names = meta["outputs"]
    outputs = list(outputs)[meta.get("mutated_inputs", 0):]  # the updated inputs precede the outputs
    if len(outputs) != len(names):
        raise ExportStageError("run", model, RuntimeError(f"{len(outputs)} outputs for {len(names)} output names"))
    return {name: out for name, out in zip(names, outputs) if name is not None}
