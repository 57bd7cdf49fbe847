"""A config as a tree of raw constructor arguments, and back.

transformers 5 configs are strict dataclasses whose ``__post_init__`` derives fields (``head_dim``,
``layer_types``, sliding-window patterns, default sub-configs). Shrinking a config's ``to_dict()`` would keep
those derived values stale, so :func:`raw_tree` reads a config back as the arguments that rebuild it: a field's
dataclass default where the instance holds what ``__post_init__`` derived from it, and the instance value where a
parent config passed one in. :func:`build_config` rebuilds sub-configs first, then the config, through the
classes' own validation.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from transformers import PreTrainedConfig

SKIPPED_FIELDS = {"transformers_version", "architectures", "dtype", "id2label", "label2id", "torch_dtype",
                  "_name_or_path", "output_attentions", "output_hidden_states", "return_dict"}


@dataclasses.dataclass
class Node:
    """One config in the tree: its class, its raw arguments and its sub-config children."""

    cls: type
    args: dict[str, Any]
    children: dict[str, "Node"]
    fields: frozenset[str]
    derived_patterns: dict[str, list]  # per-layer lists __post_init__ derived (raw value None)
    channel_map: dict[int, int] = dataclasses.field(default_factory=dict)  # set by the shrinker
    width_lists: set[str] = dataclasses.field(default_factory=set)  # lists the shrinker set to the tiny width

    def walk(self):
        yield self
        for child in self.children.values():
            yield from child.walk()

    def apply(self, overrides: dict[str, Any]) -> None:
        """Set fields from a nested mapping; a mapping under a sub-config's name descends into it."""
        for key, value in overrides.items():
            if key in self.children and isinstance(value, dict):
                self.children[key].apply(value)
            else:
                self.args[key] = value


@functools.cache
def _fresh_default(cls: type) -> PreTrainedConfig | None:
    try:
        return cls()
    except Exception:  # noqa: BLE001 - a config class without usable defaults: instance values are used as-is
        return None


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _init_fields(cls: type) -> list[dataclasses.Field]:
    if not dataclasses.is_dataclass(cls):
        return []
    return [f for f in dataclasses.fields(cls) if f.init and f.name not in SKIPPED_FIELDS]


def raw_tree(config: PreTrainedConfig, is_root: bool = True, from_defaults: bool = True) -> Node:
    """The raw-argument tree of ``config``.

    For a root built from no arguments (``from_defaults``) every non-config field takes its dataclass default. For
    a root someone built with arguments (a contributor's config), fields keep their values, except per-layer lists
    whose dataclass default is None: those were derived and are re-derived. For a sub-config a parent built, a
    field keeps its instance value where it differs from a fresh default instance of its class (the parent passed
    it), else its dataclass default.
    """
    cls = type(config)
    if is_root and not from_defaults:
        return _instance_tree(config)
    fresh = None if is_root else _fresh_default(cls)
    args: dict[str, Any] = {}
    children: dict[str, Node] = {}
    derived: dict[str, list] = {}
    fields = _init_fields(cls)
    for field in fields:
        value = _read(config, field.name)
        if isinstance(value, PreTrainedConfig):
            children[field.name] = raw_tree(value, is_root=False)
            continue
        default = _field_default(field)
        if is_root or fresh is None:
            raw = default if default is not dataclasses.MISSING else value
            if is_root and fresh is None and default is dataclasses.MISSING:
                raw = value
        else:
            raw = value if _differs(value, _read(fresh, field.name)) else default
        if raw is dataclasses.MISSING:
            raw = value
        if isinstance(raw, tuple) and (isinstance(value, list) or "list[" in str(field.type)):
            raw = list(raw)  # tuple defaults of list-typed fields: modeling code concatenates them with lists
        if raw is None and isinstance(value, (list, tuple)) and value:
            derived[field.name] = list(value)
        if raw is None and isinstance(value, dict) and value and (
                any(isinstance(v, (list, dict)) for v in value.values()) or all(str(k).isdigit() for k in value)):
            raw = value  # a derived structured default (multimodal rope sections) is kept so it can be rescaled
        args[field.name] = raw
    if not is_root and fresh is not None:
        # Extra keyword arguments a parent passed that are no dataclass field (kept as plain attributes).
        known = {f.name for f in fields} | set(vars(fresh))
        for key, value in vars(config).items():
            if key not in known and not key.startswith("_") and not isinstance(value, PreTrainedConfig):
                args[key] = value
        for key, value in vars(config).items():
            # a backbone's out_features/out_indices a parent passed (UperNet's four stages), kept behind a property
            public = key.lstrip("_")
            if (key.startswith("_") and public not in args and isinstance(getattr(cls, public, None), property)
                    and value is not None and _differs(value, vars(fresh).get(key))):
                args[public] = value
    for key, child in list(children.items()):
        native = _native_backbone(cls, key, child)
        if native is not None:
            children[key] = native
            if "use_timm_backbone" in {f.name for f in fields}:
                args["use_timm_backbone"] = False
    for key in getattr(cls, "sub_configs", {}) or {}:
        value = getattr(config, key, None)
        if isinstance(value, PreTrainedConfig) and key not in children:
            children[key] = raw_tree(value, is_root=False)
    for key in children:
        args.pop(key, None)
    _publish_private_fields(cls, args)
    return Node(cls=cls, args=args, children=children, fields=frozenset(f.name for f in fields),
                derived_patterns=derived)


