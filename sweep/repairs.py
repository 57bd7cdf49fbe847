"""Config fixes learned from a model's own ``__init__`` error, applied as overrides when the config is rebuilt.

Some default configs are not runnable as shipped: released checkpoints set fields the config class leaves None
or does not declare at all, and some head classes need a flag the base default does not set. The model's own
error says which, and :func:`learn_from_init_error` turns it into nested overrides (``{"text_config":
{"mlp_layer_types": ["dense", "sparse"]}}``) that :mod:`sweep.zoo` applies before rebuilding:

- **Undeclared attributes**: ``'XConfig' object has no attribute 'y'`` (``AttributeError.obj`` is the config
  object) sets ``y`` on that config, from the same-named field elsewhere in the tree, else by its name.
- **None fields the modeling code reads**: a ``TypeError`` about ``NoneType`` whose traceback reads
  ``config.y`` with ``y`` None sets ``y`` by its name (a per-layer type list takes the values its docstring
  quotes).
- **Flags a class requires**: "make sure that ``is_decoder=True``" sets the flag; "supports encoder-only" turns
  ``is_encoder_decoder`` off. A class that only *warns* for its flag ("add ``is_decoder=True.``") gets it too
  (:func:`required_flag`, applied by :mod:`sweep.zoo`).
- **Divisibility by heads**: "qk_channels (261) must be divisible by num_heads (4)": head counts equal to 4 become
  ``gcd(261, 4)``.
"""

from __future__ import annotations

import ast
import dataclasses
import linecache
import math
import re
from typing import Any, Iterator

from transformers import PreTrainedConfig

from sweep import shrink
from sweep.errors import failing_statements

_MISSING = object()
_FLAG = re.compile(r"`(\w+)\s*=\s*(True|False)\.?`")
_ENCODER_ONLY = re.compile(r"encoder-only", re.IGNORECASE)
_DIVISIBLE = re.compile(r"\((\d+)\) must be divisible by (\w*heads\w*) \((\d+)\)")
_CONFIG_READ = re.compile(r"\bconfig\.(\w+)")
_LOCAL_FROM_CONFIG = re.compile(r"^\s*(\w+)\s*=\s*config\.(\w+)\s*$", re.MULTILINE)
_NONE_ERROR = re.compile(r"NoneType|not subscriptable|has no len")
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


def _attr(obj: Any, key: str) -> Any:
    try:
        return getattr(obj, key, _MISSING)
    except Exception:  # noqa: BLE001 - per-layer configs refuse some global reads
        return vars(obj).get(key, _MISSING)


def _layers(obj: Any) -> int | None:
    for key in shrink.LAYER_COUNTS:
        value = _attr(obj, key)
        if shrink._is_int(value) and value > 0:
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


def value_by_name(key: str, obj: Any, profile: shrink.Profile) -> Any:
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
        return shrink._resample_pattern(values, layers) if values else None
    if shrink._is_intermediate_name(k):
        return profile.intermediate
    if k in shrink.KV_HEAD_COUNTS or k.endswith(("_kv_heads", "key_value_heads")):
        heads = _attr(obj, "num_attention_heads")
        return heads if shrink._is_int(heads) else profile.heads
    if k in shrink.HEAD_COUNTS or k.endswith("_heads"):
        return profile.heads
    if k in shrink.LAYER_COUNTS or k.endswith(("depth", "_layers")):
        return profile.layers
    if shrink._is_width_name(k):
        for width_key in shrink.PRIMARY_WIDTHS:
            width = _attr(obj, width_key)
            if shrink._is_int(width) and width > 0:
                return min(width, profile.width)
        return profile.width
    return None


def _value_for(key: str, obj: Any, config: PreTrainedConfig, profile: shrink.Profile) -> Any:
    """The same-named field elsewhere in the tree (a sibling tower's kv heads), else a value by name."""
    for _, other in config_paths(config):
        value = _attr(other, key)
        if other is not obj and value is not _MISSING and value is not None and not isinstance(value, (dict, list)):
            return value
    return value_by_name(key, obj, profile)


def _path_of(config: PreTrainedConfig, obj: Any) -> tuple[str, ...] | None:
    return next((path for path, node in config_paths(config) if node is obj), None)


def _missing_attribute(exc: BaseException, config, profile) -> dict | None:
    obj = getattr(exc, "obj", None)
    key = getattr(exc, "name", None)
    if not isinstance(exc, AttributeError) or not isinstance(obj, PreTrainedConfig) or not key:
        return None
    path = _path_of(config, obj)
    value = _value_for(key, obj, config, profile)
    if path is None or value is None:
        return None
    return nested(path, key, value)


def _unset_field_read(exc: BaseException, config, profile) -> dict | None:
    """A None field the failing code reads through ``config.<field>`` (innermost frame first)."""
    if not isinstance(exc, TypeError) or not _NONE_ERROR.search(str(exc)):
        return None
    for frame, first, line in failing_statements(exc):
        obj = frame.f_locals.get("config")
        if not isinstance(obj, PreTrainedConfig):
            continue
        keys = _CONFIG_READ.findall(line)
        # locals the failing statement reads, assigned from a config field earlier in the function
        code = frame.f_code
        body = "".join(linecache.getline(code.co_filename, n) for n in range(code.co_firstlineno, first))
        for local, key in _LOCAL_FROM_CONFIG.findall(body):
            if re.search(rf"\b{local}\b", line) and frame.f_locals.get(local, 0) is None:
                keys.append(key)
        for key in keys:
            path = _path_of(config, obj)
            if path is None or _attr(obj, key) is not None:
                continue
            value = value_by_name(key, obj, profile)
            if value is not None:
                return nested(path, key, value)
    return None


def _required_flag(exc: BaseException, config) -> dict | None:
    return required_flag(str(exc), config)


def required_flag(message: str, config) -> dict | None:
    """``{flag: value}`` when ``message`` asks for a config flag the config lacks ("make sure that `is_decoder=True`",
    "add `is_decoder=True.`"): from an ``__init__`` error, or from the warning a head class logs when it is built
    without the flag it needs (``BertLMHeadModel`` and 15 other causal-LM heads of encoder families, which
    otherwise build an encoder that attends both ways and generate() cannot decode one token at a time)."""
    found = _FLAG.search(message)
    if found and hasattr(config, found.group(1)):
        value = found.group(2) == "True"
        if getattr(config, found.group(1)) != value:
            return {found.group(1): value}
    if _ENCODER_ONLY.search(message) and getattr(config, "is_encoder_decoder", False):
        return {"is_encoder_decoder": False}
    return None


def _heads_divide(exc: BaseException, config) -> dict | None:
    found = _DIVISIBLE.search(str(exc))
    if not found:
        return None
    channels, heads = int(found.group(1)), int(found.group(3))
    new = math.gcd(channels, heads)
    out: dict = {}
    for path, obj in config_paths(config):
        fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set(vars(obj))
        for key in fields:
            if (key in shrink.HEAD_COUNTS or key.endswith("_heads")) and _attr(obj, key) == heads:
                out = merge(out, nested(path, key, new))
    return out or None


def learn_from_init_error(exc: BaseException, config: PreTrainedConfig, profile: shrink.Profile) -> dict | None:
    """Nested overrides that answer the model's ``__init__`` error, or None when it teaches nothing."""
    for learn in (lambda: _missing_attribute(exc, config, profile), lambda: _unset_field_read(exc, config, profile),
                  lambda: _required_flag(exc, config), lambda: _heads_divide(exc, config)):
        found = learn()
        if found:
            return found
    return None
