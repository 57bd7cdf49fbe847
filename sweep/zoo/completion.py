"""Completing a contributor's own config: the unset fields a model and the sweep's inputs need, filled as the
shrinker fills the catalog's configs, with no size changed.

A config that does not build or run the inputs as it is gets the shrinker's filling rules
(:func:`sweep.zoo.shrink_rules.fill_required_unset`, :func:`sweep.zoo.shrink.fill_unset_placeholder_ids`) and the
``__init__`` lessons (:func:`sweep.zoo.init_lessons.learn_from_init_error`), each only where the field is unset.
What was filled comes back by dotted path for the row to record; the given config and its file never change.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

import torch
from transformers import PreTrainedConfig

from sweep.zoo import init_lessons, repairs
from sweep.zoo.config_tree import Node, raw_tree
from sweep.zoo.fields import primary_width
from sweep.zoo.profiles import PROFILES
from sweep.zoo.shrink import fill_unset_placeholder_ids
from sweep.zoo.shrink_rules import NodeShrink, fill_required_unset

logger = logging.getLogger(__name__)

#: the sizes a completion gives a field named by size (an unset intermediate width a lesson names)
PROFILE = PROFILES[0]
#: the shrinker's per-node rules that fill fields a config leaves unset (the rules that shrink are left out)
COMPLETION_RULES = (fill_required_unset,)
INIT_REPAIRS = 8  # fields learned from the model's own __init__ errors, one per rebuild


def build_completed(build: Callable[[PreTrainedConfig], torch.nn.Module], config: PreTrainedConfig,
                    seed: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """``build(config)`` on the completed config (:func:`completed_config`), in eval mode, and every field the
    completion filled by dotted path; an ``__init__`` error whose lesson fills an unset field rebuilds with it, any
    other error is raised as it is."""
    config, completed = completed_config(config)
    for attempt in range(INIT_REPAIRS + 1):
        torch.manual_seed(seed)
        try:
            model = build(config)
        except Exception as exc:
            fix = init_lessons.learn_from_init_error(exc, config, PROFILE) if attempt < INIT_REPAIRS else None
            config, learned = with_completions(config, fix or {})
            if not learned:
                raise
            logger.info("%s: %s; completed the config with %s", type(config).__name__, exc, learned)
            completed.update(learned)
            continue
        return model.eval(), completed
    raise AssertionError("unreachable")


def completed_config(config: PreTrainedConfig) -> tuple[PreTrainedConfig, dict[str, Any]]:
    """``config`` with the unset fields :data:`COMPLETION_RULES` and the placeholder-id step fill, and those fields
    by dotted path; ``config`` itself, and no field, when they fill none (or cannot read it)."""
    try:
        root = raw_tree(config, from_defaults=False)
        before = {path: dict(node.args) for path, node in _nodes(root)}
        for _, node in _nodes(root):
            state = NodeShrink(node=node, profile=PROFILE, widths=set(), token_map={}, old_width=primary_width(node))
            for rule in COMPLETION_RULES:
                rule(state)
        fill_unset_placeholder_ids(root, PROFILE, {})
    except Exception as exc:  # noqa: BLE001 - a config the rules cannot read is built as it is
        logger.info("%s: not completed (%s: %s)", type(config).__name__, type(exc).__name__, exc)
        return config, {}
    overrides: dict = {}
    for path, node in _nodes(root):
        for key, value in node.args.items():
            if value is not None and before[path].get(key) is None:
                overrides = repairs.merge(overrides, repairs.nested(path, key, value))
    return with_completions(config, overrides)


def with_completions(config: PreTrainedConfig, overrides: dict) -> tuple[PreTrainedConfig, dict[str, Any]]:
    """A new config: ``config`` as if its file had also set the fields of nested ``overrides`` it leaves unset,
    and those fields by dotted path; ``config`` itself, and no field, when it leaves none of them unset."""
    filled = unset_only(config, overrides)
    if not filled:
        return config, {}
    return type(config).from_dict(repairs.merge(config.to_dict(), filled)), dotted(filled)


def unset_only(config: Any, overrides: dict) -> dict:
    """The part of nested ``overrides`` that sets what ``config`` (a config or a dict field of one) leaves unset:
    None, or not declared. A mapping under the name of a sub-config or of a dict field descends into it."""
    out: dict = {}
    for key, value in overrides.items():
        current = config.get(key) if isinstance(config, dict) else repairs.attr(config, key)
        if isinstance(value, dict) and isinstance(current, (PreTrainedConfig, dict)):
            inner = unset_only(current, value)
            if inner:
                out[key] = inner
        elif current is None or current is repairs.MISSING:
            out[key] = value
    return out


def dotted(overrides: dict, prefix: str = "") -> dict[str, Any]:
    """Nested overrides as ``{"text_config.pad_token_id": 0}``."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if isinstance(value, dict) and value:
            out.update(dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _nodes(root: Node, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Node]]:
    """Every node of the raw tree with its attribute path from the root."""
    yield path, root
    for key, child in root.children.items():
        yield from _nodes(child, path + (key,))
