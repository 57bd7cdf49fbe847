"""Finite bounds for the dynamic dims of a program ExecuTorch will plan memory for (stage 3 of the ExecuTorch exporter).

``Dim.AUTO`` leaves most upper bounds at ``int_oo``. ExecuTorch plans memory for the upper bound of every dynamic
dim (and ``eval_upper_bound`` fails on ``int_oo``), so each unbounded dim needs a finite cap: the larger the cap,
the larger the plan. Caps come from the model config where it states a limit (positions for sequence dims, image
size for spatial dims) and from the traced size otherwise (batch); then the caps nobody stated are lowered until
the largest tensor the program plans fits :data:`PLANNED_TENSOR_BUDGET`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils._sympy.numbers import IntInfinity, NegativeIntInfinity
from torch.utils._sympy.value_ranges import ValueRanges

from engine.errors import PlannedMemoryError
from engine.fake_mode import program_shape_env
from engine.input_checks import placeholder_leaf_names, user_input_placeholders
from engine.shapes import config_values

#: config keys that bound a sequence length (looked up in the config and every sub-config)
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_target_positions",
    "max_source_positions",
    "n_ctx",
    "max_seq_len",
    "max_sequence_length",
)


IMAGE_KEYS = ("image_size",)


#: a batch dim traced at ``b`` accepts up to ``max(BATCH_FACTOR * b, MIN_BATCH_CAP)``
BATCH_FACTOR, MIN_BATCH_CAP = 4, 8


#: a sequence/spatial dim the config states no limit for accepts up to ``max(LENGTH_FACTOR * traced, MIN_LENGTH_CAP)``
LENGTH_FACTOR, MIN_LENGTH_CAP = 4, 256


#: the largest tensor (an op's output, or the score matrix attention materialises once decomposed) the chosen caps
#: may plan for: caps the user did not state are halved, the largest relative to its traced size first, down to
#: ``BUDGET_FLOOR_FACTOR x traced``, until every planned tensor fits. A config's 32k positions (or a video's
#: frames x height x width) otherwise plan attention scores of many GB, which the runtime cannot allocate.
PLANNED_TENSOR_BUDGET = 64 * 2**20


BUDGET_FLOOR_FACTOR = 2


#: a bound at or above this is no bound: torch derives ``sys.maxsize - k`` from ``int_oo`` through a relation (two
#: feature counts whose sum is a dim: Qwen3-Omni's ``s73 + s97``), and no tensor's size comes near it
NO_BOUND = 2**62


def _unbounded(upper: Any) -> bool:
    """``int_oo``, or a bound of :data:`NO_BOUND` or more: the ``sys.maxsize - 1`` torch gives some data-dependent
    sizes (a count read by ``.item()`` and checked ``>= 0``), or one it derived from an unbounded dim (``sys.maxsize -
    3`` for each of two dims whose sum is bounded by ``sys.maxsize - 1``): no bound to plan memory at."""
    return isinstance(upper, IntInfinity) or (getattr(upper, "is_Integer", False) and int(upper) >= NO_BOUND)


class UnboundedDimWarning(UserWarning):
    """Dynamic dims without an upper bound were given a finite one for ExecuTorch memory planning."""


def _config_limits(config: Any, keys: tuple[str, ...]) -> list[tuple[str, int]]:
    """``(dotted key, largest positive int)`` for every ``key`` in the config and its sub-configs."""
    found = []
    for key, value in config_values(config, keys):
        ints = [x for x in (value if isinstance(value, (list, tuple)) else [value])
                if isinstance(x, int) and not isinstance(x, bool) and x > 0]
        if ints:
            found.append((key, max(ints)))
    return found


@dataclass
class DimLimits:
    """The limits a model's config states for its dynamic dims, and where each came from."""

    model: str
    length: tuple[str, int] | None = None  # (config key, limit) for sequence-like dims
    image: tuple[str, int] | None = None  # (config key, limit) for spatial dims of images
    max_seq_len: int | None = None  # ExecutorchConfig.max_seq_len: wins over ``length`` and derived bounds
    stated_shapes: bool = False  # the user passed dynamic_shapes: finite bounds are theirs, never lowered
    tensor_limit: int | None = None  # bytes: a larger planned tensor is refused (ExecutorchConfig.max_planned_tensor_mb)

    @classmethod
    def from_model(cls, model: torch.nn.Module, name: str, max_seq_len: int | None = None,
                   stated_shapes: bool = False, tensor_limit: int | None = None) -> DimLimits:
        config = getattr(model, "config", None)
        lengths = _config_limits(config, POSITION_KEYS)
        images = _config_limits(config, IMAGE_KEYS)
        # the largest stated limit: a cap above one sub-model's limit costs memory, one below rejects valid inputs
        return cls(name, max(lengths, key=lambda kv: kv[1], default=None), max(images, key=lambda kv: kv[1], default=None),
                   max_seq_len, stated_shapes, tensor_limit)

    def cap(self, role: str, traced: int) -> tuple[int, str]:
        """``(cap, why)`` for a dim of ``role`` (``"batch"``, ``"length"``, ``"image"``) traced at ``traced``."""
        if role == "batch":
            return max(BATCH_FACTOR * traced, MIN_BATCH_CAP), f"batch: {BATCH_FACTOR} x traced {traced}"
        if role == "length" and self.max_seq_len is not None:
            return max(self.max_seq_len, traced), f"max_seq_len={self.max_seq_len}"
        stated = self.image if role == "image" else self.length
        if stated is not None:
            key, limit = stated
            return max(limit, traced), f"config {key}={limit}"
        return max(LENGTH_FACTOR * traced, MIN_LENGTH_CAP), f"no config limit: {LENGTH_FACTOR} x traced {traced}"

    def user_stated(self, role: str) -> bool:
        """Whether the user chose this role's bound (``max_seq_len``): the memory budget never lowers it."""
        return role == "length" and self.max_seq_len is not None


