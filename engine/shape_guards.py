"""Guards a trace put on input sizes: recorded in every artifact and checked before it runs.

torch.export keeps what the model's code assumed about the traced sizes as guards over the dynamic dims (a Mamba2
traced at 7 tokens, shorter than its chunk of 8, computes one chunk: ``(s + (8 - s % 8) % 8) // 8 == 1``). An
``ExportedProgram`` checks them when called; an ONNX model or a ``.pte`` does not, and a size that breaks one
reaches a kernel with shapes it was not built for (onnxruntime: an invalid ``Expand``; ExecuTorch: error 0x12 or a
native crash). So the exporters record the guards (as Python expressions over the input dims) in the artifact's
metadata, :func:`check` rejects sizes that break one with an :class:`InputError` naming it, and
:func:`warn_for_program` tells at export which dims the guards restrict within their bounds. :func:`probe_plan`,
:func:`rejected_probes` and :func:`grow_dim` let the exporter retrace where they do (``DynamoExporter.trace``, 2a).

The recorded expressions are evaluated by a whitelist of integer arithmetic and comparisons (:func:`_evaluate`),
never by ``eval``: an artifact is data.
"""

from __future__ import annotations

import ast
import functools
import operator
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from engine.fake_mode import program_shape_env

#: how many guards a warning quotes
QUOTED = 2


class ShapeGuardWarning(UserWarning):
    """The trace's guards reject sizes of a dynamic dim within its bounds: the artifact runs only where they hold."""


def _simple_bound(expr: Any) -> bool:
    """``s >= 4``, ``s <= 8``, ``Ne(s, 1)``: one symbol against a number, which the per-dim bounds already state."""
    import sympy

    if not isinstance(expr, sympy.core.relational.Relational) or len(expr.free_symbols) != 1:
        return False
    sides = (expr.lhs, expr.rhs)
    return any(side.is_Symbol for side in sides) and any(side.is_number for side in sides)


#: ``graph_module.meta`` key under which :func:`program_guards` keeps a program's record (computed once per export)
META_KEY = "export_sweep.shape_guards"


def program_guards(program: torch.export.ExportedProgram) -> dict:
    """:func:`input_guards` of ``program``, computed once: the trace's warning and the exporter's metadata share it."""
    meta = program.graph_module.meta
    if META_KEY not in meta:
        meta[META_KEY] = input_guards(program)
    return meta[META_KEY]


def input_guards(program: torch.export.ExportedProgram) -> dict:
    """``{"guards": [python expression, ...], "dims": {symbol: [leaf name, dim]}}`` for ``program``'s guards over
    its input dims (named as :func:`engine.input_checks.program_input_names` names the inputs); guards over other
    symbols (data-dependent sizes) and plain per-dim bounds are left out."""
    from torch.utils._sympy.printers import PythonPrinter

    shape_env = program_shape_env(program)
    dims = input_dims(program) if shape_env is not None else None
    if dims is None:  # no shape env, or inputs that cannot be named: no guard can be checked by name
        return {"guards": [], "dims": {}}
    printer, guards = PythonPrinter(), []
    for guard in shape_env.guards:
        expr = guard.expr
        if not expr.free_symbols or not {str(s) for s in expr.free_symbols} <= dims.keys() or _simple_bound(expr):
            continue
        code = printer.doprint(expr)
        if code not in guards and _parse(code) is not None:
            guards.append(code)
    return {"guards": guards, "dims": dims}


def input_dims(program: torch.export.ExportedProgram) -> dict[str, list] | None:
    """``{symbol: [leaf name, dim]}``: the first input dim of ``program`` that each of its size symbols stands for;
    None when the inputs cannot be named."""
    from engine.input_checks import named_user_inputs

    named = named_user_inputs(program)
    if named is None:
        return None
    dims: dict[str, list] = {}
    for name, val in named:
        for d, size in enumerate(getattr(val, "shape", ())):
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                dims.setdefault(str(size.node.expr), [name, d])
    return dims


def size_of(code: str, sizes: Mapping[str, int]) -> int:
    """The integer a recorded size expression (``s2 // 3200``) comes to at ``sizes`` (symbol -> size); ValueError
    when it is not integer arithmetic over them."""
    tree = _parse(code)
    if tree is None:
        raise ValueError(f"not a size expression: {code!r}")
    try:
        return int(_evaluate(tree, sizes))
    except KeyError as e:
        raise ValueError(f"size expression {code!r} names {e}, which no input dim gives") from None


