"""export-sweep's exporter engine: transformers models to torch.export, ONNX and ExecuTorch.

>>> from engine import DynamoExporter, DynamoConfig, run_exported, get_leaf_tensors
>>> program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
>>> run_exported(program, inputs)  # {"logits": ..., "past_key_values.0.keys": ...}
"""

from engine.auto import AutoExportConfig, AutoExporter
from engine.configs import DynamoConfig, ExecutorchConfig, OnnxConfig
from engine.decompose import decompose_for_generation, decompose_multimodal, decompose_prefill_decode, is_multimodal
from engine.errors import (
    ConfigError,
    ExportStageError,
    ExportSweepError,
    InputError,
    MissingDependencyError,
    ModelError,
)
from engine.exporter_dynamo import DynamoExporter
from engine.generate import generate
from engine.patches import (
    apply_fx_node_fixes,
    apply_fx_program_fixes,
    apply_patches,
    register_fx_node_fix,
    register_fx_program_fix,
    register_patch,
)
from engine.program_io import load_program, save_program
from engine.pytree import get_leaf_tensors, register_pytree_nodes
from engine.runtime import run_exported
from engine.shapes import SpecialisationWarning
from engine.versions import VersionDriftWarning, installed_versions, pinned_versions, version_drift


def __getattr__(name: str):
    # Backend exporters import their optional stacks only when asked for.
    lazy = {"OnnxExporter": "onnx", "ExecutorchExporter": "executorch"}
    if name in lazy:
        return AutoExporter.exporter_class(lazy[name])
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = [
    "AutoExportConfig",
    "AutoExporter",
    "ConfigError",
    "DynamoConfig",
    "DynamoExporter",
    "ExecutorchConfig",
    "ExecutorchExporter",
    "ExportStageError",
    "ExportSweepError",
    "InputError",
    "MissingDependencyError",
    "ModelError",
    "OnnxConfig",
    "OnnxExporter",
    "SpecialisationWarning",
    "VersionDriftWarning",
    "apply_fx_node_fixes",
    "decompose_for_generation",
    "decompose_multimodal",
    "decompose_prefill_decode",
    "generate",
    "is_multimodal",
    "apply_fx_program_fixes",
    "apply_patches",
    "get_leaf_tensors",
    "load_program",
    "installed_versions",
    "pinned_versions",
    "register_fx_node_fix",
    "register_fx_program_fix",
    "register_patch",
    "register_pytree_nodes",
    "run_exported",
    "save_program",
    "version_drift",
]
