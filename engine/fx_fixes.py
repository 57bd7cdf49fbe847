"""FX node fixes shared by backends: one function per pattern, registered for every backend that needs it."""

from __future__ import annotations

import torch

from engine.patches import register_fx_node_fix


@register_fx_node_fix("onnx")
@register_fx_node_fix("executorch")
def _fix_is_all_true_as_all(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``aten._is_all_true(x)`` an ``aten.all(x)``.

    Pattern: a model checks a whole tensor before using it (LLaVA checks that its image tokens match the image
    features with ``torch.all(...)``); torch.export records the check as ``aten._is_all_true``, which torchlib
    cannot lower ("No ONNX function found for aten._is_all_true") and which is not in the Core ATen opset
    ExecuTorch's edge dialect takes. Both return a 0-d bool tensor; ``aten.all`` is a plain reduction.
    TODO: upstream issue not found.
    """
    if node.op != "call_function" or node.target is not torch.ops.aten._is_all_true.default:
        return False
    with gm.graph.inserting_before(node):
        replacement = gm.graph.call_function(torch.ops.aten.all.default, (node.args[0],))
    replacement.meta.update(node.meta)
    node.replace_all_uses_with(replacement)
    return True
