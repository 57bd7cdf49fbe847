"""Flattening of transformers containers: ``Cache`` objects, their layers and ``ModelOutput``.

One generic mechanism, by reflection over instance attributes, serves three clients:

- :func:`get_leaf_tensors` names every tensor leaf of any nesting (``logits``, ``past_key_values.0.keys``).
  That naming is the contract every runner and report uses.
- :func:`register_pytree_nodes` registers every ``Cache`` and cache-layer class with ``torch.utils._pytree``
  so a cache can be both an input and an output of an exported graph.
- :func:`map_structure` rebuilds a nesting with each tensor replaced (dynamic-shape specs, casts, copies).

How an object is split: attributes holding tensors, tensor containers or other cache objects are
*children*; everything else (ints, flags, dtypes, classes, ``None`` slots) is *static context*, restored
as-is on unflatten. Static attributes that are symbolic during a trace (shape-following counters) are recorded as ``None``.
A ``Cache``'s ``layers`` list is transparent: its layers are children named by index,
so the first layer's keys are ``past_key_values.0.keys``, not ``past_key_values.layers.0.keys``.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import functools
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree
from transformers import cache_utils
from transformers.utils import ModelOutput

from engine.stacked_rows import RaggedRows, StackedRows

# Base classes whose concrete subclasses are flattened by reflection.
_CACHE_BASES: tuple[type, ...] = (
    cache_utils.Cache,
    cache_utils.CacheLayerMixin,
    cache_utils.LinearAttentionCacheLayerMixin,
    cache_utils.DummyLayer,
)
_LAYERS = "layers"


@functools.cache
def is_standalone_cache_class(cls: type) -> bool:
    """A cache that transformers keeps outside its ``Cache`` hierarchy: a plain class named ``*Cache`` or
    ``*CacheLayer`` defined in a transformers module (``ReformerDynamicCache``, ``xLSTMCache``, the streaming
    models' ``*Conv1dPaddingCache`` and their layers). Models return them (and ``generate`` feeds them back) like
    any cache, so they are flattened by the same reflection; unregistered, torch.export rejects them ("Found
    <class ...> in output, which is not a known type", pytorch/pytorch#146835)."""
    return (
        cls.__module__.startswith("transformers.")
        and cls.__name__.endswith(("Cache", "CacheLayer"))
        and not issubclass(cls, (torch.nn.Module, torch.Tensor, Mapping, tuple, list))
        and not dataclasses.is_dataclass(cls)
    )


def is_cache_object(obj: Any) -> bool:
    """True for ``Cache`` instances, cache-layer instances and standalone caches (the reflected types)."""
    return isinstance(obj, _CACHE_BASES) or is_standalone_cache_class(type(obj))


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor) or is_cache_object(value):
        return True
    if isinstance(value, Mapping):
        return any(_holds_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(v) for v in value)
    return False


# ─── Reflection: object <-> (children, context) ───────────────────────────────────────────────

def _snapshot(value: Any) -> Any:
    """A static attribute as the spec keeps it: a copy (the forward may mutate it later: a {0: None} state dict gets
    its tensors), with each symbolic scalar as None. A counter that follows the input shape (a sliding layer's
    ``cumulative_length``, DeepSeek-V4's per-compressor ``entry_count`` dict) is symbolic while tracing; a frozen
    spec cannot hold it, and deep-copying it copies its shape env's fake tensors, which have no data."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return None
    if type(value) is dict:
        return {k: _snapshot(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_snapshot(v) for v in value)
    return copy.deepcopy(value)


def _split(obj: Any) -> tuple[list[tuple[str, Any]], tuple[str, int, tuple[str, ...], dict[str, Any]]]:
    """Return ``(named_children, context)`` for a cache object.

    ``context = (class path, number of layers, child attribute names, static attributes)``.
    """
    state = vars(obj)
    layers = state.get(_LAYERS) if isinstance(obj, cache_utils.Cache) else None
    named: list[tuple[str, Any]] = []
    if layers is not None:
        named.extend((str(i), layer) for i, layer in enumerate(layers))
    attr_children: list[str] = []
    static: dict[str, Any] = {}
    for name, value in state.items():
        if layers is not None and name == _LAYERS:
            continue
        if _holds_tensors(value):
            attr_children.append(name)
            named.append((name, value))
        else:
            static[name] = _snapshot(value)
    n_layers = -1 if layers is None else len(layers)
    cls = type(obj)
    return named, (f"{cls.__module__}.{cls.__qualname__}", n_layers, tuple(attr_children), static)


def _rebuild(children: list[Any], context: tuple) -> Any:
    """Inverse of :func:`_flatten`: ``children`` are ``[layers list]`` (for a Cache) + attribute children."""
    class_path, n_layers, attr_children, static = context
    cls = _import_class(class_path)
    obj = cls.__new__(cls)
    # static state is shared by every unflatten of the same spec: copy it so objects never alias
    state = copy.deepcopy(static)
    names = ((_LAYERS,) if n_layers >= 0 else ()) + attr_children
    state.update(zip(names, children))
    obj.__dict__.update(state)
    return obj


def _import_class(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _flatten(obj: Any) -> tuple[list[Any], tuple]:
    """Pytree children: a Cache's ``layers`` list is one child, so key paths are real attribute paths
    (``.layers[0].keys``); torch.export's input guards re-read inputs through those paths."""
    _, context = _split(obj)
    n_layers, attr_children = context[1], context[2]
    names = ((_LAYERS,) if n_layers >= 0 else ()) + attr_children
    return [getattr(obj, n) for n in names], context


def _flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], tuple]:
    _, context = _split(obj)
    n_layers, attr_children = context[1], context[2]
    names = ((_LAYERS,) if n_layers >= 0 else ()) + attr_children
    return [(pytree.GetAttrKey(n), getattr(obj, n)) for n in names], context