def _dim_role(val: torch.Tensor, dim: int, leaf: str = "") -> str:
    """Dim 0 is the batch; the last two dims of a floating input of 4 or more dims are image dims (height and width of
    ``[B, C, H, W]`` images and of ``[B, T, C, H, W]`` or ``[B, C, T, H, W]`` video frames, which as lengths would have
    no config limit); the rest are lengths. A cache layer's keys/values (``cache.0.keys``, ``[B, heads, length,
    head_dim]``, as :mod:`engine.shapes` marks them) grow along dim 2, a length, so ``max_seq_len`` bounds it. The
    middle dim of integer ids or masks ``[B, choices, seq]`` (traced shorter than the sequence; ``[B, seq, 4]`` boxes
    are not) counts rows the model folds into the batch, so it is bounded as one: as a length, ``max_seq_len`` would
    plan GBs."""
    if dim == 0:
        return "batch"
    if val.ndim == 3 and dim == 1 and not val.is_floating_point() and val.shape[1] < val.shape[2]:
        return "batch"  # rows per sample of ids/masks, [B, choices or codebooks, seq]: the model flattens them into B
    if val.ndim == 4 and dim == 2 and leaf.rsplit(".", 1)[-1] in ("keys", "values"):
        return "length"
    if val.ndim >= 4 and val.is_floating_point() and dim >= val.ndim - 2:
        return "image"
    return "length"


_ATTENTION_OPS = ("scaled_dot_product", "_scaled_dot_product")


