"""Lessons from a model's ``__init__`` error: the nested config overrides that answer it.

:func:`learn_from_init_error` returns them: an undeclared attribute, a None field the code reads, a flag the class
needs (:func:`required_flag`, also read from the warning a head class logs), head or group counts that must divide a width,
a multimodal RoPE section list the code assumes. None when the error teaches nothing; the caller then reports it as
it is. Applied on rebuild by :mod:`sweep.zoo.build` and :mod:`sweep.zoo.completion`; the values a fix fills in come
from :mod:`sweep.zoo.repairs`, the failing frames from :mod:`sweep.zoo.frames`.
"""

from __future__ import annotations

import dataclasses
import inspect
import linecache
import math
import re

from transformers import PreTrainedConfig

from sweep.zoo import repairs
from sweep.zoo.fields import HEAD_COUNTS, KV_HEAD_COUNTS, proportional
from sweep.zoo.frames import failing_statements
from sweep.zoo.profiles import Profile

_FLAG = re.compile(r"`(\w+)\s*=\s*(True|False)\.?`")
_ENCODER_ONLY = re.compile(r"encoder-only", re.IGNORECASE)
_DIVISIBLE = re.compile(r"\((\d+)\) must be divisible by (\w*(?:heads|groups)\w*) \((\d+)\)")
_CONFIG_READ = re.compile(r"\bconfig\.(\w+)")
_LOCAL_FROM_CONFIG = re.compile(r"^\s*(\w+)\s*=\s*config\.(\w+)\s*$", re.MULTILINE)
_NONE_ERROR = re.compile(r"NoneType|not subscriptable|has no len")


def learn_from_init_error(exc: BaseException, config: PreTrainedConfig, profile: Profile) -> dict | None:
    """Nested overrides that answer the model's ``__init__`` error, or None when it teaches nothing."""
    for learn in (lambda: _missing_attribute(exc, config, profile), lambda: _unset_field_read(exc, config, profile),
                  lambda: required_flag(str(exc), config), lambda: _heads_divide(exc, config),
                  lambda: _assumed_rope_sections(exc, config)):
        found = learn()
        if found:
            return found
    return None


#: a multimodal RoPE section list the modeling code assumes when the config has none
_ASSUMED_SECTIONS = re.compile(r"""rope_parameters\.get\(\s*["']mrope_section["']\s*,\s*\[([\d,\s]+)\]\s*\)""")


def _assumed_rope_sections(exc: BaseException, config) -> dict | None:
    """An ``__init__`` that failed in a function reading ``rope_parameters.get("mrope_section", [22, 22, 20])``
    (Ernie 4.5 VL): that default is sized for the checkpoint's head dim, so the config gets it rescaled to half the
    shrunk head dim, in the config object the function was handed."""
    for frame, _, _ in failing_statements(exc):
        obj = frame.f_locals.get("config")
        if not isinstance(obj, PreTrainedConfig) or (getattr(obj, "rope_parameters", None) or {}).get("mrope_section"):
            continue
        try:
            source = inspect.getsource(frame.f_code)
        except (OSError, TypeError):
            continue
        found = _ASSUMED_SECTIONS.search(source)
        path = repairs.path_of(config, obj)
        heads = getattr(obj, "num_attention_heads", None)
        head_dim = getattr(obj, "head_dim", None) or (obj.hidden_size // heads if heads else None)
        if found and path is not None and head_dim:
            sections = [int(v) for v in found.group(1).split(",") if v.strip()]
            return repairs.nested(path, "rope_parameters", {**(obj.rope_parameters or {}),
                                                            "mrope_section": proportional(sections, head_dim // 2)})
    return None


def _missing_attribute(exc: BaseException, config, profile) -> dict | None:
    obj = getattr(exc, "obj", None)
    key = getattr(exc, "name", None)
    if not isinstance(exc, AttributeError) or not isinstance(obj, PreTrainedConfig) or not key:
        return None
    path = repairs.path_of(config, obj)
    value = repairs.value_for(key, obj, config, profile)
    if path is None or value is None:
        return None
    return repairs.nested(path, key, value)


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
            path = repairs.path_of(config, obj)
            if path is None or repairs.attr(obj, key) is not None:
                continue
            value = repairs.value_by_name(key, obj, profile)
            if value is not None:
                return repairs.nested(path, key, value)
    return None


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
    """A head count, or a GroupNorm's group count (Bit's num_groups=32 over 8 channels), that must divide a width
    the zoo shrank: every such count of that value becomes its greatest common divisor with the width."""
    found = _DIVISIBLE.search(str(exc))
    if not found:
        return None
    channels, count = int(found.group(1)), int(found.group(3))
    groups = "groups" in found.group(2)
    new = math.gcd(channels, count)
    out: dict = {}
    for path, obj in repairs.config_paths(config):
        fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set(vars(obj))
        for key in fields:
            named = (key.endswith("groups") and key not in KV_HEAD_COUNTS) if groups else (
                key in HEAD_COUNTS or key.endswith("_heads"))
            if named and repairs.attr(obj, key) == count:
                out = repairs.merge(out, repairs.nested(path, key, new))
    return out or None
