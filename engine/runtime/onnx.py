"""onnxruntime runner for :func:`engine.run_exported`: an ``ONNXProgram`` or a saved ``.onnx`` file, on CPU.

Inputs are fed by leaf name: the inputs dict (caches included) is flattened with
:func:`engine.pytree.get_leaf_tensors`, and each graph input takes the leaf the exporter named it after.
Outputs come back keyed by the eager output leaf names (``logits``, ``past_key_values.0.keys``, ...). Both
mappings are read from the leaf names the exporter records in the model's ``metadata_props``, so they hold for
a saved file too.
"""

from __future__ import annotations

import json
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine import shape_guards
from engine.artifact_meta import (DRAWS_KEY, GUARDS_KEY, INDEX_INPUTS_KEY, INPUT_LEAVES_KEY, INPUT_PREFIX, INPUTS_KEY, MODEL_KEY,
                                  OUTPUT_LEAVES_KEY)
from engine.errors import ExportStageError, InputError, require
from engine.index_inputs import check_index_values
from engine.input_checks import as_tensor_inputs, check_leaves, specs_from_json
from engine.pytree import get_leaf_tensors
from engine.random_draws import draw_inputs
from engine.runtime.dispatch import is_onnx_artifact, register_runner
from engine.runtime.errors import onnxruntime_message, run_failure

EXTRA = "onnx"
PROVIDERS = ["CPUExecutionProvider"]

#: sessions of in-memory programs, dropped with the program
_SESSIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _artifact_name(artifact: Any) -> str:
    if isinstance(artifact, (str, os.PathLike)):
        return Path(artifact).name
    return getattr(getattr(artifact.model, "graph", None), "name", None) or "ONNXProgram"


def session_for(artifact: Any):
    """An ``onnxruntime.InferenceSession`` on CPU for a program (cached per program) or a ``.onnx`` path."""
    ort = require("onnxruntime", EXTRA)
    name = _artifact_name(artifact)
    if isinstance(artifact, (str, os.PathLike)):
        if not Path(artifact).is_file():
            raise InputError(f"no ONNX model at '{artifact}'")
        try:
            return ort.InferenceSession(str(artifact), providers=PROVIDERS)
        except Exception as e:
            raise ExportStageError("load", name, e) from e
    session = _SESSIONS.get(artifact)
    if session is None:
        try:
            # The program serialises itself, or goes through a temporary file it keeps while it lives when
            # past the protobuf limit; the session it holds is then ours, on CPU.
            made = []
            artifact.initialize_inference_session(lambda model: made.append(ort.InferenceSession(model, providers=PROVIDERS)) or made[-1])
            session = made[-1]
        except Exception as e:
            raise ExportStageError("load", name, e) from e
        _SESSIONS[artifact] = session
    return session


def _to_numpy(name: str, tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        raise InputError(f"input '{name}' is bfloat16, which numpy (and so onnxruntime's Python feed) cannot hold",
                         input=name, problem="dtype")
    return tensor.contiguous().numpy()


def _recorded_leaves(session, key: str, count: int) -> list[str] | None:
    """Leaf names the exporter recorded in the model's metadata; None for a model from elsewhere."""
    recorded = session.get_modelmeta().custom_metadata_map.get(key)
    if recorded is None:
        return None
    names = json.loads(recorded)
    return names if len(names) <= count else None


@register_runner(is_onnx_artifact)
def run_onnx(artifact: Any, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Run on onnxruntime (CPU); ``{output leaf name: tensor}``, in graph output order.

    A model this engine exported records its name, its input specs (names, dtypes, bounds) and the inputs it
    indexes with: the inputs are checked against them as every runner checks them. For any other model the graph
    names are used as they are (``input.<leaf>`` still takes ``<leaf>``) and onnxruntime checks the rest.
    """
    session = session_for(artifact)
    recorded = session.get_modelmeta().custom_metadata_map
    label = recorded.get(MODEL_KEY) or _artifact_name(artifact)
    specs = specs_from_json(json.loads(recorded[INPUTS_KEY])) if INPUTS_KEY in recorded else None
    leaves = get_leaf_tensors(as_tensor_inputs(label, inputs, specs))
    if DRAWS_KEY in recorded:  # the forward's own draws, made as eager makes them
        leaves.update(draw_inputs(json.loads(recorded[DRAWS_KEY]), leaves))
    if specs is not None:
        leaves = check_leaves(label, specs, leaves)
        check_index_values(label, json.loads(recorded.get(INDEX_INPUTS_KEY, "{}")), leaves)
    graph_inputs, graph_outputs = session.get_inputs(), session.get_outputs()
    input_leaves = _recorded_leaves(session, INPUT_LEAVES_KEY, len(graph_inputs)) or []
    feeds, missing = {}, []
    for index, graph_input in enumerate(graph_inputs):
        name = graph_input.name
        if index < len(input_leaves):
            leaf = input_leaves[index]
        else:
            leaf = name if name in leaves else name.removeprefix(INPUT_PREFIX)
        if leaf in leaves:
            feeds[name] = _to_numpy(leaf, leaves[leaf])
        else:
            missing.append(leaf)
    # initializers kept as inputs (keep_initializers_as_inputs) are optional: they default to the stored weights
    overridable = {i.name for i in session.get_overridable_initializers()}
    missing = [m for m in missing if m not in overridable]
    if missing:
        raise InputError(f"{label}: the program takes inputs {', '.join(missing)}; missing: {', '.join(missing)}",
                         input=missing[0], problem="missing")
    if GUARDS_KEY in recorded:  # sizes that break a guard would reach kernels built for others
        shape_guards.check(label, json.loads(recorded[GUARDS_KEY]), leaves)
    try:
        results = session.run(None, feeds)
    except Exception as e:
        raise run_failure(label, leaves, onnxruntime_message(e, leaves)) from e
    output_leaves = _recorded_leaves(session, OUTPUT_LEAVES_KEY, len(graph_outputs))
    if output_leaves is None or len(output_leaves) != len(graph_outputs):
        output_leaves = [o.name for o in graph_outputs]
    return {leaf: torch.from_numpy(np.asarray(r)) for leaf, r in zip(output_leaves, results)}
