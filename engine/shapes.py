"""Dynamic shapes: the ``dynamic=True`` spec, and the report of dims torch.export made static anyway.

``dynamic=True`` marks every dim of every tensor leaf ``Dim.AUTO``, cache leaves included (a cache object's
spec is the list of its pytree children's specs, which is what torch.export expects of a custom node), except
the model's constants: a cache layer's keys/values keep their heads and head_dim static, its recurrent states
(conv, SSM, linear-attention) everything but the batch, and an image tensor
whose height and width are the config's ``image_size`` keeps those and its channels static (the image
processor resizes every image to that size; symbolic heights and widths through windowed or patch-merging
vision models make torch.export's symbolic reasoning take minutes, e.g. 336 s instead of 2 s for a tiny Swin).
``Dim.AUTO`` lets torch.export *decide*: a dim traced at size 1, or tied to a constant (an image count, a
fixed number of positions), is silently specialised, and the program then accepts only that size. That is
the most common surprise for users of torch.export, so after every dynamic export the requested dims are
compared with the program's placeholders and each one that came out static is named in one warning.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import Dim

from transformers import cache_utils
from transformers.utils import ModelOutput

from engine.fake_mode import program_shape_env
from engine.input_checks import user_input_placeholders
from engine.pytree import is_cache_object, iter_leaf_tensors, pytree_attributes

logger = logging.getLogger("engine")


class SpecialisationWarning(UserWarning):
    """An input dim asked to be dynamic that the program fixes to one static size."""


def _is_custom_node(obj: Any) -> bool:
    """Registered pytree classes (caches, ModelOutput): torch.export wants their spec as a list of children."""
    return is_cache_object(obj) or isinstance(obj, ModelOutput)


def _pytree_children(obj: Any) -> list[Any] | None:
    """Children in the order torch.export pairs them with a dynamic-shapes spec."""
    if is_cache_object(obj):
        return [value for _, value in pytree_attributes(obj)]
    if isinstance(obj, Mapping):
        return list(obj.values())
    if isinstance(obj, (list, tuple)):
        return list(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    return None


#: cache layers hold keys/values as [batch, heads, seq, head_dim]: heads and head_dim are the model's own;
#: the sequence may be empty (a decode step over the cache as it is before the prompt computes the prefill)
_KV_DYNAMIC_DIMS = {0: Dim.AUTO, 2: Dim.AUTO(min=0)}


def _batch_only(value: Any) -> Any:
    """The spec of a recurrent state (conv/SSM/linear-attention states, lists of them): only the batch varies."""
    if isinstance(value, torch.Tensor):
        return {0: Dim.AUTO} if value.ndim else None
    if isinstance(value, Mapping):
        return {k: _batch_only(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_batch_only(v) for v in value)
    return None


def _cache_layer_specs(layer: Any) -> list[Any]:
    """The specs of a cache layer's children (see :func:`_cache_layer_spec`), in attribute order."""
    children = pytree_attributes(layer)
    keys = dict(children).get("keys")
    sequence = keys.shape[2] if isinstance(keys, torch.Tensor) and keys.ndim == 4 else None
    return [_cache_layer_spec(name, value, sequence) for name, value in children]


def _cache_layer_spec(name: str, value: Any, sequence: int | None = None) -> Any:
    """A cache layer's child: keys/values grow along the sequence; a state beside them that holds one entry per cached
    token (DeepSeek-V3.2's ``indexer_keys`` [batch, seq, dim]: a dim the size of the keys' sequence, when that is > 1)
    grows along it too; every other state is ``[batch, <model constants>]`` (a Mamba conv state is [batch, conv_dim,
    kernel]). Marking those constants ``Dim.AUTO`` would make torch.export reason about symbols that can never vary,
    which only slows the export."""
    if name in ("keys", "values") and isinstance(value, torch.Tensor) and value.ndim == 4:
        return dict(_KV_DYNAMIC_DIMS)
    if sequence is not None and sequence > 1 and isinstance(value, torch.Tensor) and value.ndim >= 2:
        return {0: Dim.AUTO, **{d: Dim.AUTO(min=0) for d in range(1, value.ndim) if value.shape[d] == sequence}}
    return _batch_only(value)


