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

from engine.pytree import is_cache_object, iter_leaf_tensors, pytree_attributes

logger = logging.getLogger("engine")


class SpecialisationWarning(UserWarning):
    """An input dim asked to be dynamic was exported as a static size."""


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
    """A cache layer's child: keys/values grow along the sequence; a state beside them that holds one entry per
    cached token (DeepSeek-V3.2's ``indexer_keys`` [batch, seq, dim]: a dim the size of the keys' sequence, when
    that is > 1) grows along it too; every other state is ``[batch, <model constants>]`` (a Mamba conv state is
    [batch, conv_dim, kernel]). Marking those constants ``Dim.AUTO`` makes torch.export reason about symbols
    that can never vary: a Mamba2 decode export took 7.0 s instead of 4.x s."""
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


def _leaf_specs(value: Any, spec: Any) -> list[Any]:
    """The spec of each tensor leaf of ``value``, in flatten order (``None`` where none was given)."""
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
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    user_tensor_inputs = [
        spec.arg.name
        for spec in program.graph_signature.input_specs
        if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT
        and isinstance(spec.arg, torch.export.graph_signature.TensorArgument)
    ]
    if len(user_tensor_inputs) != len(leaves):
        logger.debug("specialisation report skipped: %d placeholders for %d leaves", len(user_tensor_inputs), len(leaves))
        return []
    out = []
    for (name, tensor), leaf_spec, placeholder in zip(leaves, leaf_specs, user_tensor_inputs):
        val = placeholders[placeholder].meta.get("val")
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
