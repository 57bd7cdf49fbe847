"""torch.export patterns: what torch.export records that no backend's lowering takes, and its internals' speed.

The model patches (model code torch.export cannot trace) are in :mod:`engine.patches.model`; the fixes for what
``torch.export.save`` cannot write in :mod:`engine.patches.program_io`.
"""

from __future__ import annotations

import torch

from engine.patches.registry import register_fx_node_fix, register_patch


# ── Correctness: FX node fixes ──────────────────────────────────────────────────────────────────────────────
# Ops torch.export records that neither torchlib nor ExecuTorch's edge dialect takes.


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


def _call(gm: torch.fx.GraphModule, like: torch.fx.Node, target, *args) -> torch.fx.Node:
    """A new ``target(*args)`` node before ``like`` with ``like``'s meta and its own ``val`` (run on the
    arguments' fake values)."""
    with gm.graph.inserting_before(like):
        new = gm.graph.call_function(target, args)
    new.meta.update(like.meta)
    new.meta["val"] = target(*(a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args))
    return new


@register_fx_node_fix("onnx")
@register_fx_node_fix("executorch")
def _fix_searchsorted_as_comparison_count(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``torch.searchsorted(sorted, values)`` and ``torch.bucketize(values, boundaries)`` a count of the
    sorted entries below each value: ``(sorted < value).sum(-1)`` (``<=`` for ``right=True``).

    Pattern: vision embeddings that bucket fractional patch coordinates (Idefics2/3, SmolVLM, Aria:
    ``torch.bucketize(coords, boundaries, right=True)``), audio timestamps (MusicFlamingo) and question positions
    (Splinter: ``torch.searchsorted``). torchlib has no translation for ``aten.searchsorted``
    (https://github.com/pytorch/pytorch/issues/151648), and neither op is Core ATen, so ExecuTorch's edge verifier
    rejects both (https://github.com/pytorch/executorch/issues/20270). For a sorted sequence, the insertion
    index is by definition the number of entries ``<`` the value (left) or ``<=`` it (right): the same integers
    from a comparison and a sum, ops every backend has, at ``len(sorted)`` times the memory of the values.
    A ``sorter`` is applied first (a gather). NaN values count 0 entries below them where torch puts them last.
    """
    if node.op != "call_function" or node.target not in (torch.ops.aten.searchsorted.Tensor, torch.ops.aten.bucketize.Tensor):
        return False
    names = [a.name for a in node.target._schema.arguments]
    bound = dict(zip(names, node.args)) | dict(node.kwargs)
    if node.target is torch.ops.aten.bucketize.Tensor:
        sequence, values = bound["boundaries"], bound["self"]
    else:
        sequence, values = bound["sorted_sequence"], bound["self"]
    right = bool(bound.get("right", False)) or bound.get("side") == "right"
    if bound.get("sorter") is not None:
        sequence = _call(gm, node, torch.ops.aten.gather.default, sequence, -1, bound["sorter"])
    if sequence.meta["val"].dim() > 1:  # one sorted row per leading index: (..., 1, M) against (..., K, 1)
        sequence = _call(gm, node, torch.ops.aten.unsqueeze.default, sequence, -2)
    column = _call(gm, node, torch.ops.aten.unsqueeze.default, values, -1)
    below = _call(gm, node, torch.ops.aten.le.Tensor if right else torch.ops.aten.lt.Tensor, sequence, column)
    dtype = torch.int32 if bound.get("out_int32", False) else torch.int64
    # the node becomes the count in place: it keeps its name, which the program's output specs may refer to
    node.target, node.args, node.kwargs = torch.ops.aten.sum.dim_IntList, (below, [-1]), {"dtype": dtype}
    return True


# ── Speed: torch.export internals ───────────────────────────────────────────────────────────────────────────
# Called by every retrace of the program while ExecuTorch lowers it.


# ── Speed: torch.export internals ───────────────────────────────────────────────────────────────────────────
# Called by every retrace of the program while lowering.


@register_patch("executorch", "torch.export.exported_program._convert_guards_to_code", requires={"torch": ">=2.11,<2.15"})
def _patch_guards_printed_once_per_shape_env(original):
    """Pattern: every ``ExportedProgram`` constructor prints all the guards of its shape env as Python source
    (``_convert_guards_to_code``, a sympy printer per guard). Lowering builds a new ExportedProgram after most
    passes and for every delegated partition, all over one shape env whose guard list only grows, so the same
    guards are printed again and again: a tiny Mamba2 (many guards from its chunk padding) built 117 programs and
    spent 19 of its 158 profiled CPU s printing.

    This keeps each guard's text on the shape env and prints only new guards. A guard's text depends on its
    expression and on the first source of each of its symbols, neither of which changes, and the original's two
    filters (symbols that all have non-constant sources; no guard on ``L['self']``) run every time, so the list is
    the one the original returns (``.pte`` bytes unchanged: ``bench/bench_executorch.py --check-identical``).
    TODO(upstream): no torch issue found; the constructor could print lazily, as few callers read ``_guards_code``.
    """
    from torch._dynamo.source import ConstantSource
    from torch.export.exported_program import _get_shape_env
    from torch.fx.experimental.symbolic_shapes import ShapeGuardPythonPrinter

    def convert_guards_to_code(graph_module):
        shape_env = _get_shape_env(graph_module)
        if shape_env is None:
            return []
        local_vars = {var for var, sources in shape_env.var_to_sources.items()
                      if all(not isinstance(source, ConstantSource) for source in sources)}
        printed = shape_env.__dict__.setdefault("_export_sweep_guard_code", {})  # id(guard) -> (guard, text)
        printer = None
        code = []
        for guard in shape_env.guards:
            if not guard.expr.free_symbols.issubset(local_vars):
                continue
            known = printed.get(id(guard))
            if known is None or known[0] is not guard:
                if printer is None:
                    printer = ShapeGuardPythonPrinter(shape_env.var_to_sources, lambda s: s.name,
                                                      shape_env.var_to_sources)
                known = printed[id(guard)] = (guard, printer.doprint(guard.expr))
            code.append(known[1])
        return [text for text in code if "L['self']" not in text]

    return convert_guards_to_code
