"""A function recompiled from its own source through an AST rewrite: model code patched where one statement or
call is the problem, the rest of the function kept as its authors wrote it."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Mapping
from typing import Any


def recompiled(fn: Callable, transformer: ast.NodeTransformer, helpers: Mapping[str, Any] | None = None) -> Callable:
    """``fn`` (a function or method, decorators included) recompiled from its source through ``transformer``, in
    its module's live globals, with its file and line numbers kept for tracebacks; ``helpers`` are bound as closure
    variables (``def __make__(<helpers>): <fn's def>; return <fn>``), so nothing is added to the module. ``fn``
    itself where the transformer matched nothing (its ``matched`` count) or ``fn`` is a closure (``super()``), which
    a recompiled copy could not rebind."""
    raw = inspect.unwrap(fn)
    try:
        lines, first = inspect.getsourcelines(raw)
    except (OSError, TypeError):
        return fn
    tree = transformer.visit(ast.parse(textwrap.dedent("".join(lines))))
    if not getattr(transformer, "matched", 0) or raw.__code__.co_freevars:
        return fn
    func = tree.body[0]
    names = list(helpers or {})
    maker = ast.FunctionDef(
        name="__make__", args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in names], kwonlyargs=[],
                                            kw_defaults=[], defaults=[]),
        body=[func, ast.Return(value=ast.Name(id=func.name, ctx=ast.Load()))], decorator_list=[], returns=None,
        type_params=[])
    module = ast.fix_missing_locations(ast.Module(body=[maker], type_ignores=[]))
    ast.increment_lineno(module, first - 1)  # tracebacks point into the model's own file
    namespace: dict = {}
    exec(compile(module, inspect.getsourcefile(raw) or "<rewritten>", "exec"), raw.__globals__, namespace)  # noqa: S102
    return namespace["__make__"](*(helpers or {}).values())
