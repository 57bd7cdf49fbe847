"""Every workaround of the engine, one module per scope, behind one registry (:mod:`engine.patches.registry`).

Where to look for the workaround of X:

=================================  ==============================================================================
``registry``                       ``register_patch`` / ``register_fx_node_fix`` / ``apply_patches``: reversible,
                                   version-ranged swaps and in-place FX rewrites, keyed by backend
``model``                          model code torch.export cannot trace with dynamic shapes (``"dynamo"``: every
                                   exporter traces with them)
``torch_export``                   ops torch.export records that no lowering takes; torch.export internals (guards, speed)
``program_io``                     what ``torch.export.save`` cannot write, and the ``.pt2`` round trip's speed
``generation``                     cache state that must follow symbolic shapes in exported generation steps
``onnx``                           torch functions, torch.onnx/onnxscript internals and FX nodes for ONNX
``onnx_translations``              onnxscript functions for aten ops torchlib lowers wrong or not at all
``executorch``                     torch functions, ExecuTorch internals and FX nodes ExecuTorch/XNNPACK rejects
``executorch_speed``               the same ExecuTorch lowering without the work it repeats
=================================  ==============================================================================

Each scope module has a *correctness* section (without it a model fails or computes wrong numbers) and a *speed*
section (the same artifact, sooner; tests check the artifact is unchanged with the patch disabled). Each patch is
named after the pattern it replaces, never a model, and its docstring names the upstream issue. When they act,
by the stages every exporter shares (``engine/__init__.py``): patches of the exporter's backends while tracing
(stage 2) and, for ONNX and ExecuTorch, while lowering (stage 4); FX node fixes on the traced program (stage 3).

The scope modules register on import and are imported by the exporter that needs them, not here: a scope module
may import engine modules that import this package's registry.
"""

from engine.patches.registry import (BACKENDS, Patch, apply_fx_node_fixes, apply_fx_program_fixes, apply_patches, patch_disabled,
                                     register_fx_node_fix, register_fx_program_fix, register_patch, registered_patches,
                                     resolve_dotted_path, swap_attributes)

__all__ = ["BACKENDS", "Patch", "apply_fx_node_fixes", "apply_fx_program_fixes", "apply_patches", "patch_disabled",
           "register_fx_node_fix", "register_fx_program_fix", "register_patch", "registered_patches", "resolve_dotted_path",
           "swap_attributes"]