def dim_sizes(dims: Mapping[str, list], given: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """``{symbol: size}`` read from the given leaves, for the symbols of a ``{symbol: [leaf, dim]}`` record."""
    return {sym: int(given[name].shape[d]) for sym, (name, d) in dims.items()
            if name in given and isinstance(given[name], torch.Tensor) and given[name].ndim > d}


# ── Evaluating a recorded guard ───────────────────────────────────────────────────────────────────────

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod, ast.Pow: operator.pow}
_CALLS = {"max": max, "min": min}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}


@functools.lru_cache(maxsize=4096)
def _parse(code: str) -> ast.Expression | None:
    """``code`` parsed, if it is integer arithmetic and comparisons only (cached: guards are evaluated at many sizes)."""
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError:
        return None
    allowed = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.UnaryOp, ast.USub, ast.Not, ast.Compare,
               ast.Constant, ast.Name, ast.Load, ast.Call, *_BINARY, *_COMPARE)
    if not all(isinstance(node, allowed) for node in ast.walk(tree)):
        return None
    if any(isinstance(node, ast.Call) and (node.keywords or not isinstance(node.func, ast.Name) or node.func.id not in _CALLS)
           for node in ast.walk(tree)):
        return None
    if any(isinstance(node, ast.Constant) and type(node.value) not in (int, bool) for node in ast.walk(tree)):
        return None
    return tree


def _evaluate(node: ast.AST, sizes: Mapping[str, int]) -> int | bool:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, sizes)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return sizes[node.id]
    if isinstance(node, ast.Call):  # max / min of sizes (a stride of a dim that may be 0)
        return _CALLS[node.func.id](_evaluate(a, sizes) for a in node.args)
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, sizes)
        return -value if isinstance(node.op, ast.USub) else not value
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_evaluate(node.left, sizes), _evaluate(node.right, sizes))
    if isinstance(node, ast.BoolOp):
        values = (_evaluate(v, sizes) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, sizes)
        for op, comparator in zip(node.ops, node.comparators):
            right = _evaluate(comparator, sizes)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    raise ValueError(f"not a size expression: {ast.dump(node)}")


def holds(code: str, sizes: Mapping[str, int]) -> bool | None:
    """Whether the guard ``code`` holds at ``sizes`` (symbol -> size); None when it cannot be evaluated."""
    tree = _parse(code)
    if tree is None:
        return None
    try:
        return bool(_evaluate(tree, sizes))
    except (KeyError, ValueError, ZeroDivisionError, ArithmeticError):
        return None


_NAME = re.compile(r"\b[A-Za-z_]\w*\b")


def _named(code: str, dims: Mapping[str, list]) -> str:
    return _NAME.sub(lambda m: f"({dims[m.group()][0]} dim {dims[m.group()][1]})" if m.group() in dims else m.group(),
                     code)


def check(label: str, record: Mapping[str, Any] | None, given: Mapping[str, torch.Tensor]) -> None:
    """:class:`InputError` when the given leaves' sizes break one of ``record``'s guards (see :func:`input_guards`)."""
    from engine.errors import InputError

    if not record or not record.get("guards"):
        return
    dims = record.get("dims", {})
    sizes = dim_sizes(dims, given)
    for code in record["guards"]:
        if holds(code, sizes) is False:
            used = set(_NAME.findall(code))
            shown = ", ".join(f"{name} dim {d} = {sizes[sym]}" for sym, (name, d) in dims.items()
                              if sym in sizes and sym in used)
            raise InputError(f"{label}: the inputs break a guard the trace took from the model's code at the traced "
                             f"sizes: {_named(code, dims)} is false for {shown}; export with these sizes (or trace "
                             "at sizes where the model takes the general path) to run them")


def _leaf_sizes(program: torch.export.ExportedProgram, record: Mapping[str, Any]) -> tuple[dict, dict]:
    """``({(leaf, dim): traced size}, {(leaf, dim): upper bound or None})`` of the dims ``record`` names."""
    from torch.utils._sympy.numbers import IntInfinity

    traced, upper = {}, {}
    for node in program.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        for size in getattr(val, "shape", ()) if isinstance(val, torch.Tensor) else ():
            sym = str(size.node.expr) if isinstance(size, torch.SymInt) else None
            if sym in record["dims"] and size.node.hint is not None:
                leaf = tuple(record["dims"][sym])
                traced[leaf] = int(size.node.hint)
                vr = program.range_constraints.get(size.node.expr)
                upper[leaf] = None if vr is None or isinstance(vr.upper, IntInfinity) else int(vr.upper)
    return traced, upper


