"""Per-sample feature lists split by a ``.tolist()`` of counts, rewritten to one ragged output.

Pattern: Idefics2, Idefics3, SmolVLM, ModernVBert and UltraVBert end ``get_image_features`` with::

    [f.reshape(-1, f.shape[-1]) for f in image_features.split(num_real_images_per_batch.tolist())]

one tensor of rows per sample (the rows of that sample's images); GraniteDocling writes the same as
``sizes = (tiles_per_sample * tokens_per_tile).tolist()`` and ``torch.split(rows, sizes)``, Inkling2 as
``rows.split(image_grid_thw.prod(-1).tolist())``. Only functions whose callers concatenate the pieces again are
rewritten (a caller that iterates them per image would see one piece). ``tolist()`` of the per-sample counts is a
Python list as long as the batch, so torch.export pins the batch (``Eq(batch, 2)`` in the split). The comprehension
is the rows of every image in order, grouped per sample; :func:`rewrite_split_by_tolist` recompiles the function
with it replaced by :func:`split_rows_by_counts`, which returns those rows and the per-sample row counts as a
:class:`~engine.stacked_rows.RaggedRows` (to the model's code, ``[all rows]``, which its consumer
``torch.cat(..., dim=0)`` reads as before). The function is compiled from its own source, so only the matched
expression changes; a function without the pattern is returned as it is.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable

import torch

from engine.source_rewrite import recompiled
from engine.stacked_rows import RaggedRows

_HELPER = "__split_rows_by_counts__"
_RAGGED = "__ragged_rows__"


def split_rows_by_counts(features: torch.Tensor, counts: torch.Tensor) -> RaggedRows:
    """``[f.reshape(-1, f.shape[-1]) for f in features.split(counts.tolist())]`` as one ragged value: the rows of
    every item (``features`` flattened to its last dim) and each group's row count (``counts`` times the rows of
    one item)."""
    rows_per_item = math.prod(features.shape[1:-1])
    return RaggedRows(features.reshape(-1, features.shape[-1]), counts * rows_per_item)


def _is_minus_one(node: ast.AST) -> bool:
    return (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant) and node.operand.value == 1)


def _rows_of(elt: ast.AST, name: str) -> bool:
    """``elt`` is ``<name>.reshape(-1, <name>.shape[-1])``."""
    return (isinstance(elt, ast.Call) and isinstance(elt.func, ast.Attribute) and elt.func.attr == "reshape"
            and isinstance(elt.func.value, ast.Name) and elt.func.value.id == name and not elt.keywords
            and len(elt.args) == 2 and _is_minus_one(elt.args[0])
            and isinstance(elt.args[1], ast.Subscript) and _is_minus_one(elt.args[1].slice)
            and isinstance(elt.args[1].value, ast.Attribute) and elt.args[1].value.attr == "shape"
            and isinstance(elt.args[1].value.value, ast.Name) and elt.args[1].value.value.id == name)


def _tolist_of(node: ast.AST) -> ast.AST | None:
    """``Y`` where ``node`` is ``Y.tolist()``."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "tolist"
            and not node.args and not node.keywords):
        return node.func.value
    return None


def _helper_call(name: str, args: list[ast.AST], like: ast.AST) -> ast.Call:
    return ast.copy_location(ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=args, keywords=[]), like)


def _split_sizes(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """``(X, S)`` where ``node`` is ``torch.split(X, S)`` or ``X.split(S)``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "split"
            and not node.keywords):
        return None
    if isinstance(node.func.value, ast.Name) and node.func.value.id == "torch" and len(node.args) == 2:
        return node.args[0], node.args[1]
    if len(node.args) == 1:
        return node.func.value, node.args[0]
    return None


class _SplitByTolist(ast.NodeTransformer):
    """``[f.reshape(-1, f.shape[-1]) for f in X.split(Y.tolist())]`` -> ``__split_rows_by_counts__(X, Y)``;
    ``X.split(Y.tolist())`` (or ``torch.split``) -> ``__ragged_rows__(X, Y)``; and ``S = Y.tolist()`` used only as
    the sizes of ``torch.split(X, S)`` -> ``S = Y`` and ``__ragged_rows__(X, S)``."""

    def __init__(self):
        self.matched = 0
        self.sizes_names: set[str] = set()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        assigned = {stmt.targets[0].id for stmt in ast.walk(node) if isinstance(stmt, ast.Assign)
                    and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) and _tolist_of(stmt.value)}
        as_sizes = {id(split[1]) for call in ast.walk(node) if (split := _split_sizes(call))}
        uses: dict[str, list[ast.Name]] = {}
        for name in ast.walk(node):
            if isinstance(name, ast.Name) and name.id in assigned:
                uses.setdefault(name.id, []).append(name)
        # a name assigned once from .tolist() and read only as split sizes
        self.sizes_names = {n for n in assigned if sum(isinstance(u.ctx, ast.Store) for u in uses[n]) == 1
                            and all(isinstance(u.ctx, ast.Store) or id(u) in as_sizes for u in uses[n])}
        self.generic_visit(node)
        return node

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        self.generic_visit(node)
        counts = _tolist_of(node.value)
        if counts is not None and isinstance(node.targets[0], ast.Name) and node.targets[0].id in self.sizes_names:
            node.value = counts
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        split = _split_sizes(node)
        if split and isinstance(split[1], ast.Name) and split[1].id in self.sizes_names:
            counts = split[1]
        else:
            counts = _tolist_of(split[1]) if split else None  # inline: X.split(Y.tolist())
        if counts is not None:
            self.matched += 1
            return _helper_call(_RAGGED, [split[0], counts], node)
        return node

    def visit_ListComp(self, node: ast.ListComp) -> ast.AST:
        if len(node.generators) == 1:  # matched whole, before its inner split is visited
            gen = node.generators[0]
            split = _split_sizes(gen.iter)
            counts = _tolist_of(split[1]) if split else None
            if (counts is not None and not gen.ifs and not gen.is_async and isinstance(gen.target, ast.Name)
                    and _rows_of(node.elt, gen.target.id)):
                self.matched += 1
                return _helper_call(_HELPER, [split[0], counts], node)
        self.generic_visit(node)
        return node


def rewrite_split_by_tolist(fn: Callable) -> Callable:
    """``fn`` (a function or method, decorators included) recompiled from its source with every per-sample split
    by ``.tolist()`` replaced by :func:`split_rows_by_counts` or a :class:`RaggedRows` of the split tensor and its
    counts; ``fn`` itself where its source has none."""
    return recompiled(fn, _SplitByTolist(), {_HELPER: split_rows_by_counts, _RAGGED: RaggedRows})
