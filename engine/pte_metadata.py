"""The metadata an ExecuTorch program carries in its ``.pte`` (a constant method returning JSON), and what it says.

Input leaves in the program's order with their dtypes and per-dim ``[min, max]`` bounds, constant inputs, and the
output leaf names: :func:`engine.run_exported` feeds inputs by it, rejects out-of-bounds shapes with a clear error
and names the outputs like ``get_leaf_tensors`` (:mod:`engine.runtime.executorch`). The method's name is
:data:`engine.artifact_meta.META_METHOD`.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils._sympy.value_ranges import bound_sympy

from engine.artifact_meta import META_FORMAT, META_METHOD
from engine.errors import ExportStageError
from engine.fake_mode import program_shape_env
from engine.input_checks import user_input_placeholders, user_input_specs
from engine.pytree import iter_leaf_tensors, spec_leaf_names
from engine.shapes import SpecialisationWarning


def meta_of(program) -> dict[str, Any]:
    """The metadata dict stored in an ``ExecutorchProgramManager`` by :meth:`ExecutorchExporter.export`."""
    getter = getattr(program, "_config_methods", None) or {}
    text = getter.get(META_METHOD)
    return json.loads(text) if isinstance(text, str) else {}


def _bounds(size: Any, ranges: Mapping) -> list[int]:
    """``[min, max]`` of one input dim. A symbolic dim's lower bound of 2 is torch.export's 0/1-specialisation
    assumption, not a limit of the program: ``ExportedProgram.module()`` accepts sizes 0 and 1 there too (a
    decode step traced with two tokens runs one at a time; over an empty cache it computes the prefill), so the
    recorded minimum is 0, as the exported program's own input checks have it."""
    if isinstance(size, int):
        return [size, size]
    vr = bound_sympy(size.node.expr, dict(ranges))
    lo = int(vr.lower) if vr.lower.is_finite else 0
    lo = 0 if lo == 2 else lo
    hi = int(vr.upper) if vr.upper.is_finite else -1  # -1: unbounded (cannot happen after the fix)
    return [lo, hi]


def program_metadata(program: torch.export.ExportedProgram, traced_inputs: Mapping[str, Any], name: str, backend: str) -> dict:
    """Input leaves (name, dtype, per-dim ``[min, max]``) and output leaf names, in the program's flat order."""
    from torch.export.graph_signature import ConstantArgument, OutputKind, TensorArgument

    leaves = [(n, t) for key, value in traced_inputs.items() for n, t in iter_leaf_tensors(value, key)]
    placeholders = user_input_placeholders(program)
    if len(placeholders) != len(leaves):
        raise ExportStageError(
            "export", name, RuntimeError(f"{len(placeholders)} tensor inputs in the program for {len(leaves)} input leaves")
        )
    shape_env = program_shape_env(program)
    ranges = {**(shape_env.var_to_range if shape_env is not None else {}), **program.range_constraints}
    inputs = [
        {"name": leaf, "dtype": str(node.meta["val"].dtype).removeprefix("torch."), "bounds": [_bounds(s, ranges) for s in node.meta["val"].shape]}
        for (leaf, _), node in zip(leaves, placeholders)
    ]
    # non-tensor leaves of the inputs (a ModelOutput's None fields) stay inputs of the ExecuTorch method
    constants = [[i, s.arg.value] for i, s in enumerate(user_input_specs(program)) if isinstance(s.arg, ConstantArgument)]
    user_outputs = [s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    # inputs updated in place (a StaticCache) come back first among the method's outputs
    mutated = [s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_INPUT_MUTATION]
    return {
        "format": META_FORMAT,
        "model": name,
        "backend": backend,
        "inputs": inputs,
        "constant_inputs": constants,
        "mutated_inputs": len(mutated),
        "outputs": [
            name if i < len(user_outputs) and isinstance(user_outputs[i].arg, TensorArgument) else None
            for i, name in enumerate(spec_leaf_names(program.call_spec.out_spec))
        ],
    }


def drop_none_outputs(program: torch.export.ExportedProgram) -> bool:
    """Leave the program's non-tensor user outputs (``None`` fields of a ModelOutput) out of it before lowering; True
    when there were any. The runtime names the tensor outputs in traced order from the metadata computed before
    (:func:`tensor_output_names`).

    Pattern: ExecuTorch 1.5.1's lowering moves a tensor output ahead of ``None`` outputs while the call spec keeps the
    traced order (AyaVision's ``image_outputs``: ``[A, None, None, B, C]`` lowered as ``[A, X, None, None, C]``), so
    out_spec names land on other tensors. Without the ``None`` outputs the orders agree. Likely the cause
    :func:`engine.pytree.in_field_order` avoids; kept as it also spares the runtime its constant outputs."""
    import torch.utils._pytree as pytree
    from torch.export.graph_signature import OutputKind, TensorArgument

    specs = program.graph_signature.output_specs
    keep = [i for i, spec in enumerate(specs) if spec.kind != OutputKind.USER_OUTPUT or isinstance(spec.arg, TensorArgument)]
    if len(keep) == len(specs):
        return False
    output = next(node for node in program.graph.nodes if node.op == "output")
    values = list(output.args[0])
    output.args = (tuple(values[i] for i in keep),)
    specs[:] = [specs[i] for i in keep]
    users = sum(1 for spec in specs if spec.kind == OutputKind.USER_OUTPUT)
    program._module_call_graph[0].signature.out_spec = pytree.tree_structure(tuple(range(users)))
    program.graph_module.recompile()
    return True


def tensor_output_names(meta: dict) -> list[str]:
    """The output names of ``meta`` (:func:`program_metadata` of the program before :func:`drop_none_outputs`) without
    the non-tensor outputs that :func:`drop_none_outputs` leaves out."""
    return [name for name in meta["outputs"] if name is not None]


def warn_specialised_by_lowering(name: str, before: dict, after: dict) -> None:
    """Name every input dim whose bounds the lowering narrowed: to one size (the ``.pte`` accepts only it) or to
    a smaller range (DeepSeek-V3's batch once came out as ``0..2``, the traced batch, from ``0..8``)."""
    pinned, narrowed = [], []
    for b, a in zip(before["inputs"], after["inputs"]):
        for d, ((lo, hi), (a_lo, a_hi)) in enumerate(zip(b["bounds"], a["bounds"])):
            if lo != hi and a_lo == a_hi:
                pinned.append(f"{b['name']} dim {d} (bounds {lo}..{hi}, lowered to {a_lo})")
            elif (a_lo, a_hi) != (lo, hi) and lo <= a_lo <= a_hi <= hi:
                narrowed.append(f"{b['name']} dim {d} (bounds {lo}..{hi}, lowered to {a_lo}..{a_hi})")
    if pinned or narrowed:
        parts = []
        if pinned:
            parts.append(f"specialised {len(pinned)} dynamic input dim(s), so the .pte accepts only one size there: "
                         f"{'; '.join(pinned)}")
        if narrowed:
            parts.append(f"narrowed the bounds of {len(narrowed)} input dim(s): {'; '.join(narrowed)}")
        warnings.warn(
            f"{name}: ExecuTorch lowering {'; and '.join(parts)}",
            SpecialisationWarning,
            stacklevel=3,
        )