def probe_plan(program: torch.export.ExportedProgram) -> tuple[dict, dict]:
    """``(traced, probes)``: each guarded dim's traced size, keyed ``(leaf, dim)``, and the larger sizes within its
    bounds that :func:`rejected_probes` tries (the next :data:`NEXT_SIZES` sizes, twice and three times traced)."""
    traced, upper = _leaf_sizes(program, program_guards(program))
    probes = {leaf: [c for c in sorted({*range(size + 1, size + NEXT_SIZES + 1), 2 * size, 3 * size})
                     if upper[leaf] is None or c <= upper[leaf]] for leaf, size in traced.items()}
    return traced, probes


#: how many sizes above the traced one :func:`probe_plan` tries one by one
NEXT_SIZES = 16

#: ``graph_module.meta`` key under which :func:`restrictions` keeps a program's probes (computed once per program)
RESTRICTIONS_KEY = "export_sweep.restrictions"


def restrictions(program: torch.export.ExportedProgram) -> tuple[dict, dict, dict]:
    """``(traced, probes, rejected)`` of :func:`probe_plan` and :func:`rejected_probes` for ``program``'s own guards,
    computed once: the exporter's retrace (2a) and the warning (2h) share them."""
    meta = program.graph_module.meta
    if RESTRICTIONS_KEY not in meta:
        traced, probes = probe_plan(program)
        meta[RESTRICTIONS_KEY] = traced, probes, rejected_probes(program_guards(program), traced, probes)
    return meta[RESTRICTIONS_KEY]


def tied_leaves(record: Mapping[str, Any], traced: Mapping[tuple, int]) -> dict[tuple, list[tuple]]:
    """``{(leaf, dim): [(leaf, dim), ...]}``: the dims that move together, those of one traced size that a guard
    relates (``input_ids`` dim 1 <= ``attention_mask`` dim 1: separate symbols of inputs meant to match)."""
    leaf_of = {sym: tuple(where) for sym, where in record["dims"].items()}
    group = {leaf: {leaf} for leaf in traced}
    for code in record["guards"]:
        used = [leaf_of[name] for name in dict.fromkeys(_NAME.findall(code)) if name in leaf_of]
        for a, b in zip(used, used[1:]):
            if a in traced and b in traced and traced[a] == traced[b] and group[a] is not group[b]:
                merged = group[a] | group[b]
                for leaf in merged:
                    group[leaf] = merged
    order = list(traced)
    return {leaf: sorted(group[leaf], key=order.index) for leaf in traced}


def _at_traced(record: Mapping[str, Any], traced: Mapping[tuple, int]) -> dict[str, int]:
    """``record``'s symbols at their traced sizes (``traced`` keyed ``(leaf, dim)``)."""
    return {sym: traced[tuple(where)] for sym, where in record["dims"].items() if tuple(where) in traced}


def _sizes_moving(record: Mapping[str, Any], traced: Mapping[tuple, int]) -> Callable[[tuple, int], dict | None]:
    """``at(leaf, size)``: ``record``'s symbols at their traced sizes, ``leaf`` and its :func:`tied_leaves` at ``size``
    (None for a leaf ``record`` does not name)."""
    sym_of = {tuple(where): sym for sym, where in record["dims"].items()}
    base = _at_traced(record, traced)
    ties = tied_leaves(record, {leaf: size for leaf, size in traced.items() if leaf in sym_of})

    def at(leaf: tuple, size: int) -> dict | None:
        moved = [sym_of[tied] for tied in ties.get(leaf, ())]
        return {**base, **dict.fromkeys(moved, size)} if moved else None

    return at


def _broken(record: Mapping[str, Any], sizes: Mapping[str, int]) -> list[str]:
    """The guards of ``record`` that are false at ``sizes`` (those that cannot be evaluated are not counted)."""
    return [code for code in record["guards"] if holds(code, sizes) is False]


def rejected_probes(record: Mapping[str, Any], traced: Mapping[tuple, int],
                    probes: Mapping[tuple, list[int]]) -> dict[tuple, list[tuple[int, str]]]:
    """``{(leaf, dim): [(size, guard broken), ...]}``: the probed sizes (each dim with its :func:`tied_leaves`, the
    others at ``traced``) that ``record``'s guards reject. Keyed by input leaf, so programs traced at other
    samples compare."""
    at = _sizes_moving(record, traced)
    found: dict[tuple, list[tuple[int, str]]] = {}
    for leaf, sizes in probes.items():
        for size in sizes:
            point = at(leaf, size)
            if point is None:  # a dim the record does not name: no guard of it to break
                break
            broken = _broken(record, point)
            if broken:
                found.setdefault(leaf, []).append((size, broken[0]))
    return found