def _flatten_spec(obj: Any, spec: pytree.TreeSpec) -> list[Any]:
    return _flatten(obj)[0]


# ─── Pytree registration ─────────────────────────────────────────────────────────────────────

def _to_json(value: Any) -> Any:
    """Encode a static attribute for ``treespec_dumps`` (used when an artifact stores its treespec)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {"__map__": [[_to_json(k), _to_json(v)] for k, v in value.items()]}
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"__device__": str(value)}
    if isinstance(value, type):
        return {"__class__": f"{value.__module__}.{value.__qualname__}"}
    return {"__repr__": repr(value)}  # lossy, but a dumped spec is only read back for structure


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, dict):
        if "__map__" in value:
            return {_from_json(k): _from_json(v) for k, v in value["__map__"]}
        if "__dtype__" in value:
            return getattr(torch, value["__dtype__"])
        if "__device__" in value:
            return torch.device(value["__device__"])
        if "__class__" in value:
            return _import_class(value["__class__"])
        return value.get("__repr__")
    return value


def _dump_context(context: tuple) -> str:
    class_path, n_layers, attr_children, static = context
    return json.dumps([class_path, n_layers, list(attr_children), _to_json(static)])


def _load_context(text: str) -> tuple:
    class_path, n_layers, attr_children, static = json.loads(text)
    return class_path, n_layers, tuple(attr_children), _from_json(static)


def _all_subclasses(base: type) -> list[type]:
    seen: list[type] = []
    stack = [base]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.append(sub)
                stack.append(sub)
    return seen


def register_pytree_node_for(cls: type) -> bool:
    """Register one cache (or cache-layer) class with torch pytree; False if it is already registered."""
    if cls in pytree.SUPPORTED_NODES:
        return False
    pytree.register_pytree_node(
        cls,
        _flatten,
        _rebuild,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        to_dumpable_context=_dump_context,
        from_dumpable_context=_load_context,
        flatten_with_keys_fn=_flatten_with_keys,
    )
    # ExportedProgram.module() flattens its inputs with torch.fx's own registry
    fx_pytree.register_pytree_flatten_spec(cls, _flatten_spec)
    return True


#: transformers modules already searched for standalone cache classes
_SEARCHED_MODULES: set[str] = set()


def _standalone_cache_classes() -> list[type]:
    """The standalone cache classes of every transformers module loaded since the last call."""
    found = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformers.models.") or name in _SEARCHED_MODULES or module is None:
            continue
        _SEARCHED_MODULES.add(name)
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name and is_standalone_cache_class(value):
                found.append(value)
    return found


def register_pytree_nodes(*objects: Any) -> list[type]:
    """Register every loaded ``Cache``/cache-layer class and standalone cache, and the types of any ``objects``.

    Subclasses defined in modeling files exist only once their module is imported, so exporters call
    this with the sample inputs and the eager outputs: whatever cache type a model uses gets registered.
    ``ModelOutput`` subclasses register themselves in transformers; any that did not are registered here.
    Returns the newly registered classes.
    """
    new = []
    for base in _CACHE_BASES:
        for cls in [base, *_all_subclasses(base)]:
            if register_pytree_node_for(cls):
                new.append(cls)
    for cls in _standalone_cache_classes():
        if register_pytree_node_for(cls):
            new.append(cls)
    for obj in objects:
        for value in _walk_objects(obj):
            if (isinstance(value, ModelOutput) or is_cache_object(value)) and register_type(type(value)):
                new.append(type(value))
    return new


def register_type(cls: type) -> bool:
    """Register a ``ModelOutput`` subclass or a cache class with torch pytree (what a ``.pt2`` names when it is loaded
    in a new process); False if it is already registered, or is neither."""
    if cls in pytree.SUPPORTED_NODES:
        return False
    if isinstance(cls, type) and issubclass(cls, ModelOutput):
        pytree.register_pytree_node(
            cls,
            lambda o: (list(o.values()), list(o.keys())),
            lambda values, keys, cls=cls: cls(**dict(zip(keys, values))),
            serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
            flatten_with_keys_fn=pytree._dict_flatten_with_keys,
        )
        return True
    if isinstance(cls, type) and (issubclass(cls, _CACHE_BASES) or is_standalone_cache_class(cls)):
        return register_pytree_node_for(cls)
    return False


def in_field_order(obj: Any) -> Any:
    """``obj`` with every ``ModelOutput`` in it (nested in tuples, lists and other ModelOutputs) holding its keys in its
    fields' declaration order, the order unflattening rebuilds.

    Pattern: a field set after construction goes last in a ModelOutput's keys (Chameleon's ``get_image_features`` sets
    ``pooler_output`` on the VQ-VAE's output), but pytree's unflatten (``cls(**dict(zip(keys, values)))``) rebuilds
    declaration order, so a pass that re-flattens the outputs (ExecuTorch's lowering) misplaces them against the
    out-spec's names. Traced in declaration order, the round trip is the identity. Upstream: TODO, no transformers issue
    found on the flatten/unflatten round trip of ModelOutput."""
    if isinstance(obj, ModelOutput):
        items = {key: in_field_order(value) for key, value in obj.items()}
        fields = dataclasses.fields(obj) if dataclasses.is_dataclass(obj) else ()
        in_order = not fields or list(items) == [f.name for f in fields if f.name in items]
        return obj if in_order and all(items[key] is obj[key] for key in items) else type(obj)(**items)
    if type(obj) in (tuple, list):
        values = [in_field_order(value) for value in obj]
        return obj if all(a is b for a, b in zip(values, obj)) else type(obj)(values)
    return obj


# ─── Naming and mapping ──────────────────────────────────────────────────────────────────────

def children(obj: Any) -> list[tuple[str, Any]] | None:
    """Named children of a container, in pytree flatten order; ``None`` for a leaf.

    Containers: cache objects, ``ModelOutput`` (non-``None`` fields), mappings, lists, tuples, dataclasses.
    """
    if isinstance(obj, torch.Tensor):
        return None
    if isinstance(obj, (StackedRows, RaggedRows)):  # a per-item list exported as one tensor: as eager names it
        return obj.named_rows()
    if is_cache_object(obj):
        return _split(obj)[0]
    if isinstance(obj, Mapping):  # ModelOutput included: it only holds its non-None fields
        return [(str(k), v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(obj)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    return None


def _walk_objects(obj: Any):
    yield obj
    for _, child in children(obj) or ():
        yield from _walk_objects(child)


def iter_leaf_tensors(obj: Any, prefix: str = ""):
    """Yield ``(dotted_name, tensor)`` for every tensor leaf, in flatten order."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
        return
    for name, child in children(obj) or ():
        yield from iter_leaf_tensors(child, f"{prefix}.{name}" if prefix else name)


def get_leaf_tensors(obj: Any) -> dict[str, torch.Tensor]:
    """Dotted-path names for every tensor leaf of ``obj``.

    Works on any nesting of tensors, dicts, lists, tuples, dataclasses, ``ModelOutput`` and ``Cache``
    objects: ``{"logits": ..., "past_key_values.0.keys": ..., "past_key_values.0.values": ...}``.
    A bare tensor is named ``""``.
    """
    return dict(iter_leaf_tensors(obj))


def spec_leaf_names(spec: pytree.TreeSpec) -> list[str]:
    """The ``get_leaf_tensors`` name of each flat leaf of ``spec`` (an exported program's in/out spec).

    The spec is unflattened with one marker tensor per leaf, whose value is its flat index, so the names are
    exactly what ``get_leaf_tensors`` gives for the real tree (cache pytrees included)."""
    markers = [torch.tensor(i) for i in range(spec.num_leaves)]
    names = [""] * spec.num_leaves
    for name, marker in iter_leaf_tensors(pytree.tree_unflatten(markers, spec)):
        names[int(marker)] = name
    return names


def pytree_attributes(obj: Any) -> list[tuple[str, Any]]:
    """A cache object's pytree children with their attribute names (a Cache's ``layers`` list comes first)."""
    values, (_, n_layers, attr_children, _) = _flatten(obj)
    return list(zip(((_LAYERS,) if n_layers >= 0 else ()) + attr_children, values))


def fill_leaves(template: Any, leaves: Mapping[str, torch.Tensor], prefix: str = "") -> Any:
    """Copy of ``template`` whose tensor leaves are taken from ``leaves`` by dotted name (``"0.keys"``...).

    Feeds a runtime's flat outputs back as the nested inputs of the next step (a cache object)."""
    names = iter(name for name, _ in iter_leaf_tensors(template, prefix))
    missing = [n for n, _ in iter_leaf_tensors(template, prefix) if n not in leaves]
    if missing:
        raise KeyError(f"no tensor for leaf/leaves {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    return map_structure(template, lambda _: leaves[next(names)])


def map_structure(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Copy of ``obj`` with every tensor leaf replaced by ``fn(tensor)``; cache objects are rebuilt."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if is_cache_object(obj):
        values, context = _flatten(obj)
        return _rebuild([map_structure(v, fn) for v in values], context)
    if isinstance(obj, ModelOutput):
        return type(obj)(**{k: map_structure(v, fn) for k, v in obj.items()})
    if isinstance(obj, Mapping):
        return {k: map_structure(v, fn) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_structure(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_structure(v, fn) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: map_structure(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init})
    return obj
