"""FX node fixes shared by backends: one function per pattern, registered for every backend that needs it."""

from __future__ import annotations

import math
import operator

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


@register_fx_node_fix("dynamo")
def _fix_ceil_for_the_serializer(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``math.ceil(x)`` of a symbolic size ``sym_ite(x > trunc(x), trunc(x) + 1, trunc(x))``.

    Pattern: a model rounds a size up, ``math.ceil(length / window)`` (GraniteSpeech's audio windows); with that
    length dynamic, torch.export records ``math.ceil`` on a SymFloat, which ``torch.export.save`` cannot write
    ("Failed serializing node ceil": it is not among the serializer's symbolic ops). ``trunc``, ``>``, ``+`` and
    ``sym_ite`` are, and together they compute the same integer for every float, negative ones included.
    TODO: upstream issue not found (torch/_export/serde/serialize.py ``_SYM_OPS`` has ``math.trunc``, no ``math.ceil``).
    """
    if node.op != "call_function" or node.target is not math.ceil or len(node.args) != 1 or node.kwargs:
        return False
    (x,) = node.args
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(value, torch.SymFloat):
        return False
    graph = gm.graph
    with graph.inserting_before(node):
        truncated = graph.call_function(math.trunc, (x,))
        truncated.meta["val"] = math.trunc(value)
        above = graph.call_function(operator.gt, (x, truncated))
        above.meta["val"] = value > truncated.meta["val"]
        plus_one = graph.call_function(operator.add, (truncated, 1))
        plus_one.meta["val"] = truncated.meta["val"] + 1
        replacement = graph.call_function(torch.sym_ite, (above, plus_one, truncated))
    replacement.meta.update(node.meta)
    node.replace_all_uses_with(replacement)
    return True


@register_fx_node_fix("dynamo")
def _fix_drop_set_grad_region_without_outputs(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Remove a ``wrap_with_set_grad_enabled`` region that returns nothing.

    Pattern: a ``torch.no_grad()`` block whose results the rest of the graph never reads (Mllama's rotary embedding,
    computed under ``@torch.no_grad()`` while every layer of a tiny config is a cross-attention layer that takes
    none). torch.export keeps the block as a higher-order op with an empty tuple output, ``torch.export.save``
    writes that node without its ``val``, and ``torch.export.load``'s verifier rejects the file ("Node.meta
    wrap_with_set_grad_enabled is missing val field"). A functional region with no outputs computes nothing the
    program returns, so the node, and then its subgraph, go. TODO: upstream issue not found.
    """
    if node.op != "call_function" or getattr(node.target, "__name__", "") != "wrap_with_set_grad_enabled":
        return False
    if node.users or node.meta.get("val", None) != ():
        return False
    body = node.args[1] if len(node.args) > 1 else None
    gm.graph.erase_node(node)
    if isinstance(body, torch.fx.Node) and body.op == "get_attr" and not body.users:
        target = body.target
        gm.graph.erase_node(body)
        if not any(n.op == "get_attr" and n.target == target for n in gm.graph.nodes):
            gm.delete_submodule(target)
    return True


#: node meta key marking a modulo this module already rewrote (the fixes may run over a graph twice)
_FLOORED = "engine.floored_mod"


@register_fx_node_fix("executorch")
def _fix_symbolic_mod_as_floored(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``a % b`` of symbolic sizes ``((a % b) + b) % b``.

    Pattern: a model pads a length to a multiple of a block, ``pad = (-length) % block`` (LongT5's local attention).
    Python's ``%`` is floored (the result takes the divisor's sign: ``-24 % 128 == 104``); the ExecuTorch runtime's
    ``executorch_prim::mod`` computes C's truncated remainder (``-24``), so LongT5's padded length came out 0, a
    block count of 0 followed, and dividing by it killed the process (SIGFPE). ``((a % b) + b) % b`` is the floored
    remainder under both rules, for every sign of ``a`` and ``b``. TODO: upstream issue not found
    (``kernels/prim_ops/register_prim_ops.cpp`` computes ``a.toInt() % b.toInt()``; its floordiv is floored).
    """
    if node.op != "call_function" or node.target is not operator.mod or node.meta.get(_FLOORED):
        return False
    a, b = node.args
    values = [x.meta.get("val") if isinstance(x, torch.fx.Node) else x for x in (a, b)]
    if not any(isinstance(v, torch.SymInt) for v in values) or not all(isinstance(v, (int, torch.SymInt)) for v in values):
        return False
    graph = gm.graph
    with graph.inserting_before(node):
        remainder = graph.call_function(operator.mod, (a, b))
        shifted = graph.call_function(operator.add, (remainder, b))
        floored = graph.call_function(operator.mod, (shifted, b))
    remainder.meta["val"] = values[0] % values[1]
    shifted.meta["val"] = remainder.meta["val"] + values[1]
    floored.meta.update(node.meta)
    for rewritten in (remainder, floored):
        rewritten.meta[_FLOORED] = True
    node.replace_all_uses_with(floored)
    return True


_CONSTANT_PADS = (torch.ops.aten.pad.default, torch.ops.aten.constant_pad_nd.default)


@register_fx_node_fix("executorch")
def _fix_negative_pad_as_slice(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make a constant pad with negative amounts a slice (the crop), then a pad by the positive amounts.

    Pattern: a model shifts a sequence by one step with ``nn.ZeroPad2d((0, 0, 1, -1))`` (RWKV's time shift): a
    negative pad crops that end, as torch allows. ExecuTorch's ``constant_pad_nd`` kernel rejects it ("Padding values
    must be non-negative", 0x12 at run time). A slice from ``-left`` to ``right`` (a negative end) crops the same
    rows. TODO: upstream issue not found (``kernels/portable/cpu/util/kernel_ops_util.cpp`` checks ``pad[i] >= 0``).
    """
    if node.op != "call_function" or node.target not in _CONSTANT_PADS:
        return False
    x, pad, *rest = node.args
    if node.target is torch.ops.aten.pad.default:
        mode = rest[0] if rest else node.kwargs.get("mode", "constant")
        value = rest[1] if len(rest) > 1 else node.kwargs.get("value")
        if mode != "constant":
            return False
    else:
        value = rest[0] if rest else node.kwargs.get("value", 0)
    value = 0.0 if value is None else value
    current_val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    fake_mode = getattr(current_val, "fake_mode", None)
    if fake_mode is None or not all(isinstance(p, int) for p in pad) or min(pad, default=0) >= 0:
        return False
    graph, current = gm.graph, x
    carried = {k: v for k, v in node.meta.items() if k != "val"}
    steps = []
    for i in range(len(pad) // 2):  # pad pairs run from the last dim backwards
        left, right = pad[2 * i], pad[2 * i + 1]
        if left < 0 or right < 0:
            dim = current_val.dim() - 1 - i
            steps.append((torch.ops.aten.slice.Tensor, (dim, max(-left, 0), right if right < 0 else torch.iinfo(torch.int64).max)))
    if any(p > 0 for p in pad):
        steps.append((torch.ops.aten.constant_pad_nd.default, ([max(p, 0) for p in pad], value)))
    with graph.inserting_before(node):
        for op, args in steps:
            current = graph.call_function(op, (current, *args))
            with fake_mode:
                current_val = op(current_val, *args)
            current.meta.update(carried)
            current.meta["val"] = current_val
    node.replace_all_uses_with(current)
    return True