def _planned_sizes(program: torch.export.ExportedProgram) -> dict[Any, str]:
    """The byte size, as an expression in the program's size symbols, of every distinct tensor the program
    computes, plus each attention's score matrix (``query rows x key rows`` per head), which the lowering's
    decomposition materialises though no node of the exported program holds it; each with what it is (the first
    node that plans it, its shape and dtype)."""
    import sympy

    sizes: dict[Any, str] = {}

    def add(shape, dtype, what: str) -> None:
        numel = sympy.Integer(1)
        for size in shape:
            numel *= size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))
        if numel.free_symbols:
            sizes.setdefault(numel * dtype.itemsize, f"{what} {list(shape)} {str(dtype).removeprefix('torch.')}")

    for node in program.graph.nodes:
        val = node.meta.get("val")
        for tensor in val if isinstance(val, (list, tuple)) else (val,):
            if isinstance(tensor, torch.Tensor):
                add(tensor.shape, tensor.dtype, f"{node.name!r}")
        if node.op == "call_function" and any(k in str(node.target) for k in _ATTENTION_OPS) and len(node.args) >= 2:
            q, k = (getattr(a, "meta", {}).get("val") for a in node.args[:2])
            if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.ndim >= 2 and k.ndim >= 2:
                add((*q.shape[:-1], k.shape[-2]), q.dtype, f"the attention scores of {node.name!r}")
    return dict(sorted(sizes.items(), key=lambda kv: str(kv[0])))


def _fit_to_budget(sizes: list[Any], caps: dict[Any, int], floors: dict[Any, int], fixed: Callable[[Any, dict], int],
                   budget: int = PLANNED_TENSOR_BUDGET) -> tuple[dict[Any, int], int]:
    """Halve the caps in ``floors`` (the ones that may move), the largest relative to its floor first, until the
    largest of ``sizes`` fits ``budget`` or none can move; ``fixed(sym, caps)`` values every other symbol given
    the current caps. Returns the caps and the largest planned tensor's bytes."""
    import sympy

    caps = dict(caps)

    def value(expr) -> int:
        subs = {sym: sympy.Integer(caps[sym] if sym in caps else fixed(sym, caps)) for sym in expr.free_symbols}
        return int(expr.xreplace(subs))  # every symbol has a value: a number (a bare symbol: the Integer itself)

    while True:
        largest, expr = max(((value(e), e) for e in sizes), default=(0, None), key=lambda t: t[0])
        movable = [sym for sym in (expr.free_symbols if expr is not None else ()) if caps.get(sym, 0) > floors.get(sym, 1 << 62)]
        if largest <= budget or not movable:
            return caps, largest
        sym = max(movable, key=lambda s: (caps[s] / floors[s], str(s)))
        caps[sym] = max(floors[sym], 1 << ((caps[sym] - 1).bit_length() - 1))  # the power of two below


def _raise_divisor_floors(sizes, table: dict) -> dict:
    """Lower bounds raised so that no size divides by a quotient that can be 0: for each ``a // (s // k)`` in
    ``sizes`` (``s`` a size symbol whose range starts below ``k``), ``s >= k``. An input with ``s < k`` would divide
    by zero where the program computes that size (Qwen2.5-VL's ``reshape(seq // 4, 4, -1)`` of ``seq`` packed
    patches infers ``-1`` as ``d * seq // (seq // 4 * 4)``), so no input the program can run is excluded; and with
    the quotient's range starting at 0, interval arithmetic has no finite upper bound for the size. Returns the
    raised ``{symbol: new lower bound}``."""
    from torch.utils._sympy.functions import FloorDiv

    raised: dict = {}
    for expr in sizes:
        for div in expr.atoms(FloorDiv):
            inner = div.args[1]
            if isinstance(inner, FloorDiv) and inner.args[0].is_Symbol and inner.args[1].is_Integer:
                sym, k = inner.args[0], int(inner.args[1])
                vr = table.get(sym)
                if vr is not None and not isinstance(vr.lower, NegativeIntInfinity) and int(vr.lower) < k <= vr.upper:
                    raised[sym] = max(raised.get(sym, k), k)
    return raised