def accepts(record: Mapping[str, Any], traced: Mapping[tuple, int]) -> bool:
    """Whether ``record``'s guards hold at the sizes ``traced`` (keyed ``(leaf, dim)``)."""
    return not _broken(record, _at_traced(record, traced))


def _compares_a_unit_size(code: str, remainders: bool) -> bool:
    """Whether guard ``code`` compares a size expression with 0 or 1 (a remainder only with ``remainders``)."""
    tree = _parse(code).body
    if not isinstance(tree, ast.Compare):
        return False
    sides = (tree.left, *tree.comparators)
    if not remainders and any(isinstance(side, ast.BinOp) and isinstance(side.op, ast.Mod) for side in sides):
        return False
    return any(isinstance(side, ast.Constant) and side.value in (0, 1) for side in sides)


def pins_a_unit_size(record: Mapping[str, Any], traced: Mapping[tuple, int], leaf: tuple, size: int, *,
                     only: bool = False) -> bool:
    """Whether a guard broken at ``leaf`` = ``size`` compares a size expression with 0 or 1 (``(s + pad) // 8 == 1``:
    one chunk): the 0/1 specialisation of a derived size, which a size-oblivious or a bigger trace can avoid, as
    opposed to a size the model needs (AST's patch count ``== 62``, set by its position embeddings).
    ``only``: every broken guard is one, and none compares a remainder (``(8 - s % 8) % 8 > 0``: Mamba2 and
    Florence-2 pad only where a size is not a multiple): else a trace at ``size`` takes the other side of a branch,
    and its program refuses the sample."""
    sizes = _sizes_moving(record, traced)(leaf, size)
    broken = _broken(record, sizes) if sizes is not None else []
    if only:
        return bool(broken) and all(_compares_a_unit_size(code, remainders=False) for code in broken)
    return any(_compares_a_unit_size(code, remainders=True) for code in broken)


def grow_dim(inputs: Mapping[str, Any], program: torch.export.ExportedProgram, leaf: tuple[str, int],
             size: int) -> dict[str, Any] | None:
    """``inputs`` with the dim ``leaf``, its :func:`tied_leaves` and every top-level tensor dim traced as one of their
    symbols repeated up to ``size`` (a valid input of the same kinds, like :func:`engine.shapes.widen_unit_dims`);
    None where those symbols also size a nested leaf or a derived dim, which cannot be grown alike."""
    from engine.input_checks import named_user_inputs

    named = named_user_inputs(program)
    record = program_guards(program)
    traced, _ = _leaf_sizes(program, record)
    values = dict(named or ())
    syms = set()
    for name, d in tied_leaves(record, traced).get(leaf, [leaf]):
        dim = values[name].shape[d] if name in values and values[name] is not None else None
        if not isinstance(dim, torch.SymInt):
            return None
        syms.add(dim.node.expr)
    grown = dict(inputs)
    for name, val in named:
        for d, dim in enumerate(getattr(val, "shape", ())):
            if not isinstance(dim, torch.SymInt) or not syms & dim.node.expr.free_symbols:
                continue
            if dim.node.expr not in syms or not isinstance(grown.get(name), torch.Tensor):
                return None
            tensor = grown[name]
            grown[name] = torch.cat([tensor] * -(-size // tensor.shape[d]), dim=d).narrow(d, 0, size)
    return grown


def warn_for_program(label: str, program: torch.export.ExportedProgram) -> dict:
    """One :class:`ShapeGuardWarning` when ``program``'s guards reject sizes of a dynamic dim within its bounds
    (:func:`probe_plan`), naming the dims, the first rejected size and its guard; returns the guard record."""
    record = program_guards(program)
    if not record["guards"]:
        return record
    traced, _, found = restrictions(program)
    if not found:
        return record
    dims = record["dims"]
    listing = "; ".join(f"{leaf} dim {d} (traced {traced[(leaf, d)]}) rejects {rejected[0][0]}, by "
                        f"{_named(rejected[0][1], dims)}" for (leaf, d), rejected in list(found.items())[:QUOTED])
    warnings.warn(f"{label}: the model's code at the traced sizes left guards on {len(found)} dynamic dim(s), so "
                  f"the program runs only at sizes where they hold: {listing}. Other sizes raise InputError; these "
                  "guards are branches of the model's code at the traced sizes (a Mamba2 pads only lengths that are "
                  "not whole chunks): export with a sample on the side of the branch you need.",
                  ShapeGuardWarning, stacklevel=3)
    return record
