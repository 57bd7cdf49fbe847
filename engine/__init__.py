"""export-sweep's exporter engine: transformers models to torch.export, ONNX and ExecuTorch.

>>> from engine import DynamoExporter, DynamoConfig, run_exported, get_leaf_tensors
>>> program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
>>> run_exported(program, inputs)  # {"logits": ..., "past_key_values.0.keys": ...}

**The pipeline.** Every exporter's ``export()`` reads as the same stages, each under a banner comment
``# ── Stage N: <name>``; the trace's steps are banners ``# ── 2x: <name>`` in :meth:`DynamoExporter.trace`. These
labels are the only ones (``engine/README.md`` explains each; ``tests/test_layout.py`` checks the banners):

1. **Prepare**: the config; the backend's device, dtype and partitioners (ExecuTorch), the opset (ONNX).
2. **Trace**: ``torch.export`` with the exporter's patches, in steps:
   2a **Dynamic shapes** (the size-1 widening, the retrace where guards restrict a dim), 2b **Patches**, 2c **Forward-signature flattening**,
   2d **Trace contexts**, 2e **Pytree registration**, 2f **Model state clean-up**, 2g **Lower bounds**,
   2h **Specialisation and shape-guard report**.
3. **Fix the program**: the backend's FX program and node fixes (ExecuTorch first bounds every dynamic dim).
4. **Lower**: ONNX ``torch.onnx.export`` and the optimizer; ExecuTorch the edge dialect and the partitioner.
5. **Describe**: what the runtime reads back from the artifact (I/O names, input specs, guards).
6. **Write**: the ``.onnx`` file, the ExecuTorch program; any artifact with :func:`save_artifact`.

**The map.** Layers from the top (a module imports only from layers below it: ``pyproject.toml``'s import-linter
contracts):

==========================  ==========================================================================================
exporters                   ``auto`` (the exporter for a config), ``exporter_dynamo``, ``exporter_onnx``,
                            ``exporter_executorch``, ``configs``
``generation/``             the generation decomposition (prefill/decode, multimodal) and the greedy loop
``runtime/``                ``run_exported`` and the three runners; ``artifacts`` (save/load any artifact),
                            ``program_io`` (the ``.pt2`` round trip)
stages                      ``prepare`` (stage 1), ``shapes``, ``shape_guards``, ``signature`` (stage 2),
                            ``dim_bounds``, ``random_draws`` (stage 3), ``executorch_lowering`` (stage 4), ``onnx_io``,
                            ``pte_metadata`` (stage 5)
``patches/``                every workaround: registered patches, trace contexts, FX fixes, ONNX translations
tools                       ``single_trace`` (one trace to a decomposed program), ``swap`` (reversible attribute
                            swaps), ``pytree`` and ``stacked_rows`` (how containers flatten), ``input_checks`` and
                            ``index_inputs`` (the runners' input contract), ``artifact_meta`` (metadata key names),
                            ``compare``, ``fake_mode``, ``errors``, ``versions``
==========================  ==========================================================================================
"""

import importlib

# Public name -> the module that defines it. Importing ``engine`` (or any ``engine.x``, which runs this file first)
# imports none of them: the exporters pull in transformers' modeling utilities (about 6 s), which a process that
# only collects or schedules sweep cases never needs. A name is imported on first use.
_EXPORTS = {
    "engine.artifacts": ("load_artifact", "save_artifact"),
    "engine.auto": ("AutoExportConfig", "AutoExporter"),
    "engine.configs": ("DynamoConfig", "ExecutorchConfig", "OnnxConfig"),
    "engine.generation.decompose": ("decompose_for_generation", "decompose_multimodal", "decompose_prefill_decode", "is_multimodal"),
    "engine.dim_bounds": ("UnboundedDimWarning",),
    "engine.errors": ("ConfigError", "ExportStageError", "ExportSweepError", "InputError", "MissingDependencyError",
                      "ModelError", "PlannedMemoryError"),
    "engine.exporter_dynamo": ("DynamoExporter",),
    "engine.generation.loop": ("generate",),
    "engine.patches": ("apply_fx_node_fixes", "apply_fx_program_fixes", "apply_patches", "register_fx_node_fix",
                       "register_fx_program_fix", "register_patch"),
    "engine.program_io": ("load_program", "save_program"),
    "engine.pytree": ("get_leaf_tensors", "register_pytree_nodes"),
    "engine.patches.model.rope_positions": ("generation_position_ids", "with_rope_position_ids"),
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