def bound_dynamic_dims(program: torch.export.ExportedProgram, limits: DimLimits) -> None:
    """Give every dynamic dim of ``program`` a finite upper bound that ExecuTorch can plan memory for.

    Pattern: unguarded ``Dim.AUTO`` dims have ``int_oo`` upper bounds, which ``eval_upper_bound`` refuses. Rewrite: caps
    from the model config or traced size (:func:`_input_dim_caps`), unstated ones lowered until the largest planned
    tensor fits :data:`PLANNED_TENSOR_BUDGET` (:func:`_fit_to_budget`); finite bounds kept
    (``ExecutorchConfig.max_seq_len`` aside). Updates ``range_constraints``/``var_to_range``, warns
    (:class:`UnboundedDimWarning`), refuses a plan still over (:func:`refuse_unrunnable_plan`). TODO: upstream issue not
    found (int_oo bounds are torch.export's documented Dim.AUTO behaviour)."""
    shape_env = program_shape_env(program)
    ranges = program._range_constraints
    env_ranges = shape_env.var_to_range if shape_env is not None else {}
    caps, floors, derived = _input_dim_caps(program, limits, lambda sym: getattr(ranges.get(sym, env_ranges.get(sym)), "upper", None))

    def unbounded(sym, chosen) -> int:  # a symbol no input dim is: at the largest cap, as the fallback below
        vr = ranges.get(sym, env_ranges.get(sym))
        if vr is not None and not _unbounded(vr.upper):
            return int(vr.upper)
        return max((c for s, c in chosen.items() if s not in derived or c < caps[s][0]), default=MIN_LENGTH_CAP)

    largest, planned = 0, _planned_sizes(program)
    for table in (ranges, env_ranges):
        for sym, lower in _raise_divisor_floors(planned, table).items():
            table[sym] = ValueRanges(lower, table[sym].upper)
    if caps:
        chosen, largest = _fit_to_budget(planned, {s: c for s, (c, _, _) in caps.items()},
                                         {s: f for s, f in floors.items() if f < caps[s][0]}, unbounded)
        for sym, cap in chosen.items():
            if cap < caps[sym][0]:
                was, why, where = caps[sym]
                caps[sym] = (cap, f"{why} = {was}, lowered to fit the {PLANNED_TENSOR_BUDGET >> 20} MiB tensor budget", where)
                derived.discard(sym)
    for sym in derived:  # kept as torch.export derived it: nothing to report
        del caps[sym]
    # symbols no input dim is exactly (derived or data-dependent sizes) get the largest input cap
    fallback = max((c for c, _, _ in caps.values()), default=MIN_LENGTH_CAP)
    internal = set()
    for table in (ranges, env_ranges):
        for sym, vr in list(table.items()):
            if _unbounded(vr.upper) or sym in caps:
                cap = caps[sym][0] if sym in caps else fallback
                lower = vr.lower if not isinstance(vr.lower, NegativeIntInfinity) else 0
                table[sym] = ValueRanges(lower, max(cap, int(lower)))
                if sym not in caps:
                    internal.add(sym)
    known = {**env_ranges, **ranges}
    for sym, bound in {**_split_piece_bounds(program, known), **_mask_count_bounds(program, known)}.items():
        for table in (ranges, env_ranges):
            if sym in internal and sym in table and bound > table[sym].upper:
                table[sym] = ValueRanges(table[sym].lower, bound)
    lowered = _fit_data_dependent_sizes(planned, internal, {**env_ranges, **ranges}, limits.tensor_limit)
    for sym, bound in lowered.items():
        for table in (ranges, env_ranges):
            if sym in table:
                table[sym] = ValueRanges(table[sym].lower, bound)
    if caps or lowered:
        _warn_caps(limits.model, caps, len(internal), fallback, largest, lowered)
    refuse_unrunnable_plan(program, planned, limits)


#: ``x.split([sizes], dim)`` and its copy variant, in the IRs a program is bounded in
_SPLIT_OPS = ("split_with_sizes", "split", "split_with_sizes_copy", "split_copy")