def config_values(config: Any, keys: tuple[str, ...]) -> list[tuple[str, Any]]:
    """``(dotted key, value)`` for every ``key`` in the config's dict, nested sub-configs included."""
    found: list[tuple[str, Any]] = []

    def walk(d: Mapping, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, Mapping):
                walk(v, f"{prefix}{k}.")
            elif k in keys:
                found.append((prefix + k, v))

    if config is not None and hasattr(config, "to_dict"):
        walk(config.to_dict(), "")
    return found


def configured_image_sizes(config: Any) -> set[tuple[int, int]]:
    """Every ``(height, width)`` an ``image_size`` in ``config`` or its sub-configs names."""
    sizes: set[tuple[int, int]] = set()
    for _, size in config_values(config, ("image_size",)):
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            sizes.add((size, size))
        elif isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(s, int) for s in size):
            sizes.add((size[0], size[1]))
    return sizes


def _tensor_spec(value: torch.Tensor, image_sizes: set[tuple[int, int]]) -> dict[int, Any]:
    dims = range(value.ndim)
    if value.is_floating_point() and value.ndim >= 4 and tuple(value.shape[-2:]) in image_sizes:
        dims = range(value.ndim - 3)  # channels, height, width: the model's constants
    return {d: Dim.AUTO for d in dims}


