"""Multimodal merges whose placeholder checks read data, rewritten to keep the write and drop the guard.

Pattern: ``if mask.any(): embeds[mask] = features`` and ``mask.size()[...].numel()`` placeholder counts: a Python
``bool``/``int`` of a tensor, a data-dependent guard torch.export cannot trace; a count check that raises in Python
becomes a runtime assert. Each function is recompiled from its own source (:mod:`engine.patches.source_rewrite`)
with only the matched expression changed.
"""

from __future__ import annotations

import ast
import math

import torch

from engine.patches.registry import register_patch
from engine.patches.source_rewrite import recompiled


class _MaskedWriteWithoutItsEmptinessTest(ast.NodeTransformer):
    """``if mask.any(): x[mask] = value`` -> ``x[mask] = value``: the ``if`` holds exactly one write through the
    boolean mask it tests (a subscript assignment indexed by ``mask``, or ``x.masked_fill_(mask, value)``)."""

    matched = 0

    def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt]:
        self.generic_visit(node)
        test = node.test
        if not (isinstance(test, ast.Call) and not test.args and not test.keywords
                and isinstance(test.func, ast.Attribute) and test.func.attr == "any" and not node.orelse
                and len(node.body) == 1):
            return node
        mask = ast.dump(test.func.value)
        (stmt,) = node.body
        writes = (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript)
                  and ast.dump(stmt.targets[0].slice) == mask)
        fills = (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                 and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "masked_fill_"
                 and stmt.value.args and ast.dump(stmt.value.args[0]) == mask)
        if not (writes or fills):
            return node
        self.matched += 1
        return node.body


@register_patch("dynamo", "transformers.models.ovis2.modeling_ovis2.Ovis2Model.forward")
def _patch_masked_write_without_its_emptiness_test(original):
    """Pattern: a write through a boolean mask behind a test that the mask selects anything, ``if mask.any():
    inputs_embeds[mask] = visual_indicator_features[i]`` (Ovis2's visual-indicator embeddings). The test is a
    Python ``bool`` of a tensor, a data-dependent guard torch.export cannot trace (``Eq(u1, 1)``), and it guards
    nothing: a write through an empty mask writes nothing. The function is recompiled without the ``if``
    (:class:`_MaskedWriteWithoutItsEmptinessTest`, :mod:`engine.patches.source_rewrite`); the write is kept as written.
    No upstream issue found; TODO (transformers): drop the test."""
    return recompiled(original, _MaskedWriteWithoutItsEmptinessTest())


class _SizeNumelAsProduct(ast.NodeTransformer):
    """``<tensor>.size()[...].numel()`` / ``<tensor>.shape[...].numel()`` -> ``__prod__(<the same sizes>)``."""

    matched = 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "numel" and not node.args and not node.keywords
                and isinstance(func.value, ast.Subscript)):
            return node
        sizes = func.value.value
        if not ((isinstance(sizes, ast.Call) and isinstance(sizes.func, ast.Attribute) and sizes.func.attr == "size"
                 and not sizes.args) or (isinstance(sizes, ast.Attribute) and sizes.attr == "shape")):
            return node
        self.matched += 1
        return ast.copy_location(ast.Call(func=ast.Name(id="__prod__", ctx=ast.Load()), args=[func.value], keywords=[]),
                                 node)


@register_patch("dynamo", "transformers.models.perception_lm.modeling_perception_lm.PerceptionLMModel.get_placeholder_mask")
def _patch_size_numel_as_a_symbolic_product(original):
    """Pattern: ``image_features.size()[:-1].numel()`` in a placeholder check's message (PerceptionLM).
    ``torch.Size.numel()`` reads each size as a Python ``int``, which pins every symbolic size of the slice to its
    traced value (``Eq(batch, 2)``), so the program accepts only the traced image count (the message is built even when
    the check passes). The function is recompiled with the count as ``math.prod`` of the sizes (a symbolic product, the
    same number in eager; :class:`_SizeNumelAsProduct`). No upstream issue found; TODO (transformers):
    ``image_features.shape[0]`` in the message, as the other placeholder checks write it."""
    return recompiled(original, _SizeNumelAsProduct(), {"__prod__": math.prod})


def check_unless(failed, error) -> None:
    """``torch._check`` that ``failed`` is false, raising ``error()``'s message: a SymBool of data-dependent counts
    becomes a runtime assert of the program instead of a guard."""
    torch._check(torch.sym_not(failed), lambda: str(error()))


class _RaiseOnCountMismatchAsCheck(ast.NodeTransformer):
    """``if <comparison>: raise E(msg)`` -> ``__check_unless__(<comparison>, lambda: E(msg))``: an ``if`` without
    ``else`` whose only statement raises, tested by a comparison (alone, or the last operand of an ``and``)."""

    matched = 0

    def visit_If(self, node: ast.If) -> ast.AST:
        self.generic_visit(node)
        test = node.test
        last = test.values[-1] if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else test
        if node.orelse or len(node.body) != 1 or not isinstance(node.body[0], ast.Raise) or node.body[0].exc is None \
                or not isinstance(last, ast.Compare):
            return node
        self.matched += 1
        error = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
                           body=node.body[0].exc)
        call = ast.Call(func=ast.Name(id="__check_unless__", ctx=ast.Load()), args=[test, error], keywords=[])
        return ast.copy_location(ast.Expr(value=call), node)


@register_patch("dynamo", "transformers.models.hunyuan_vl.modeling_hunyuan_vl.HunYuanVLModel.get_placeholder_mask",
                "transformers.models.qwen2_5_omni.modeling_qwen2_5_omni.Qwen2_5OmniThinkerModel.get_audio_features")
def _patch_count_check_as_runtime_assert(original):
    """Pattern: a count check that raises in Python, ``if image_features is not None and
    inputs_embeds[mask].numel() != image_features.numel(): raise ValueError(...)`` (HunYuan-VL's placeholders;
    Qwen2.5-Omni's audio length against ``sum(lengths.tolist())``): the counts are data-dependent, so the ``if``
    guards ``Ne(u18, 32*u16 + 32*u17)`` (GuardOnDataDependentSymNode). Rewrite: the same test as ``torch._check`` of its negation, a runtime
    assert of the program (torch words its message) (:class:`_RaiseOnCountMismatchAsCheck`); eager is unchanged. No
    upstream issue found; TODO (transformers): ``torch_compilable_check``, as the other placeholder checks use."""
    return recompiled(original, _RaiseOnCountMismatchAsCheck(), {"__check_unless__": check_unless})