def _split_piece_bounds(program: torch.export.ExportedProgram, ranges: dict[Any, ValueRanges]) -> dict[Any, int]:
    """Pattern: ``x.split(sizes, dim)`` with sizes read from data (MoE routing: ``expert_size.tolist()``, JetMoe):
    each piece's size is an unbacked symbol, which gets the fallback bound (the largest input dim's cap), while the
    pieces split a dim that can be larger (tokens x top-k flattened from batch x sequence), so the runtime finds a
    piece larger than its plan. A piece is at most the dim it is cut from: each such symbol's bound is that dim's
    upper bound at the chosen caps (never lowered)."""
    bounds: dict[Any, int] = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "_opname", None) not in _SPLIT_OPS:
            continue
        source, sizes = node.args[0], node.args[1]
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
        val = getattr(source, "meta", {}).get("val")
        if not isinstance(sizes, (list, tuple)) or not isinstance(val, torch.Tensor) or not isinstance(dim, int):
            continue
        upper = _upper_bound(val.shape[dim], ranges)
        if upper is None:
            continue
        for size in sizes:
            piece = getattr(size, "meta", {}).get("val") if isinstance(size, torch.fx.Node) else size
            expr = piece.node.expr if isinstance(piece, torch.SymInt) else None
            if expr is not None and expr.is_Symbol and free_unbacked_symbols(expr):
                bounds[expr] = max(bounds.get(expr, 0), upper)
    return bounds


def _upper_bound(size: Any, ranges: dict[Any, ValueRanges]) -> int | None:
    """A size's upper bound at ``ranges``; None where it has none."""
    if not isinstance(size, torch.SymInt):
        return int(size)
    from torch.utils._sympy.value_ranges import bound_sympy

    upper = bound_sympy(size.node.expr, ranges).upper
    return None if _unbounded(upper) else int(upper)


#: ops whose output counts a mask's true (nonzero) elements, in the IRs a program is bounded in
_MASK_COUNT_OPS = ("nonzero", "argwhere", "masked_select", "index")


def _mask_count_bounds(program: torch.export.ExportedProgram, ranges: dict[Any, ValueRanges]) -> dict[Any, int]:
    """Pattern: the rows a mask selects (``x[mask]``, ``mask.nonzero()``, ``masked_select``: FunASR-Nano keeps
    the audio frames its feature mask marks, batch x frames of them): their count is an unbacked symbol, which gets
    the fallback bound (the largest input dim's cap), while the mask can hold more true elements than that, so the
    runtime finds more rows than it planned ('Attempted to resize a bounded tensor with a maximum capacity of 2560
    elements to 4096', 0x12). A count is at most the mask's number of elements: each such symbol's bound is that
    number at the chosen caps (never lowered)."""
    import math

    bounds: dict[Any, int] = {}
    for node in program.graph.nodes:
        name = getattr(node.target, "_opname", None) if node.op == "call_function" else None
        if name not in _MASK_COUNT_OPS:
            continue
        if name == "index":  # only boolean indices count elements
            masks = [i for i in (node.args[1] if len(node.args) > 1 else ()) if isinstance(i, torch.fx.Node)
                     and getattr(i.meta.get("val"), "dtype", None) == torch.bool]
        else:
            masks = [a for a in node.args[:2] if isinstance(a, torch.fx.Node)]
        vals = [m.meta.get("val") for m in masks]
        out = node.meta.get("val")
        if not vals or not all(isinstance(v, torch.Tensor) for v in vals) or not isinstance(out, torch.Tensor):
            continue
        counts = [d.node.expr for d in out.shape if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol
                  and free_unbacked_symbols(d.node.expr)]
        if not counts:
            continue
        # masked_select broadcasts its two operands
        upper = _upper_bound(math.prod(torch.broadcast_shapes(*(v.shape for v in vals))), ranges)
        if upper is None:
            continue
        for count in counts:
            bounds[count] = max(bounds.get(count, 0), upper)
    return bounds


