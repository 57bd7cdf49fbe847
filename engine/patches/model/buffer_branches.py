"""Python branches on a module's buffer values, traced with the values as Python numbers.

Pattern: EoMT's ``if self.training or self.attn_mask_probs[i] > 0:`` (models/eomt/modeling_eomt.py:1108): a
schedule kept in a buffer, read in Python control flow. torch.export lifts buffers to fake inputs, so the comparison
is a data-dependent guard. While a model is traced, a small 1-D buffer its forward only indexes (or takes the
``len()`` of) and compares in an ``if`` test is a tuple of its values; the program keeps them as constants, as it
keeps config values. Restored on exit.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import textwrap
from collections.abc import Iterator

import torch

from engine.patches.registry import register_trace_context

#: the most values a buffer read as Python numbers may hold (a per-layer schedule, not a tensor of data)
MAX_VALUES = 64


def _attribute_of_self(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


@functools.cache
def branch_buffers(forward) -> frozenset[str]:
    """Names ``n`` that ``forward``'s source compares as ``self.n[...]`` inside an ``if`` test, and otherwise only
    indexes or takes the ``len()`` of; empty where the source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(forward))))
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    compared, indexed, other = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            for part in ast.walk(node.test):
                if isinstance(part, ast.Compare):
                    for side in (part.left, *part.comparators):
                        if isinstance(side, ast.Subscript) and (name := _attribute_of_self(side.value)):
                            compared.add(name)
        if isinstance(node, ast.Subscript) and _attribute_of_self(node.value):
            indexed.add(id(node.value))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len"
                and len(node.args) == 1 and _attribute_of_self(node.args[0])):
            indexed.add(id(node.args[0]))  # len() of the tuple is the buffer's length
    for node in ast.walk(tree):
        if (name := _attribute_of_self(node)) and id(node) not in indexed:
            other.add(name)
    return frozenset(compared - other)


def _swappable(module: torch.nn.Module, name: str) -> bool:
    buffer = module._buffers.get(name)
    return isinstance(buffer, torch.Tensor) and buffer.dim() == 1 and buffer.numel() <= MAX_VALUES


@register_trace_context("dynamo")
@contextlib.contextmanager
def buffer_branches_as_python_numbers(model: torch.nn.Module) -> Iterator[list[str]]:
    """While inside, every buffer :func:`branch_buffers` finds in a module's forward is a tuple of Python numbers;
    yields ``"<module class>.<buffer>"`` for each; the buffers are registered again, in their order, on exit."""
    swapped: list[tuple[torch.nn.Module, str, torch.Tensor, list[str]]] = []
    try:
        for module in model.modules():
            names = [n for n in branch_buffers(type(module).forward) if _swappable(module, n)]
            for name in names:
                order = list(module._buffers)
                buffer = module._buffers.pop(name)
                swapped.append((module, name, buffer, order))
                object.__setattr__(module, name, tuple(buffer.tolist()))
        yield [f"{type(module).__name__}.{name}" for module, name, _, _ in swapped]
    finally:
        for module, name, buffer, order in reversed(swapped):
            module.__dict__.pop(name, None)
            buffers = dict(module._buffers)
            buffers[name] = buffer
            module._buffers.clear()
            module._buffers.update((n, buffers[n]) for n in order if n in buffers)
