"""``save_program`` / ``load_program``: the ``.pt2`` round trip of an ``ExportedProgram``, without its repeated work.

``torch.export.save`` prints every symbolic size of every node's tensor metadata with ``sympy.srepr``, and
``torch.export.load`` parses each of those strings back with ``sympy.sympify`` and rebuilds each node's fake
tensor. A graph holds a few dozen distinct size expressions, repeated on every node: a tiny Qwen3-Next program
parses 3,648 of them, which is 28 of the 38 CPU seconds its load takes under cProfile. The schema's type hints
are also resolved again for every serialised dataclass (pytorch/pytorch#196452). The patches below, active
only inside these two functions, compute each distinct value once per save or load; the loaded program is the
same (``tests/engine/test_program_io.py`` compares graphs, metadata and ranges).
"""

from __future__ import annotations

import os
import types
import typing
from typing import Any

import torch

from engine.exporter_dynamo import fake_dispatch_cache_off_while_tracing, restore_fake_dispatch_cache
from engine.patches import apply_patches, register_patch

_SERDE = "torch._export.serde.serialize"
_TORCH = {"torch": ">=2.11,<2.15"}


def save_program(program: torch.export.ExportedProgram, path: str | os.PathLike) -> str:
    """``torch.export.save(program, path)``; returns the path."""
    with apply_patches("pt2"):
        torch.export.save(program, path)
    return str(path)


def load_program(path: str | os.PathLike) -> torch.export.ExportedProgram:
    """``torch.export.load(path)``, with the fake-tensor dispatch cache off while the node metadata is rebuilt
    (each node is a new op on new shapes, so every lookup misses: see ``engine.exporter_dynamo``)."""
    with apply_patches("pt2"), fake_dispatch_cache_off_while_tracing():
        program = torch.export.load(path)
    restore_fake_dispatch_cache(program)
    return program


# ── Save ─────────────────────────────────────────────────────────────────────────────────────────────


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


# ── Load ─────────────────────────────────────────────────────────────────────────────────────────────


@register_patch("pt2", f"{_SERDE}.GraphModuleDeserializer._parse_sym_expr", requires=_TORCH)
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
        self.__dict__.update({k: v for k, v in vars(typing).items() if not k.startswith("__")})
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