def refuse_unrunnable_plan(program: torch.export.ExportedProgram, planned: Mapping[Any, str], limits: DimLimits) -> None:
    """Raise :class:`PlannedMemoryError` when a tensor the program plans at its final dim bounds is larger than
    ``limits.tensor_limit`` bytes.

    ExecuTorch sizes every planned buffer for the upper bounds once, at load, and XNNPACK its workspace from the same
    bounds: a tensor of many GiB (a Mamba's scan intermediate at batch 52, a Gemma 2's attention scores at 8k positions)
    fails at load (``bad_alloc``), inside XNNPACK (``xnn_status_out_of_memory``, error 0x1), or kills the process. Such
    a program is refused at export, naming the tensor, the bounds it follows and how to lower them; the budget keeps the
    bounds nobody stated under the limit, so only stated bounds reach this."""
    if limits.tensor_limit is None:
        return
    ranges = program._range_constraints
    env = program_shape_env(program)
    env_ranges = env.var_to_range if env is not None else {}

    def upper(sym) -> int:
        vr = ranges.get(sym, env_ranges.get(sym))
        return int(vr.upper) if vr is not None and not _unbounded(vr.upper) else MIN_LENGTH_CAP

    # a size with a data-dependent symbol (``u0``: a nonzero count) has no bound to read: not judged here
    sizes = [e for e in planned if not free_unbacked_symbols(e)]
    if not sizes:
        return
    largest, expr = max(((int(e.xreplace({s: upper(s) for s in e.free_symbols})), e) for e in sizes), key=lambda t: t[0])
    if largest <= limits.tensor_limit:
        return
    from engine.shape_guards import program_guards  # the input dims by leaf name, computed once per program

    names = {sym: f"{leaf} dim {d}" for sym, (leaf, d) in program_guards(program)["dims"].items()}
    follows = ", ".join(f"{names.get(str(sym), sym)} <= {upper(sym)}"
                        for sym in sorted(expr.free_symbols, key=lambda s: names.get(str(s), str(s))))
    raise PlannedMemoryError(
        f"{limits.model}: at its dim bounds the ExecuTorch program plans {planned[expr]} of {_mib_or_gib(largest)}, "
        f"over the {limits.tensor_limit >> 20} MiB limit (ExecutorchConfig.max_planned_tensor_mb): the runtime could "
        f"not allocate it, or would fail or die running it. Its size follows {follows}. Lower those bounds "
        "(ExecutorchConfig.max_seq_len, or dynamic_shapes with torch.export.Dim(max=)), or raise "
        "max_planned_tensor_mb if the device has the memory.")


def _mib_or_gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


def _input_dim_caps(program: torch.export.ExportedProgram, limits: DimLimits, upper: Callable[[Any], Any]):
    """``(caps, floors, derived)`` for the program's symbolic input dims: ``caps[symbol] = (cap, why, where)`` for
    each dim that needs one, ``floors[symbol]`` the least cap the memory budget may lower it to, and ``derived``
    the finite bounds torch.export derived (listed only when the budget lowers them)."""
    caps: dict[Any, tuple[int, str, str]] = {}
    floors: dict[Any, int] = {}
    derived: set[Any] = set()
    leaves = placeholder_leaf_names(program)
    for node in user_input_placeholders(program):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for d, size in enumerate(val.shape):
            if not isinstance(size, torch.SymInt) or not size.node.expr.is_symbol:
                continue
            expr, role = size.node.expr, _dim_role(val, d, leaves.get(node.name, ""))
            bound = upper(expr)
            finite = getattr(bound, "is_Integer", False)
            narrowed = role == "length" and limits.max_seq_len is not None and finite
            traced = int(size.node.hint) if size.node.hint is not None else 2
            if _unbounded(bound) or narrowed:
                cap, why = limits.cap(role, traced)
                if narrowed:
                    if cap >= int(bound):
                        continue
                    why += f", was {int(bound)}"
            elif finite and not limits.stated_shapes:  # a bound the trace derived (a model check): the budget may lower it
                cap, why = int(bound), "derived by torch.export"
                derived.add(expr)
            else:
                continue
            if expr not in caps or cap > caps[expr][0]:
                caps[expr] = (cap, why, f"{node.name} dim {d}")
            # a bound the user stated is never lowered (nor a dim shared with one): its floor is the cap itself
            floor = cap if limits.user_stated(role) else min(cap, BUDGET_FLOOR_FACTOR * traced)
            floors[expr] = max(floors.get(expr, 0), floor)
    return caps, floors, derived


