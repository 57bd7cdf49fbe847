"""onnxruntime runner for :func:`engine.run_exported`: an ``ONNXProgram`` or a saved ``.onnx`` file, on CPU.

Inputs are fed by graph input name: the exporter names graph inputs after the ``get_leaf_tensors`` names of
the inputs, so the inputs dict (caches included) is flattened with :func:`engine.pytree.iter_leaf_tensors`
and matched by name. Outputs come back keyed by graph output name, which the exporter set to the eager
output leaf names (``logits``, ``past_key_values.0.keys``, ...).
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.errors import ExportStageError, InputError, require
from engine.pytree import iter_leaf_tensors
from engine.runtime import register_runner

EXTRA = "onnx"
PROVIDERS = ["CPUExecutionProvider"]

#: sessions of in-memory programs, dropped with the program
_SESSIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _is_onnx_artifact(artifact: Any) -> bool:
    if type(artifact).__name__ == "ONNXProgram":
        return True
    return isinstance(artifact, (str, os.PathLike)) and str(artifact).endswith(".onnx")


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
        raise InputError(f"input '{name}' is bfloat16, which numpy (and so onnxruntime's Python feed) cannot hold")
    return tensor.contiguous().numpy()


@register_runner(_is_onnx_artifact)
def run_onnx(artifact: Any, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Run on onnxruntime (CPU); ``{graph output name: tensor}``, in graph output order."""
    session = session_for(artifact)
    leaves = dict(iter_leaf_tensors(inputs))
    feeds, missing = {}, []
    for graph_input in session.get_inputs():
        if graph_input.name in leaves:
            feeds[graph_input.name] = _to_numpy(graph_input.name, leaves[graph_input.name])
        else:
            missing.append(graph_input.name)
    # initializers kept as inputs (keep_initializers_as_inputs) are optional: they default to the stored weights
    overridable = {i.name for i in session.get_overridable_initializers()}
    missing = [m for m in missing if m not in overridable]
    if missing:
        raise InputError(
            f"the ONNX model needs input(s) {', '.join(map(repr, missing))} that the inputs do not provide; "
            f"given leaves: {', '.join(leaves) or '(none)'}"
        )
    try:
        results = session.run(None, feeds)
    except Exception as e:
        raise ExportStageError("run", _artifact_name(artifact), e) from e
    return {out.name: torch.from_numpy(np.asarray(r)) for out, r in zip(session.get_outputs(), results)}
