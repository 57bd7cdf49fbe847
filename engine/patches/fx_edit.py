"""The FX-editing kit of the node fixes: new nodes that carry their own fake values, sizes as nodes, replacements.

A node fix rewrites one node of a traced program in place; the nodes it adds must carry a ``val`` (the later
passes, the ONNX translation and ExecuTorch's memory planning, read it), computed here in the program's fake mode.
"""

from __future__ import annotations

import contextlib

import torch


def fake_value(argument):
    """An FX argument with each node replaced by its fake ``val`` (lists and tuples of nodes included)."""
    if isinstance(argument, torch.fx.Node):
        return argument.meta["val"]
    if isinstance(argument, (list, tuple)):
        return type(argument)(fake_value(a) for a in argument)
    return argument


def insert_node(gm: torch.fx.GraphModule, like: torch.fx.Node, target, *args, **kwargs) -> torch.fx.Node:
    """A new ``target(*args, **kwargs)`` node before ``like`` with ``like``'s meta and its own ``val`` (run on
    the arguments' fake values, in the fake mode of ``like``'s, or of the arguments' where ``like`` has none)."""
    from torch._guards import detect_fake_mode

    with gm.graph.inserting_before(like):
        new = gm.graph.call_function(target, args, kwargs)
    new.meta.update(like.meta)
    values, keywords = fake_value(list(args)), {k: fake_value(v) for k, v in kwargs.items()}
    fake_mode = getattr(like.meta.get("val"), "fake_mode", None) or detect_fake_mode(values)
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        new.meta["val"] = target(*values, **keywords)
    return new


def size_node(gm: torch.fx.GraphModule, like: torch.fx.Node, expr) -> torch.fx.Node | int | None:
    """A node (before ``like``) computing ``expr``, an integer expression of the inputs' sizes, from ``sym_size``
    of the placeholders holding them; None where a symbol is no input dim or ``expr`` has other operations."""
    import operator

    import sympy
    from torch.utils._sympy.functions import FloorDiv

    dims = {}
    for placeholder in gm.graph.find_nodes(op="placeholder"):
        pval = placeholder.meta.get("val")
        for d, dim in enumerate(pval.shape if isinstance(pval, torch.Tensor) else ()):
            if isinstance(dim, torch.SymInt) and dim.node.expr.is_symbol:
                dims.setdefault(dim.node.expr, (placeholder, d))

    def build(e):
        if isinstance(e, sympy.Integer):
            return int(e)
        if isinstance(e, sympy.Symbol):
            if e not in dims:
                raise LookupError(e)
            return insert_node(gm, like, torch.ops.aten.sym_size.int, *dims[e])
        ops = {sympy.Add: operator.add, sympy.Mul: operator.mul, FloorDiv: operator.floordiv}
        op = next((f for t, f in ops.items() if isinstance(e, t)), None)
        if op is None:
            raise LookupError(e)
        args = [build(a) for a in e.args]
        out = args[0]
        for arg in args[1:]:
            if isinstance(out, int) and isinstance(arg, int):
                out = op(out, arg)
            else:
                out = insert_node(gm, like, op, out, arg)
        return out

    try:
        return build(expr)
    except LookupError:
        return None


def replace_node(gm: torch.fx.GraphModule, node: torch.fx.Node, target, args, kwargs) -> bool:
    """Put a call of ``target`` where ``node`` is (same outputs, so same ``meta``) and drop ``node``."""
    with gm.graph.inserting_before(node):
        replacement = gm.graph.call_function(target, tuple(args), kwargs)
    replacement.meta.update(node.meta)
    node.replace_all_uses_with(replacement)
    gm.graph.erase_node(node)
    return True
