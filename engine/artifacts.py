"""One save and one load call for every artifact kind: the ``.pt2`` program, the ``.onnx`` model, the ``.pte``.

``save_artifact(artifact, path)`` writes what an exporter returned, chosen by its type, and ``load_artifact(path)``
gives back what :func:`engine.run_exported` runs (a loaded ``ExportedProgram`` for ``.pt2``; the path itself for
``.onnx`` and ``.pte``, which their runtimes open), so a caller never branches on the backend.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from engine.errors import ConfigError, ExportStageError

#: the file suffix of each backend's artifact
SUFFIX = {"dynamo": ".pt2", "onnx": ".onnx", "executorch": ".pte"}


def artifact_kind(artifact: Any) -> str:
    """The backend an exporter's artifact comes from: ``"dynamo"``, ``"onnx"`` or ``"executorch"``."""
    if isinstance(artifact, torch.export.ExportedProgram):
        return "dynamo"
    kind = type(artifact).__name__
    if kind == "ONNXProgram":
        return "onnx"
    if kind == "ExecutorchProgramManager":
        return "executorch"
    raise ConfigError(f"cannot save a {kind}: an artifact is an ExportedProgram, an ONNXProgram or an "
                      "ExecutorchProgramManager (what DynamoExporter, OnnxExporter and ExecutorchExporter return)")


def save_artifact(artifact: Any, path: str | os.PathLike) -> str:
    """Write ``artifact`` to ``path`` (its suffix: :data:`SUFFIX`); returns the path. ONNX weights go to a
    ``.onnx_data`` sidecar only past protobuf's 2 GB (:func:`engine.onnx_io.save_onnx` chooses otherwise)."""
    kind = artifact_kind(artifact)
    if kind == "dynamo":
        from engine.program_io import save_program

        return save_program(artifact, path)
    if kind == "onnx":
        from engine.onnx_io import save_onnx

        save_onnx(artifact, path, external_data=False)  # one file, as ONNXProgram.save (a sidecar past 2 GB)
        return os.fspath(path)
    return save_pte(artifact, path)


def load_artifact(path: str | os.PathLike) -> Any:
    """What :func:`engine.run_exported` runs for a saved artifact: a ``.pt2`` is loaded; ``.onnx`` and ``.pte`` paths
    are opened by their runtimes."""
    if os.fspath(path).endswith(SUFFIX["dynamo"]):
        from engine.program_io import load_program

        return load_program(path)
    return os.fspath(path)


def save_pte(program: Any, path: str | os.PathLike) -> str:
    """Write an ``ExecutorchProgramManager`` to ``path``: the bytes of ``program.write_to_file``, streamed without a
    contiguous copy; unlike ``ExecutorchProgramManager.save`` it raises instead of logging a failure."""
    from engine.pte_metadata import meta_of

    path = os.fspath(path)
    try:
        with open(path, "wb") as f:
            program.write_to_file(f)
    except Exception as e:
        raise ExportStageError("save", meta_of(program).get("model", type(program).__name__), e) from e
    return path
