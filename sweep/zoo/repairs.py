"""Values for config fields a default leaves unset, and the nested overrides that carry them.

Some default configs are not runnable as shipped: released checkpoints set fields the config class leaves None or
does not declare at all. When a model's ``__init__`` error names such a field (:func:`sweep.zoo.init_lessons
.learn_from_init_error`), the value comes from here: the same-named field elsewhere in the tree, the default the
config class's docstring documents, else one by the field's name (a dropout 0, a per-layer type list from the
values its docstring quotes, a width at the profile's width). :func:`merge` and :func:`nested` build the overrides
that :mod:`sweep.zoo.build` applies on rebuild.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Iterator

from transformers import PreTrainedConfig

from sweep.zoo.fields import (HEAD_COUNTS, KV_HEAD_COUNTS, LAYER_COUNTS, PRIMARY_WIDTHS, is_int,
                              is_intermediate_name, is_width_name, resample_pattern)
from sweep.zoo.profiles import Profile

MISSING = object()  # what attr() gives for a field the object does not have
_LAYER_TYPE_LISTS = re.compile(r"\w*layer_types$")


def config_paths(config: PreTrainedConfig, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every config in the tree with its attribute path from the root."""
    yield path, config
    for key, value in list(vars(config).items()):
        if isinstance(value, PreTrainedConfig) and not key.startswith("_"):
            yield from config_paths(value, path + (key,))


def nested(path: tuple[str, ...], key: str, value: Any) -> dict:
    out: dict = {key: value}
    for part in reversed(path):
        out = {part: out}
    return out


def merge(a: dict, b: dict) -> dict:
    """``b`` over ``a``, nested mappings merged."""
    out = dict(a)
    for key, value in b.items():
        out[key] = merge(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def attr(obj: Any, key: str) -> Any:
    try:
        return getattr(obj, key, MISSING)
    except Exception:  # noqa: BLE001 - per-layer configs refuse some global reads
        return vars(obj).get(key, MISSING)


def _layers(obj: Any) -> int | None:
    for key in LAYER_COUNTS:
        value = attr(obj, key)
        if is_int(value) and value > 0:
            return value
    return None


def documented_values(cls: type, key: str) -> list[str]:
    """The quoted values a config class's docstring lists for ``key`` (``"dense"`` or ``"sparse"``), in order."""
    for klass in cls.__mro__:
        doc = klass.__doc__ or ""
        found = re.search(rf"^\s*{re.escape(key)} \(.*?\n(.*?)(?=^\s*\w+ \(|\Z)", doc, re.MULTILINE | re.DOTALL)
        if found:
            return list(dict.fromkeys(re.findall(r"\"(\w+)\"", found.group(1))))
    return []


def documented_default(cls: type, key: str) -> Any:
    """The literal a config class's docstring gives as ``key``'s default (``defaults to `[3, 2, 2]` ``), or None."""
    for klass in cls.__mro__:
        found = re.search(rf"^\s*{re.escape(key)} \([^\n]*?defaults to `([^`]+)`", klass.__doc__ or "", re.MULTILINE)
        if found:
            try:
                return ast.literal_eval(found.group(1))
            except (ValueError, SyntaxError):
                return None
    return None


def value_by_name(key: str, obj: Any, profile: Profile) -> Any:
    """A runnable value for a field the default leaves unset: the default its docstring documents, else one
    from its name (and the config holding it)."""
    documented = documented_default(type(obj), key)
    if documented is not None:
        return documented
    k = key.lower()
    if "dropout" in k or k.endswith("_prob"):
        return 0.0
    if _LAYER_TYPE_LISTS.match(k):
        values = documented_values(type(obj), key)
        layers = _layers(obj) or profile.layers
        return resample_pattern(values, layers) if values else None
    if is_intermediate_name(k):
        return profile.intermediate
    if k in KV_HEAD_COUNTS or k.endswith(("_kv_heads", "key_value_heads")):
        heads = attr(obj, "num_attention_heads")
        return heads if is_int(heads) else profile.heads
    if k in HEAD_COUNTS or k.endswith("_heads"):
        return profile.heads
    if k in LAYER_COUNTS or k.endswith(("depth", "_layers")):
        return profile.layers
    if is_width_name(k):
        for width_key in PRIMARY_WIDTHS:
            width = attr(obj, width_key)
            if is_int(width) and width > 0:
                return min(width, profile.width)
        return profile.width
    return None


def value_for(key: str, obj: Any, config: PreTrainedConfig, profile: Profile) -> Any:
    """The same-named field elsewhere in the tree (a sibling tower's kv heads), else a value by name."""
    for _, other in config_paths(config):
        value = attr(other, key)
        if other is not obj and value is not MISSING and value is not None and not isinstance(value, (dict, list)):
            return value
    return value_by_name(key, obj, profile)


def path_of(config: PreTrainedConfig, obj: Any) -> tuple[str, ...] | None:
    return next((path for path, node in config_paths(config) if node is obj), None)

