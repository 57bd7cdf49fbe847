"""export-sweep's exporter engine: transformers models to torch.export, ONNX and ExecuTorch.

>>> from engine import DynamoExporter, DynamoConfig, run_exported, get_leaf_tensors
>>> program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
>>> run_exported(program, inputs)  # {"logits": ..., "past_key_values.0.keys": ...}
"""

import importlib

# Public name -> the module that defines it. Importing ``engine`` (or any ``engine.x``, which runs this file first)
# imports none of them: the exporters pull in transformers' modeling utilities (about 6 s), which a process that
# only collects or schedules sweep cases never needs. A name is imported on first use.
_EXPORTS = {
    "engine.auto": ("AutoExportConfig", "AutoExporter"),
    "engine.configs": ("DynamoConfig", "ExecutorchConfig", "OnnxConfig"),
    "engine.decompose": ("decompose_for_generation", "decompose_multimodal", "decompose_prefill_decode", "is_multimodal"),
    "engine.errors": ("ConfigError", "ExportStageError", "ExportSweepError", "InputError", "MissingDependencyError",
                      "ModelError"),
    "engine.exporter_dynamo": ("DynamoExporter",),
    "engine.generation": ("generate",),
    "engine.patches": ("apply_fx_node_fixes", "apply_fx_program_fixes", "apply_patches", "register_fx_node_fix",
                       "register_fx_program_fix", "register_patch"),
    "engine.program_io": ("load_program", "save_program"),
    "engine.pytree": ("get_leaf_tensors", "register_pytree_nodes"),
    "engine.runtime": ("run_exported",),
    "engine.shape_guards": ("ShapeGuardWarning",),
    "engine.shapes": ("SpecialisationWarning",),
    "engine.versions": ("VersionDriftWarning", "installed_versions", "pinned_versions", "version_drift"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
_BACKEND_EXPORTERS = {"OnnxExporter": "onnx", "ExecutorchExporter": "executorch"}  # import their optional stacks


def __getattr__(name: str):
    if name in _BACKEND_EXPORTERS:
        return __getattr__("AutoExporter").exporter_class(_BACKEND_EXPORTERS[name])
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
    "ShapeGuardWarning",
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