def _fit_data_dependent_sizes(planned: Mapping[Any, str], internal: set, known: Mapping[Any, Any],
                              limit: int | None) -> dict[Any, int]:
    """``{symbol: bound}`` for data-dependent sizes whose bound the engine chose (``internal``: torch.export derived
    none), halved (:func:`_fit_to_budget`) until every tensor they size fits :data:`PLANNED_TENSOR_BUDGET`, where
    one is over ``limit`` at their bounds (a plan that cannot load). Pattern: Qwen-Omni's convolutions over a count of
    audio chunks and attention over the frames a chunk mask selects planned 9 GB and 89 TB (``bad_alloc``). Data
    that gives more fails in the runtime (0x12), as the export warning says."""
    data_dependent = {s for s in internal if free_unbacked_symbols(s)}  # bounds we chose; torch's derived ones hold
    sizes = [e for e in planned if e.free_symbols & data_dependent]
    if limit is None or not sizes:
        return {}

    def fixed(sym, _caps) -> int:
        vr = known.get(sym)
        return int(vr.upper) if vr is not None and not _unbounded(vr.upper) else MIN_LENGTH_CAP

    bounds = {s: fixed(s, None) for s in data_dependent}
    if max(int(e.xreplace({s: fixed(s, None) for s in e.free_symbols})) for e in sizes) <= limit:
        return {}
    chosen, _ = _fit_to_budget(sizes, bounds, {s: 1 for s in data_dependent}, fixed)
    return {s: c for s, c in chosen.items() if c < bounds[s]}


def _warn_caps(model: str, caps: Mapping[Any, tuple[int, str, str]], internal: int, fallback: int, largest: int,
               lowered: Mapping[Any, int] | None = None) -> None:
    listing = "; ".join(f"{where} <= {cap} ({why})" for cap, why, where in caps.values())
    if internal:
        listing += f"; and {internal} internal size(s) at the largest cap, {fallback}"
    if lowered:
        listing += (f"; {len(lowered)} data-dependent size(s) bounded to fit the {PLANNED_TENSOR_BUDGET >> 20} MiB "
                    f"tensor budget ({', '.join(f'{s} <= {c}' for s, c in sorted(lowered.items(), key=str))}): an input "
                    "whose data gives more fails in the runtime (error 0x12)")
    over = (f" The largest planned tensor is still {largest / 2**20:.0f} MiB, over the "
            f"{PLANNED_TENSOR_BUDGET >> 20} MiB budget, at bounds the user stated or at the floor of "
            f"{BUDGET_FLOOR_FACTOR} x traced.") if largest > PLANNED_TENSOR_BUDGET else ""
    warnings.warn(
        f"{model}: {len(caps)} dynamic input dim(s) had no upper bound, one above max_seq_len, or one over "
        f"the memory budget, and were capped for ExecuTorch memory planning: {listing}.{over} Pass dynamic_shapes with "
        "torch.export.Dim(min=, max=) (or ExecutorchConfig.max_seq_len) to choose the bounds.",
        UnboundedDimWarning,
        stacklevel=3,
    )
