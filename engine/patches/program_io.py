"""The ``.pt2`` round trip (``torch.export.save`` / ``load``): what the serializer cannot write, and its repeated work.

Correctness: FX node fixes registered for ``"dynamo"``, run on every exported program (stage 3), so that the program
:class:`engine.DynamoExporter` returns can be saved and loaded. Speed: patches registered for ``"pt2"``, active only
inside :func:`engine.program_io.save_program` and :func:`engine.program_io.load_program`. ``torch.export.save`` prints
every symbolic size of every node's tensor metadata with ``sympy.srepr``, and ``torch.export.load`` parses each of those
strings back with ``sympy.sympify`` and rebuilds each node's fake tensor, though a graph holds only a few dozen distinct
size expressions, repeated on every node. The schema's type hints are also resolved again for every serialised dataclass
(pytorch/pytorch#196452). The speed patches compute each distinct value once per save or load; the loaded program is the
same (``tests/engine/test_program_io.py`` compares graphs, metadata and ranges)."""

from __future__ import annotations

import math
import operator
import types
import typing
from typing import Any

import torch

from engine.patches.registry import register_fx_node_fix, register_patch

_SERDE = "torch._export.serde.serialize"
_TORCH = {"torch": ">=2.11,<2.16"}
#: torch 2.15 changed _parse_sym_expr (it skips non-Symbol hints): the patch keeps 2.14's copy until ported
_TORCH_BEFORE_2_15 = {"torch": ">=2.11,<2.15"}


# ── Correctness: FX node fixes ──────────────────────────────────────────────────────────────────────────────
# Nodes torch.export.save cannot write or torch.export.load rejects.


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


# ── Correctness: load ───────────────────────────────────────────────────────────────────────────────────────


@register_patch("pt2", "torch.fx.experimental.symbolic_shapes._free_unbacked_symbols_with_path", requires=_TORCH)
def _patch_constant_unbacked_symbols_need_no_binding(original):
    """Pattern: a data-dependent size the program checks equal to a constant (``torch._check(n == 1)``; the
    sequence-classification heads' ``unique_consecutive(...).numel() == 1``). Its range is saved as ``[1, 1]``, so on
    load the shape env replaces the symbol by 1, the deserializer finds no node that binds it and refuses the program:
    "expected no unbacked symbols, got 1: {u0}". A symbol whose value is fixed needs no binding: after each binding
    pass, pending symbols the shape env pinned to one value are dropped (the runtime asserts still check the size).
    Reproduction in ``tests/engine/test_program_io.py``. TODO: upstream issue not found."""

    def free_unbacked_symbols_with_path(*args, **kwargs):
        found = original(*args, **kwargs)
        shape_env, pending = kwargs.get("shape_env"), kwargs.get("pending")
        if shape_env is not None and pending:
            for symbol in list(pending):
                bounds = shape_env.var_to_range.get(symbol)
                pinned = shape_env.replacements.get(symbol)
                if (bounds is not None and bounds.is_singleton()) or (pinned is not None and pinned.is_number):
                    pending.discard(symbol)
        return found

    return free_unbacked_symbols_with_path


# ── Speed: save ─────────────────────────────────────────────────────────────────────────────────────────────


@register_patch("pt2", f"{_SERDE}._print_sympy", requires=_TORCH)
def _patch_repeated_size_expression_print(original):
    """Pattern: ``_print_sympy(size)`` (``sympy.srepr``) called again for every tensor dim that has the same
    symbolic size. sympy expressions are immutable and compare structurally (a symbol's assumptions included),
    so equal expressions print the same; each distinct one is printed once per save.
    TODO(upstream): no pytorch issue found for this; torch.export.save could memoise it the same way."""
    printed: dict[Any, str] = {}

    def _print_sympy(s):
        expr = s.node.expr if isinstance(s, (torch.SymInt, torch.SymBool, torch.SymFloat)) else s
        if expr not in printed:
            printed[expr] = original(expr)
        return printed[expr]

    return _print_sympy


# ── Speed: load ─────────────────────────────────────────────────────────────────────────────────────────────


@register_patch("pt2", f"{_SERDE}.GraphModuleDeserializer._parse_sym_expr", requires=_TORCH_BEFORE_2_15)
def _patch_repeated_size_expression_parse(original):
    """Pattern: ``_parse_sym_expr(expr_str, hint)`` parsing the same size string again for every tensor dim that
    has it. Its effects on the deserializer (the symbol cache, the shape env's hint, range and traceback for the
    expression) are the same on every call with the same string and hint, and its result is the cached symbol
    for that expression; so each distinct ``(expr_str, hint)`` is parsed once per deserializer.
    Calls on sympy sub-expressions (its own recursion) go through unchanged.
    TODO(upstream): no pytorch issue found for this; torch.export.load could memoise it the same way."""

    def _parse_sym_expr(self, expr_str, hint=None):
        if not isinstance(expr_str, str):
            return original(self, expr_str, hint)
        parsed = self.__dict__.setdefault("_export_sweep_parsed", {})
        key = (expr_str, type(hint), hint)
        if key not in parsed:
            parsed[key] = original(self, expr_str, hint)
        return parsed[key]

    return _parse_sym_expr


class _TypingWithCachedSchemaHints(types.ModuleType):
    """``typing`` as seen by the serde module, with ``get_type_hints`` of the schema classes computed once."""

    def __init__(self, hints: dict[tuple, dict[str, Any]]):
        super().__init__("typing")
        # (not typing's own get_type_hints: an instance attribute would shadow the method below)
        self.__dict__.update({k: v for k, v in vars(typing).items()
                              if not k.startswith("__") and k != "get_type_hints"})
        self._hints = hints

    def get_type_hints(self, obj, globalns=None, localns=None, include_extras=False):
        key = (obj, id(globalns), id(localns), include_extras)
        if key not in self._hints:
            self._hints[key] = typing.get_type_hints(obj, globalns, localns, include_extras)
        return self._hints[key]


@register_patch("pt2", f"{_SERDE}.typing", requires=_TORCH)
def _patch_repeated_schema_type_hints(original):
    """Pattern: ``typing.get_type_hints(cls, globalns=vars(schema))`` in ``_dict_to_dataclass``, resolved again
    for every serialised node, argument and tensor meta though the schema has a few dozen classes.
    Upstream: https://github.com/pytorch/pytorch/issues/196452"""
    return _TypingWithCachedSchemaHints({})