def _publish_private_fields(cls: type, args: dict[str, Any]) -> None:
    """``_out_indices`` stored behind an ``out_indices`` property is passed by its public name."""
    for key in [k for k in args if k.startswith("_")]:
        public = key.lstrip("_")
        if isinstance(getattr(cls, public, None), property):
            args[public] = args.pop(key)


def _instance_tree(config: PreTrainedConfig) -> Node:
    cls = type(config)
    fields = _init_fields(cls)
    args, children, derived = {}, {}, {}
    for field in fields:
        value = _read(config, field.name)
        if isinstance(value, PreTrainedConfig):
            children[field.name] = raw_tree(value, is_root=False)
        elif value is dataclasses.MISSING:
            continue
        elif _field_default(field) is None and isinstance(value, (list, tuple)) and value:
            derived[field.name] = list(value)
            args[field.name] = None
        else:
            args[field.name] = value
    return Node(cls=cls, args=args, children=children, fields=frozenset(f.name for f in fields),
                derived_patterns=derived)


def _native_backbone(cls: type, key: str, child: Node) -> Node | None:
    """A transformers-native backbone in place of a timm one (timm needs torchvision, and a named timm model
    would be built at full size): the config class's declared default sub-config, else a ResNet."""
    if child.cls.__name__ != "TimmBackboneConfig":
        return None
    from transformers import CONFIG_MAPPING

    spec = (getattr(cls, "sub_configs_defaults", {}) or {}).get(key)
    model_type = getattr(spec, "model_type", None) or "resnet"
    init_kwargs = dict(getattr(spec, "init_kwargs", None) or {})
    out_indices = child.args.get("out_indices")
    if out_indices and "out_features" not in init_kwargs:
        init_kwargs["out_indices"] = list(out_indices)
    return raw_tree(CONFIG_MAPPING[model_type](**init_kwargs), is_root=False)


def _read(config: PreTrainedConfig, name: str) -> Any:
    """A field's value; per-layer configs refuse to read some global attributes, then the stored one is used."""
    try:
        return getattr(config, name, dataclasses.MISSING)
    except Exception:  # noqa: BLE001 - e.g. AmbiguousGlobalPerLayerAttributeError
        return vars(config).get(name, dataclasses.MISSING)


def _differs(a: Any, b: Any) -> bool:
    try:
        return bool(a != b)
    except Exception:  # noqa: BLE001 - tensors and odd objects: treat as different so the value is kept
        return True


def build_config(node: Node) -> PreTrainedConfig:
    """Rebuild the config: sub-configs first, then this one, through the class's own validation."""
    kwargs = dict(node.args)
    for key, child in node.children.items():
        kwargs[key] = build_config(child)
    return node.cls(**kwargs)
