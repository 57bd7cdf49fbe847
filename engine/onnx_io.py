"""ONNX graph inputs and outputs named after the model's leaves, and the ``.onnx`` file written beside its weights.

Graph inputs are named after the ``get_leaf_tensors`` names of the inputs (``input_ids``,
``past_key_values.0.keys``) and graph outputs after those of the eager outputs (``logits``, ...), so
:func:`engine.run_exported` maps an onnxruntime result straight back to eager leaves. ONNX names are unique
within a graph, so an input leaf that is also an output leaf (a cache fed in and returned updated) is named
``input.<leaf>`` and a bare tensor output ``output``; the leaf names themselves are recorded in the model's
``metadata_props`` (keys in :mod:`engine.artifact_meta`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from torch.export.graph_signature import OutputKind, TensorArgument

from engine.artifact_meta import BARE_OUTPUT, INPUT_LEAVES_KEY, INPUT_PREFIX, OUTPUT_LEAVES_KEY
from engine.input_checks import user_input_specs
from engine.pytree import spec_leaf_names

logger = logging.getLogger("engine")

#: protobuf cannot hold a model past 2 GiB; keep a margin for the graph itself
_PROTOBUF_LIMIT = 1_800_000_000


def io_leaf_names(program: torch.export.ExportedProgram) -> tuple[list[str], list[str]]:
    """Leaf names of the program's inputs and outputs, read from its call spec: the same pytree flattening
    that orders the ONNX graph's inputs and outputs, so no eager forward is needed to name them.

    Outputs that are constants (a ``None`` in a tuple of hidden states) are leaves of the spec but not graph
    outputs: torch.onnx drops them, so they get no name."""
    spec = program.call_spec
    # the in-spec is (args, kwargs): leaves are named "0.<i>..." and "1.<kwarg>..."; kwargs keep their own names
    input_names = [name[2:] if name.startswith("1.") else f"args.{name[2:]}" for name in spec_leaf_names(spec.in_spec)]
    user_inputs = user_input_specs(program)
    if len(user_inputs) == len(input_names):  # placeholder names let unused inputs (pruned by torch.onnx) go
        input_names = [(n, s.arg.name) for n, s in zip(input_names, user_inputs) if isinstance(s.arg, TensorArgument)]
    user_outputs = [s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    output_names = spec_leaf_names(spec.out_spec)
    if len(user_outputs) == len(output_names):
        output_names = [n for n, s in zip(output_names, user_outputs) if isinstance(s.arg, TensorArgument)]
    return input_names, output_names


def name_graph_io(model, input_names: list, output_names: list[str]) -> None:
    """Name the graph's user inputs and its outputs after their leaves, and record the leaf names in the
    model's ``metadata_props`` (they travel with a saved file) for the runner to map results back.

    ONNX names must be unique and non-empty: an input leaf that is also an output leaf (``past_key_values.0.keys``
    in a decode step) is named ``input.past_key_values.0.keys``, and a bare tensor output (leaf ``""``) is named
    ``output``; every other name is the leaf name itself. An output that is a graph input, an initializer or an
    earlier output goes through an ``Identity`` first, so every name lands on its own value.
    """
    import onnx_ir as ir

    graph = model.graph
    # inputs come as (leaf, placeholder name): torch.onnx keeps placeholder names (adding "_orig" to an input
    # that is also returned as an output) and drops unused inputs
    by_placeholder = {v.name: v for v in graph.inputs}
    by_placeholder.update({v.name.removesuffix("_orig"): v for v in graph.inputs if v.name.endswith("_orig")
                           and v.name.removesuffix("_orig") not in by_placeholder})
    pairs = [(leaf, by_placeholder.get(placeholder)) for leaf, placeholder in (
        item if isinstance(item, tuple) else (item, None) for item in input_names)]
    if any(value is None for _, value in pairs) and not any(value is not None for _, value in pairs):
        pairs = list(zip([leaf for leaf, _ in pairs], graph.inputs))  # no name matched: positional
    pairs = [(leaf, value) for leaf, value in pairs if value is not None]
    if len(pairs) != len(graph.inputs) or len(graph.outputs) != len(output_names):
        raise ValueError(
            f"the ONNX graph has {len(graph.inputs)} inputs and {len(graph.outputs)} outputs, but "
            f"{len(pairs)} input leaves were matched to them and the outputs have {len(output_names)} leaves"
        )
    outputs = set(output_names)
    named = []
    leaf_of = {id(value): leaf for leaf, value in pairs}
    input_names = [leaf_of[id(value)] for value in graph.inputs]  # in graph order, for the runner
    for value in graph.inputs:
        leaf = leaf_of[id(value)]
        value.name = f"{INPUT_PREFIX}{leaf}" if leaf in outputs else leaf
        named.append(value)
    seen: set[int] = set()
    for index, (value, leaf) in enumerate(zip(list(graph.outputs), output_names)):
        if value.is_graph_input() or value.is_initializer() or id(value) in seen:
            identity = ir.node("Identity", [value])
            out = identity.outputs[0]
            out.shape, out.type = value.shape, value.type
            graph.append(identity)
            graph.outputs[index] = value = out
        seen.add(id(value))
        value.name = leaf or BARE_OUTPUT
        named.append(value)
    # an intermediate value that happens to carry one of these names gets out of the way
    taken = {v.name: v for v in named}
    for node in graph.all_nodes():
        for value in node.outputs:
            if taken.get(value.name, value) is not value:
                value.name = f"{value.name}__{id(value):x}"
    for initializer in list(graph.initializers.values()):
        if taken.get(initializer.name, initializer) is not initializer:
            graph.initializers.pop(initializer.name)
            initializer.name = f"{initializer.name}__{id(initializer):x}"
            graph.initializers.add(initializer)
    model.metadata_props[INPUT_LEAVES_KEY] = json.dumps(input_names)
    model.metadata_props[OUTPUT_LEAVES_KEY] = json.dumps(output_names)


# ── Saving ──────────────────────────────────────────────────────────────────────────────────────────────────


def sidecar_path(path: str | os.PathLike) -> Path:
    """``model.onnx`` -> ``model.onnx_data``, the external-data file beside it."""
    return Path(path).with_suffix(".onnx_data")


def _initializer_bytes(graph) -> int:
    return sum(v.const_value.nbytes for v in graph.initializers.values() if v.const_value is not None)


def save_onnx(onnx_program, path: str | os.PathLike, *, external_data: bool = True, export_params: bool = True,
              keep_initializers_as_inputs: bool = False) -> None:
    """Write the model to ``path``; weights go to the ``.onnx_data`` sidecar with ``external_data``, and always when
    they exceed what one protobuf can hold. The in-memory model is left unchanged."""
    import onnx_ir as ir

    model = onnx_program.model
    graph = model.graph
    initializers = dict(graph.initializers)
    inputs = list(graph.inputs)
    path = Path(path)
    try:
        if not export_params:
            graph.initializers.clear()
        if keep_initializers_as_inputs:
            graph.inputs.extend(v for v in initializers.values() if v not in inputs)
        large = _initializer_bytes(graph) > _PROTOBUF_LIMIT
        if large and not external_data:
            logger.warning("%s: weights exceed the 2 GB protobuf limit; writing them to %s", path, sidecar_path(path))
        if (external_data or large) and graph.initializers:
            ir.save(model, path, external_data=sidecar_path(path).name)
        else:
            ir.save(model, path)
    finally:
        if not export_params:
            graph.initializers.update(initializers)
        if keep_initializers_as_inputs:
            graph.inputs.clear()
            graph.inputs.extend(inputs)
