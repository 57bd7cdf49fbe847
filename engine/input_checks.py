"""Input checks shared by the runners of :func:`engine.run_exported`: every mismatch is an :class:`InputError`.

A runner describes what its artifact takes as a list of :class:`LeafSpec` (leaf name, dtype, per-dim bounds) and
calls :func:`check_leaves` with the given leaves, named as :func:`engine.pytree.get_leaf_tensors` names them
(``input_ids``, ``past_key_values.0.keys``). The checks, in order:

- names: every leaf the artifact takes is given, and no other (unknown names are named, with the accepted ones);
- per leaf: its rank, each dim within its ``[min, max]`` (a static dim is ``[n, n]``), its dtype;
- dims the artifact ties together (a dynamo program's shared symbols: one batch for all inputs; a dim exported as
  an expression of others, e.g. an attention mask as long as the cache plus the new tokens) must agree.

Dtypes: a tensor of the same kind (floating or not) is cast to the artifact's dtype; another kind is an error.

:func:`exported_program_specs` reads the specs of a ``torch.export.ExportedProgram`` from its user-input
placeholders and ``range_constraints``; the ExecuTorch runner reads them from the metadata its exporter wrote.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from engine.errors import InputError

#: torch.export's floor for a dynamic dim (its 0/1-specialisation assumption): a range minimum of 2 is not a limit
#: of the program, ``ExportedProgram.module()`` accepts 0 and 1 there (it checks only minimums above 2)
FLOOR = 2


@dataclasses.dataclass(frozen=True)
class DimSpec:
    """One dim of an input: ``lo <= size <= hi`` (``hi`` None: unbounded). ``expr`` is the program's symbolic size
    (a sympy expression) when the dim is dynamic and known symbolically, so dims sharing a symbol are tied."""

    lo: int
    hi: int | None
    expr: Any = None

    @property
    def static(self) -> bool:
        return self.hi is not None and self.lo == self.hi

    def describe(self) -> str:
        if self.static:
            return str(self.lo)
        return f"{self.lo}..{'' if self.hi is None else self.hi}"


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    name: str
    dtype: torch.dtype
    dims: tuple[DimSpec, ...]

    def describe_shape(self) -> str:
        return "[" + ", ".join(d.describe() for d in self.dims) + "]"


def bounds_spec(bounds: Sequence[Sequence[int]]) -> tuple[DimSpec, ...]:
    """Dims from ``[[min, max], ...]`` (a max of -1 or None: unbounded), the ExecuTorch metadata's format."""
    return tuple(DimSpec(int(lo), None if hi is None or hi < 0 else int(hi)) for lo, hi in bounds)


