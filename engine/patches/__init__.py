"""Every workaround of the engine, behind one registry (:mod:`engine.patches.registry`).

Where to look for the workaround of X:

=======================  ================================================================================================
``model/``               model code torch.export cannot trace with dynamic shapes, one module per pattern family
                         (scope ``"dynamo"``: every exporter traces with them); its ``__init__`` lists the families
``torch_export``         torch.export internals: guards, probes and solver steps that fail on symbolic shapes; speed
``unlowerable_ops``      ops torch.export records that the ONNX and ExecuTorch lowerings do not take or compute
                         inexactly (FX node fixes)
``complex_pairs``        complex tensors as real ``(..., 2)`` pairs, FFTs as real matmuls (an FX rewrite)
``program_io``           what ``torch.export.save`` cannot write, and the ``.pt2`` round trip's speed
``generation``           cache state that must follow symbolic shapes in exported generation steps
``onnx``                 torch functions, torch.onnx/onnxscript internals and FX nodes for ONNX
``onnx_translations``    onnxscript functions for aten ops torchlib lowers wrong or not at all
``executorch``           torch functions and ExecuTorch internals ExecuTorch/XNNPACK rejects or computes wrong
``executorch_nodes``     FX nodes ExecuTorch's edge dialect, memory planning or XNNPACK rejects (node fixes)
``executorch_speed``     the same ExecuTorch lowering without the work it repeats
``registry``             ``register_patch`` / ``register_trace_context`` / ``register_fx_node_fix`` and their ``apply_*``
``fx_edit``              the node fixes' kit: ``insert_node``, ``size_node``, ``replace_node``, ``fake_value``
``source_rewrite``       a function recompiled from its own source through an AST rewrite
``packed_positions``     a packed sequence's positions (each one's image, frame, row, column), shared by families
=======================  ================================================================================================

Four kinds of workaround, applied by the stages every exporter shares (:mod:`engine`): **patches** (a reversible,
version-ranged swap of a dotted path) while tracing (step 2b) and, for ONNX and ExecuTorch, while lowering (stage 4);
**trace contexts** (patches whose targets are found on the model: its submodules, its config) around the trace
(step 2d); **FX node and program fixes** on the traced program (stage 3); **ONNX translations** while lowering.
Each is named after the pattern it replaces, never a model; its docstring says the pattern, the rewrite and the
upstream issue. Speed patches leave the artifact unchanged (tests check it with the patch disabled).

The scope modules register on import and are imported by the exporter that needs them, not here.
"""

from engine.patches.registry import (BACKENDS, Patch, apply_fx_node_fixes, apply_fx_program_fixes, apply_patches,
                                     apply_trace_contexts, patch_disabled, register_fx_node_fix, register_fx_program_fix,
                                     register_patch, register_trace_context, registered_patches)

__all__ = ["BACKENDS", "Patch", "apply_fx_node_fixes", "apply_fx_program_fixes", "apply_patches", "apply_trace_contexts",
           "patch_disabled", "register_fx_node_fix", "register_fx_program_fix", "register_patch", "register_trace_context",
           "registered_patches"]
