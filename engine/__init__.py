"""export-sweep's exporter engine: transformers models to torch.export, ONNX and ExecuTorch.

>>> from engine import DynamoExporter, DynamoConfig, run_exported, get_leaf_tensors
>>> program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
>>> run_exported(program, inputs)  # {"logits": ..., "past_key_values.0.keys": ...}

Every exporter's ``export()`` reads as the same six stages (a banner comment labels each):

1. **Prepare**: check the config; the backend's device, dtype and partitioners (ExecuTorch), the opset (ONNX).
2. **Trace**: :meth:`DynamoExporter.trace`, ``torch.export`` with the exporter's patches active (model patches
   and the backend's), the pytree nodes registered and dynamic shapes chosen (:mod:`engine.shapes`); then the
   specialisation and shape-guard report (:mod:`engine.shape_guards`).
3. **Fix the program**: FX program and node fixes of the backend (ExecuTorch first bounds every dynamic dim for
   memory planning: :mod:`engine.dim_bounds`).
4. **Lower**: ONNX ``torch.onnx.export`` and the optimizer; ExecuTorch the edge dialect and the partitioner
   (:mod:`engine.executorch_lowering`); the backend's patches active. Dynamo: nothing to do.
5. **Describe**: what the runtime reads back from the artifact: ONNX graph I/O names (:mod:`engine.onnx_io`),
   the ``.pte``'s metadata method (:mod:`engine.pte_metadata`), guards (names in :mod:`engine.artifact_meta`).
6. **Write**: the ``.onnx`` file (with ``output_path``), the ExecuTorch program; any artifact with
   :func:`save_artifact` (:mod:`engine.artifacts`).

Every workaround (patches, FX fixes, ONNX translations) lives in :mod:`engine.patches`, one module per scope.
Runtimes (:mod:`engine.runtime`, ``runtime_onnx``, ``runtime_executorch``) read the artifacts, each checking its
inputs by one contract (:mod:`engine.input_checks`, the index inputs of :mod:`engine.index_inputs`) and naming what a
runtime still refuses (:mod:`engine.runtime_errors`); ``.pt2`` files load in any process (:mod:`engine.program_io`
records and registers their pytree classes); generation is
:mod:`engine.decompose` (components) and :mod:`engine.generation` (the loop). Shared helpers one layer down:
:mod:`engine.fake_mode`, :mod:`engine.pytree`, :mod:`engine.prepare`, :mod:`engine.signature`.
"""

import importlib

# Public name -> the module that defines it. Importing ``engine`` (or any ``engine.x``, which runs this file first)
# imports none of them: the exporters pull in transformers' modeling utilities (about 6 s), which a process that
# only collects or schedules sweep cases never needs. A name is imported on first use.
_EXPORTS = {
    "engine.artifacts": ("load_artifact", "save_artifact"),
    "engine.auto": ("AutoExportConfig", "AutoExporter"),
    "engine.configs": ("DynamoConfig", "ExecutorchConfig", "OnnxConfig"),
    "engine.decompose": ("decompose_for_generation", "decompose_multimodal", "decompose_prefill_decode", "is_multimodal"),
    "engine.dim_bounds": ("UnboundedDimWarning",),
    "engine.errors": ("ConfigError", "ExportStageError", "ExportSweepError", "InputError", "MissingDependencyError",
                      "ModelError", "PlannedMemoryError"),
    "engine.exporter_dynamo": ("DynamoExporter",),
    "engine.generation": ("generate",),
    "engine.patches": ("apply_fx_node_fixes", "apply_fx_program_fixes", "apply_patches", "register_fx_node_fix",
                       "register_fx_program_fix", "register_patch"),
    "engine.program_io": ("load_program", "save_program"),
    "engine.pytree": ("get_leaf_tensors", "register_pytree_nodes"),
    "engine.rope_positions": ("generation_position_ids", "with_rope_position_ids"),
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
    "PlannedMemoryError",
    "ShapeGuardWarning",
    "SpecialisationWarning",
    "UnboundedDimWarning",
    "VersionDriftWarning",
    "apply_fx_node_fixes",
    "decompose_for_generation",
    "decompose_multimodal",
    "decompose_prefill_decode",
    "generate",
    "generation_position_ids",
    "is_multimodal",
    "apply_fx_program_fixes",
    "apply_patches",
    "get_leaf_tensors",
    "load_artifact",
    "load_program",
    "installed_versions",
    "pinned_versions",
    "register_fx_node_fix",
    "register_fx_program_fix",
    "register_patch",
    "register_pytree_nodes",
    "run_exported",
    "save_artifact",
    "save_program",
    "version_drift",
    "with_rope_position_ids",
]