def auto_dynamic_shapes(inputs: Mapping[str, Any], model_config: Any = None) -> dict[str, Any]:
    """``{name: spec}`` marking every dim of every tensor leaf ``Dim.AUTO``, except the model's constants: the
    heads and head_dim of a cache layer's keys/values (left symbolic, a cross-attention cache's head count is
    tied to nothing in the graph, and ONNX attention needs it static), and the channels, height and width of an
    image tensor at the size ``model_config`` declares (see the module docstring)."""
    image_sizes = configured_image_sizes(model_config)

    def spec(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return _tensor_spec(value, image_sizes)
        kids = _pytree_children(value)
        if kids is None:
            return None
        if isinstance(value, Mapping) and not _is_custom_node(value):
            return {k: spec(v) for k, v in value.items()}
        if isinstance(value, tuple):
            return tuple(spec(v) for v in kids)
        if is_cache_object(value) and not isinstance(value, cache_utils.Cache):  # a layer: children by attribute
            return _cache_layer_specs(value)
        return [spec(v) for v in kids]

    return {name: spec(value) for name, value in inputs.items()}


def widen_unit_dims(inputs: Mapping[str, Any], dynamic_shapes: Mapping[str, Any]) -> dict[str, Any] | None:
    """``inputs`` with every size-1 dim that ``dynamic_shapes`` marks ``Dim.AUTO`` repeated to size 2 (top-level tensors
    only, not a cache's dims); ``None`` when there is none.

    Pattern: torch.export specialises a dynamic dim traced at 0 or 1, so a Whisper exported with a one-token decoder
    prompt rejects three tokens ("Guard failed: decoder_input_ids.size()[1] == 1"); ``backed_size_oblivious`` does not
    hold through transformers' code on torch 2.13. The repeated size-1 slice is a valid input of the same kinds; the
    program traced at it is kept only where it reproduces the eager outputs at the size-1 sample
    (:meth:`~engine.exporter_dynamo.DynamoExporter.trace`)."""
    widened, changed = dict(inputs), False
    for name, value in inputs.items():
        spec = dynamic_shapes.get(name) if isinstance(dynamic_shapes, Mapping) else None
        if not isinstance(value, torch.Tensor) or not isinstance(spec, Mapping):
            continue
        for dim, hint in spec.items():
            if hint is Dim.AUTO and value.shape[dim] == 1:
                value = torch.cat([value, value], dim=dim)
                changed = True
        widened[name] = value
    return widened if changed else None


def _leaf_specs(value: Any, spec: Any) -> list[Any]:
    """The spec of each tensor leaf of ``value``, in flatten order (``None`` where none is given)."""
    if isinstance(value, torch.Tensor):
        return [spec]
    kids = _pytree_children(value)
    if kids is None:
        return []
    if isinstance(value, Mapping) and not _is_custom_node(value):
        specs = [spec.get(k) for k in value] if isinstance(spec, Mapping) else [None] * len(kids)
    else:
        specs = list(spec) if isinstance(spec, (list, tuple)) and len(spec) == len(kids) else [None] * len(kids)
    return [s for kid, kid_spec in zip(kids, specs) for s in _leaf_specs(kid, kid_spec)]


def _requested_dims(spec: Any) -> list[int]:
    if isinstance(spec, Mapping):
        return [d for d, v in spec.items() if v is not None and v is not Dim.STATIC]
    if isinstance(spec, (list, tuple)):
        return [d for d, v in enumerate(spec) if v is not None and v is not Dim.STATIC]
    return []


@dataclass(frozen=True)
class SpecialisedDim:
    input_name: str
    dim: int
    traced_size: int

    def __str__(self) -> str:
        return f"{self.input_name} dim {self.dim} (traced size {self.traced_size})"


def specialised_dims(program: torch.export.ExportedProgram, inputs: Mapping[str, Any], dynamic_shapes: Any) -> list[SpecialisedDim]:
    """Dims requested dynamic in ``dynamic_shapes`` that the exported program accepts at one size only."""
    if not isinstance(dynamic_shapes, Mapping):
        return []
    leaves = [(name, t) for key, value in inputs.items() for name, t in iter_leaf_tensors(value, key)]
    leaf_specs = [s for key, value in inputs.items() for s in _leaf_specs(value, dynamic_shapes.get(key))]
    placeholders = user_input_placeholders(program)
    if len(placeholders) != len(leaves):
        logger.debug("specialisation report skipped: %d placeholders for %d leaves", len(placeholders), len(leaves))
        return []
    out = []
    for (name, tensor), leaf_spec, placeholder in zip(leaves, leaf_specs, placeholders):
        val = placeholder.meta.get("val")
        if val is None:
            continue
        for d in _requested_dims(leaf_spec):
            if d < val.ndim and _is_static(val.shape[d], program):
                out.append(SpecialisedDim(name, d, int(tensor.shape[d])))
    return out


def _is_static(size: Any, program: torch.export.ExportedProgram) -> bool:
    if isinstance(size, int):
        return True
    expr = size.node.expr
    if expr.is_number:
        return True
    if expr in program.range_constraints:
        vr = program.range_constraints[expr]
        return vr.lower == vr.upper
    return False


def warn_specialised(model_name: str, dims: list[SpecialisedDim]) -> None:
    if not dims:
        return
    listing = "; ".join(map(str, dims))
    message = (
        f"{model_name}: {len(dims)} input dim(s) asked to be dynamic were exported as static sizes, so the program "
        f"accepts only these sizes: {listing}. Trace with sizes > 1 and distinct across dims, or pass explicit "
        f"dynamic_shapes to get an error naming the cause."
    )
    warnings.warn(message, SpecialisationWarning, stacklevel=4)


# ── Lower bounds derived from the 0/1-specialisation floor ─────────────────────────────────────────
# torch.export traces a Dim.AUTO dim as if it were >= 2 and leaves that floor unchecked: a size of 0 or 1 runs
# the same graph (a decode step traced with two tokens takes one; over an empty cache it computes the prefill).
# A dim tied by a guard to a sum of such dims gets the sum of their floors as a *checked* bound: a decode step's
# attention mask, as long as the cache plus the new tokens, must be >= 2 + 2 = 4, so a one- to three-token prompt
# was rejected over the empty cache, although each of its parts would pass.

FLOOR = 2  # torch.export's unchecked lower bound of a backed dynamic dim


def relax_floor_derived_lower_bounds(program: torch.export.ExportedProgram) -> dict[Any, tuple[int, int]]:
    """Recomputes each input dim's lower bound above :data:`FLOOR` from the guards that imply it (or, for a dim
    torch.export replaced by an expression of others, from that expression), with every other dim at the floor it is
    really checked against (0); where the guards then imply no more than the floor, the dim gets the floor, left
    unchecked like the dims it is made of. A bound a guard states on the dim alone (a ``torch._check``, a kernel size)
    is kept. Updates ``range_constraints`` and the shape env; returns ``{symbol: (old lower, new lower)}``. Only for
    dims whose spec is ``Dim.AUTO`` without a minimum (the ``dynamic=True`` spec): an explicit ``Dim(min=...)`` is the
    user's bound."""
    import sympy
    from torch.utils._sympy.solve import try_solve
    from torch.utils._sympy.value_ranges import ValueRanges

    shape_env = program_shape_env(program)
    ranges = program._range_constraints
    # a plain integer bound (torch's int_oo calls itself finite and integer, but is neither sympy.Integer nor an int)
    raised = [s for s, vr in ranges.items() if isinstance(vr.lower, sympy.Integer) and int(vr.lower) > FLOOR]
    if shape_env is None or not raised:
        return {}
    relaxed_ranges = {s: (ValueRanges(0, vr.upper) if vr.lower == FLOOR else vr) for s, vr in ranges.items()}
    guards = [g.expr for g in shape_env.guards if isinstance(g.expr, sympy.Rel)]
    changed: dict[Any, tuple[int, int]] = {}
    for symbol in raised:
        try:
            if not symbol.is_symbol:  # an input dim torch.export replaced by an expression of others (mask = cache + tokens)
                implied = [_relaxed_lower(symbol, relaxed_ranges)]
            else:  # a dim of its own, bounded by guards that tie it to others
                implied = []
                for guard in (g for g in guards if symbol in g.free_symbols):
                    solved = try_solve(guard, symbol)
                    if solved is not None and isinstance(solved[0], (sympy.Ge, sympy.Gt, sympy.Eq)):
                        lower = _relaxed_lower(solved[1], relaxed_ranges)
                        implied.append(None if lower is None else lower + int(isinstance(solved[0], sympy.Gt)))
        except Exception as e:  # sympy could not bound it: torch.export's bound stands
            logger.debug("lower bound of %s kept: %s", symbol, e)
            continue
        if not implied or None in implied:
            continue  # a bound we cannot read as a sum of dims: kept
        lower = max(FLOOR, *implied)
        old = int(ranges[symbol].lower)
        if lower < old:
            ranges[symbol] = ValueRanges(lower, ranges[symbol].upper)
            if symbol in shape_env.var_to_range:
                shape_env.var_to_range[symbol] = ValueRanges(lower, shape_env.var_to_range[symbol].upper)
            changed[symbol] = (old, lower)
    return changed


def _relaxed_lower(expr: Any, relaxed_ranges: Mapping) -> int | None:
    """The lower bound of ``expr`` with dims at their relaxed floors, when ``expr`` is a sum of dims (non-negative
    integer multiples of symbols, plus a constant); ``None`` for anything else (a division, a product of dims), whose
    bound is kept as torch.export derived it."""
    from torch.utils._sympy.value_ranges import bound_sympy

    terms = expr.as_coefficients_dict()
    if not all((t.is_Symbol or t == 1) and c.is_Integer and c >= 0 for t, c in terms.items()):
        return None
    lower = bound_sympy(expr, relaxed_ranges).lower
    return int(lower) if lower.is_finite else None