def check_leaves(label: str, specs: Sequence[LeafSpec], given: Mapping[str, torch.Tensor],
                 constraints: Sequence[Any] = ()) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` in ``specs`` order, each tensor cast to its spec's dtype where it differs within a kind;
    :class:`InputError` on any mismatch, worded the same for every backend. ``label`` (the model name) prefixes every
    message. ``constraints``: sympy relations over the dims' symbols that must hold (a program's runtime asserts on
    its input sizes)."""
    expected = [s.name for s in specs]
    missing = [n for n in expected if n not in given]
    extra = [n for n in given if n not in set(expected)]
    if missing or extra:
        raise InputError(
            f"{label}: the program takes inputs {', '.join(expected) or '(none)'}"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; not taken: {', '.join(extra)}" if extra else ""),
            input=(missing or extra)[0], problem="missing" if missing else "unknown")
    ties = _Ties(label)
    out: dict[str, torch.Tensor] = {}
    for spec in specs:
        tensor = given[spec.name]
        if tensor.ndim != len(spec.dims):
            raise InputError(
                f"{label}: input {spec.name} has {tensor.ndim} dims, the program takes {len(spec.dims)} "
                f"(shape {tuple(tensor.shape)}; the program takes {spec.describe_shape()})",
                input=spec.name, problem="rank")
        for d, (size, dim) in enumerate(zip(tensor.shape, spec.dims)):
            ties.check(spec, tensor, d, int(size), dim)
        if tensor.dtype != spec.dtype:
            if tensor.is_floating_point() != spec.dtype.is_floating_point:
                raise InputError(f"{label}: input {spec.name} is {tensor.dtype}, the program takes {spec.dtype} (a tensor "
                                 f"of the same kind, {'floating point' if spec.dtype.is_floating_point else 'integer or bool'}, "
                                 "is cast to it)", input=spec.name, problem="dtype")
            tensor = tensor.to(spec.dtype)
        out[spec.name] = tensor
    ties.check_deferred()
    for relation in constraints:
        ties.check_relation(relation)
    return out


def _out_of_bounds(label: str, spec: LeafSpec, tensor: torch.Tensor, d: int, size: int, lo: int, hi: int | None) -> InputError:
    if hi is not None and lo == hi:
        allowed, hint = f"exactly {lo}", "the program was exported with this dim static"
    else:
        allowed = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        hint = "export with dynamic_shapes Dim(min=, max=) covering it"
    return InputError(
        f"{label}: input {spec.name} dim {d} is {size}, outside the exported bounds: it must be {allowed} "
        f"(shape {tuple(tensor.shape)}); {hint}", input=spec.name, problem="size")


def _in_bounds(size: int, lo: int, hi: int | None) -> bool:
    return lo <= size and (hi is None or size <= hi)


class _Ties:
    """Bounds of each dim, and the agreement of dims tied by the program's symbols: the first dim that is a bare
    symbol gives it its value, every later one must equal it; a dim that is an expression of symbols is checked
    once all the leaves are seen."""

    def __init__(self, label: str):
        self.label = label
        self.values: dict[Any, tuple[int, str]] = {}  # symbol -> (size, "name dim d")
        self.deferred: list[tuple[LeafSpec, torch.Tensor, int, int, DimSpec]] = []

    def check(self, spec: LeafSpec, tensor: torch.Tensor, d: int, size: int, dim: DimSpec) -> None:
        expr = dim.expr
        if expr is not None and not getattr(expr, "is_symbol", False):
            self.deferred.append((spec, tensor, d, size, dim))
            return
        if expr is not None and expr in self.values:
            value, where = self.values[expr]
            if size != value:
                raise self._unequal(spec, tensor, d, size, f"{where}, which is {value}", value)
            return
        if not _in_bounds(size, dim.lo, dim.hi):
            raise _out_of_bounds(self.label, spec, tensor, d, size, dim.lo, dim.hi)
        if expr is not None:
            self.values[expr] = (size, f"{spec.name} dim {d}")

    def _unequal(self, spec: LeafSpec, tensor: torch.Tensor, d: int, size: int, equal_to: str, value: int) -> InputError:
        return InputError(f"{self.label}: input {spec.name} dim {d} is {size}, but the program has it equal to "
                          f"{equal_to}: it must be {value} (shape {tuple(tensor.shape)})", input=spec.name, problem="size")

    def check_deferred(self) -> None:
        for spec, tensor, d, size, dim in self.deferred:
            self._check_expression(spec, tensor, d, size, dim)

    def _check_expression(self, spec: LeafSpec, tensor: torch.Tensor, d: int, size: int, dim: DimSpec) -> None:
        import sympy

        expr = dim.expr
        unbound = [s for s in expr.free_symbols if s not in self.values]
        try:
            if not unbound:
                value = expr.subs({s: v for s, (v, _) in self.values.items() if s in expr.free_symbols})
                value = int(value) if getattr(value, "is_integer", False) and value.is_number else None
            elif len(unbound) == 1:
                from torch.utils._sympy.solve import try_solve

                solved = try_solve(sympy.Eq(expr, size), unbound[0])
                value = None
                if solved is None or not (solved[1].is_number and solved[1].is_integer):
                    raise InputError(
                        f"{self.label}: input {spec.name} dim {d} is {size}, which the program cannot take: it must be of the "
                        f"form {self._in_names(expr)} for an integer {unbound[0]} (shape {tuple(tensor.shape)})",
                        input=spec.name, problem="size")
                self.values[unbound[0]] = (int(solved[1]), f"{spec.name} dim {d}")
            else:
                value = None
        except InputError:
            raise
        except Exception:  # sympy could not evaluate it: the bounds below still apply
            value = None
        if value is not None:
            if size != value:
                raise self._unequal(spec, tensor, d, size, f"{self._in_names(expr)} = {value}", value)
            return
        if not _in_bounds(size, dim.lo, dim.hi):
            raise _out_of_bounds(self.label, spec, tensor, d, size, dim.lo, dim.hi)

    def check_relation(self, relation: Any) -> None:
        """A relation between dims (``Eq(s0, s1)``, ``s2 <= s0 + s1``) once all its symbols have a size."""
        import sympy

        if not relation.free_symbols or not all(s in self.values for s in relation.free_symbols):
            return
        try:
            holds = relation.subs({s: self.values[s][0] for s in relation.free_symbols})
        except Exception:  # sympy could not evaluate it: torch's own check applies
            return
        if holds is sympy.false:
            raise InputError(
                f"{self.label}: the inputs break the program's constraint {self._in_names(relation)}: "
                f"{self._in_names(relation, sizes=True)} is false", problem="size")

    def _in_names(self, expr: Any, sizes: bool = False) -> str:
        """``expr`` with each symbol written as the input dim that gave it (``input_ids dim 1 + past_key_values.0.keys dim 2``)."""
        import sympy

        where = {str(s): (str(self.values[s][0]) if sizes else f"({self.values[s][1]})") for s in expr.free_symbols if s in self.values}

        def text(e: Any) -> str:
            if isinstance(e, (sympy.Eq, sympy.Ne)):  # printed Eq(a, b) by sympy
                return f"{text(e.lhs)} {'==' if isinstance(e, sympy.Eq) else '!='} {text(e.rhs)}"
            return re.sub(r"\b[A-Za-z_]\w*\b", lambda m: where.get(m.group(), m.group()), str(e))

        return text(expr)


# ── Values: what a runner takes as an input ─────────────────────────────────────────────────────────────────

def as_tensor_inputs(label: str, inputs: Mapping[str, Any], takes: Sequence[LeafSpec] | None = None) -> dict[str, Any]:
    """``inputs`` with each list, tuple of numbers or numpy array converted to a tensor (``torch.as_tensor``: int64
    for integers, the default float dtype for floats, an array's own dtype). A string for an input the program takes as a tensor (``takes``) is an
    :class:`InputError` naming it; a string for another name is a constant, bound at export, and left out. Tensors,
    caches, ``ModelOutput``/dict containers and ``None`` pass as they are."""
    tensor_inputs = {spec.name.split(".")[0] for spec in takes or ()}
    out = {}
    for name, value in inputs.items():
        if isinstance(value, (str, bytes)):
            if name not in tensor_inputs:
                continue
            raise InputError(f"{label}: input {name} is a {type(value).__name__}; give a tensor (a list of numbers or "
                             "a numpy array is converted)", input=name, problem="type")
        if _is_numbers(value) or type(value).__module__ == "numpy":
            try:
                value = torch.as_tensor(value)
            except (TypeError, ValueError, RuntimeError) as e:
                raise InputError(f"{label}: input {name} cannot be made a tensor ({e}); give a tensor",
                                 input=name, problem="type") from None
        out[name] = value
    return out


def _is_numbers(value: Any) -> bool:
    """A non-empty (nested) list or tuple of Python numbers."""
    if not isinstance(value, (list, tuple)) or not value:
        return False
    return all(_is_numbers(v) if isinstance(v, (list, tuple)) else isinstance(v, (int, float, bool)) for v in value)


def specs_to_json(specs: Sequence[LeafSpec]) -> list[dict]:
    """Specs as JSON (an artifact's metadata): name, dtype, per-dim ``[min, max]`` (max -1: unbounded) and the
    symbol a dim shares with others (``None``: its own)."""
    return [{"name": s.name, "dtype": str(s.dtype).removeprefix("torch."),
             "bounds": [[d.lo, -1 if d.hi is None else d.hi] for d in s.dims],
             "symbols": [str(d.expr) if d.expr is not None and d.expr.is_symbol else None for d in s.dims]}
            for s in specs]


def specs_from_json(data: Sequence[Mapping]) -> list[LeafSpec]:
    """The inverse of :func:`specs_to_json`; a dim's symbol ties it to the dims sharing it."""
    import sympy

    specs = []
    for item in data:
        symbols = item.get("symbols") or [None] * len(item["bounds"])
        dims = tuple(DimSpec(d.lo, d.hi, sympy.Symbol(sym, integer=True) if sym else None)
                     for d, sym in zip(bounds_spec(item["bounds"]), symbols))
        specs.append(LeafSpec(item["name"], getattr(torch, item["dtype"]), dims))
    return specs


# ── torch.export.ExportedProgram ───────────────────────────────────────────────────────────────────────


def program_label(program: torch.export.ExportedProgram) -> str:
    """The exported module's class name (from the root of the nodes' ``nn_module_stack``), else ``ExportedProgram``."""
    for node in program.graph.nodes:
        for path, qualified in (node.meta.get("nn_module_stack") or {}).values():
            if path == "" and isinstance(qualified, str):
                return qualified.rsplit(".", 1)[-1]
            break
    return "ExportedProgram"


def program_input_names(program: torch.export.ExportedProgram) -> list[str]:
    """The ``get_leaf_tensors`` name of each flat user input of ``program`` (its ``in_spec`` leaves, positional
    arguments named by the forward's parameter names)."""
    import torch.utils._pytree as pytree

    from engine.pytree import iter_leaf_tensors

    spec = program.call_spec.in_spec
    markers = [torch.tensor(i) for i in range(spec.num_leaves)]
    tree = pytree.tree_unflatten(markers, spec)
    args, kwargs = tree if isinstance(tree, tuple) and len(tree) == 2 else ((), tree)
    signature = program.module_call_graph[0].signature if program.module_call_graph else None
    arg_names = list(getattr(signature, "forward_arg_names", None) or [])
    named = {(arg_names[i] if i < len(arg_names) else f"arg{i}"): a for i, a in enumerate(args)}
    named.update(kwargs)
    names = [""] * spec.num_leaves
    for name, marker in iter_leaf_tensors(named):
        names[int(marker)] = name
    return names


def user_input_specs(program: torch.export.ExportedProgram) -> list:
    """The program's user input specs (not parameters, buffers or constants), in its flat input order."""
    from torch.export.graph_signature import InputKind

    return [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]


def user_input_placeholders(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The placeholder of each tensor user input (a constant leaf, a ``None`` field, has none), in order."""
    from torch.export.graph_signature import TensorArgument

    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return [nodes[s.arg.name] for s in user_input_specs(program) if isinstance(s.arg, TensorArgument)]


def _named_specs(program: torch.export.ExportedProgram) -> list[tuple[str, Any]] | None:
    """``(get_leaf_tensors name, input spec)`` per user input of ``program``; None when they cannot be named so."""
    try:
        names = program_input_names(program)
    except Exception:  # noqa: BLE001 - an input structure the names cannot be read from
        return None
    specs = user_input_specs(program)
    return list(zip(names, specs)) if len(specs) == len(names) else None


def placeholder_leaf_names(program: torch.export.ExportedProgram) -> dict[str, str]:
    """``{placeholder name: get_leaf_tensors name}`` of the tensor user inputs (``"cache.0.keys"``...); empty when
    the inputs cannot be named so."""
    from torch.export.graph_signature import TensorArgument

    return {s.arg.name: name for name, s in _named_specs(program) or () if isinstance(s.arg, TensorArgument)}


def named_user_inputs(program: torch.export.ExportedProgram) -> list[tuple[str, Any]] | None:
    """``(get_leaf_tensors name, recorded value)`` per user input of ``program``, the value None for a constant
    leaf; None when the inputs cannot be named so."""
    from torch.export.graph_signature import TensorArgument

    named = _named_specs(program)
    if named is None:
        return None
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return [(name, nodes[s.arg.name].meta.get("val") if isinstance(s.arg, TensorArgument) else None)
            for name, s in named]


def _int_bound(value: Any) -> int | None:
    """A range end as an int; None for the infinities (torch's int_oo is neither an int nor a sympy.Integer)."""
    import sympy

    return int(value) if isinstance(value, (int, sympy.Integer)) else None


def _dim_spec(size: Any, ranges: Mapping[Any, Any]) -> DimSpec:
    if isinstance(size, int):
        return DimSpec(size, size)
    expr = size.node.expr
    if expr.is_number:
        return DimSpec(int(expr), int(expr))
    if expr in ranges:
        vr = ranges[expr]
    else:
        from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

        # an expression of symbols: bounded by their ranges, each symbol's floor of 2 being no limit
        relaxed = {s: (ValueRanges(0, vr.upper) if _int_bound(vr.lower) == FLOOR else vr) for s, vr in ranges.items()}
        vr = bound_sympy(expr, relaxed)
    lo, hi = _int_bound(vr.lower), _int_bound(vr.upper)
    lo = 0 if lo is None or lo == FLOOR else max(lo, 0)
    return DimSpec(lo, hi, expr)


def exported_program_specs(program: torch.export.ExportedProgram) -> list[LeafSpec] | None:
    """A :class:`LeafSpec` per tensor user input of ``program``, named like ``get_leaf_tensors`` names the inputs;
    None when the program's inputs cannot be read so (then only torch's own checks apply)."""
    named = named_user_inputs(program)
    if named is None:
        return None
    ranges = dict(program.range_constraints)
    specs = []
    for name, val in named:
        if val is None:
            continue  # a constant leaf (a None field): nothing to feed
        if not isinstance(val, torch.Tensor) or not name:
            return None
        specs.append(LeafSpec(name, val.dtype, tuple(_dim_spec(s, ranges) for s in val.shape)))
    return specs


_ASSERT_MESSAGE = re.compile(r"^Runtime assertion failed for expression (.+) on node '[^']*'$")


def exported_program_constraints(program: torch.export.ExportedProgram) -> list[Any]:
    """The relations between input dims that ``program`` asserts at run time (its ``_assert_scalar`` nodes, which
    ``prefer_deferred_runtime_asserts_over_guards`` makes of guards: ``Eq(s0, s1)`` for a shared batch, ``s2 <= s0 +
    s1``), as sympy relations over its placeholder symbols; those over other symbols (data-dependent sizes) or that
    do not parse are left out (the graph still checks them)."""
    import sympy

    symbols: dict[str, Any] = {}
    for node in program.graph.nodes:
        if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor):
            for size in node.meta["val"].shape:
                if isinstance(size, torch.SymInt):
                    symbols.update({str(s): s for s in size.node.expr.free_symbols})
    relations = []
    for node in program.graph.find_nodes(op="call_function", target=torch.ops.aten._assert_scalar.default):
        message = node.args[1] if len(node.args) > 1 else node.kwargs.get("assert_msg")
        match = _ASSERT_MESSAGE.match(message) if isinstance(message, str) else None
        if match is None:
            continue
        try:
            relation = sympy.sympify(match.group(1), locals=dict(symbols))
        except Exception:
            continue
        if (isinstance(relation, sympy.core.relational.Relational) and relation.free_symbols
                and all(str(s) in symbols for s in relation.free_symbols)
                and not relation.atoms(sympy.core.function.AppliedUndef)):
            relations.append(relation)
    return relations
