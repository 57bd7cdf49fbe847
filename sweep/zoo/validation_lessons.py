"""Lessons from a config class's own validation error: edits of the raw config tree that answer it.

:func:`repair_config` reads the message the config class raised on the shrunk tree and edits the tree as it asks:
an equality ("`a` (1024) must equal `b` (32)"), layer indices that must index the remaining layers, a field the
validator pins to one value, a vocabulary that must hold a token range the config declares. False when the message
teaches nothing; the caller then reports the error as it is. Called by :func:`sweep.zoo.shrink.build_with_repairs`.
"""

from __future__ import annotations

import re
from typing import Any

from sweep.zoo.config_tree import Node

# "`vision_config.out_hidden_size` (1024) must equal `text_config.hidden_size` (32)": the first field takes the
# value of the second.
_EQUALITY = re.compile(
    r"`?([\w.]+)`?\s*\((\d+)\)\s*(?:must|should)\s*(?:be\s*)?(?:equal|match)(?:\s*to)?\s*(?:the\s*)?"
    r"(?:[\w ]*?)`?([\w.\[\]]+)(?:\s*(?://|\*|\+|-)\s*\d+)?`?\s*(?:\(|=\s*)(\d+)")


def repair_config(root: Node, message: str) -> bool:
    """Edit the raw tree as the config's own validation ``message`` asks; True when something changed."""
    return (_repair_equality(root, message) or _repair_layer_index(root, message)
            or _repair_required_value(root, message) or _repair_vocabulary_range(root, message))


def _repair_equality(root: Node, message: str) -> bool:
    found = _EQUALITY.search(message)
    if not found:
        return False
    path, value = found.group(1), int(found.group(4))
    node, key = _resolve(root, path)
    if node is None or node.args.get(key) == value:
        return False
    node.args[key] = value
    return True


def _resolve(root: Node, path: str) -> tuple[Node | None, str]:
    parts = path.split(".")
    node = root
    for part in parts[:-1]:
        node = node.children.get(part)
        if node is None:
            return None, parts[-1]
    if parts[-1] not in node.args and parts[-1] not in node.fields:
        return None, parts[-1]
    return node, parts[-1]


# "`adapter_config.vision_feature_layer` [24, 18] must index the 2 layers of `vision_config`": the indices move
# onto the remaining layers, in order (a layer-index field in a config that has no layer count of its own).
_LAYER_INDEX = re.compile(r"`([\w.]+)`\s*\[([-\d, ]+)\]\s*must index the (\d+) layers")


def _repair_layer_index(root: Node, message: str) -> bool:
    found = _LAYER_INDEX.search(message)
    if not found:
        return False
    node, key = _resolve(root, found.group(1))
    layers = int(found.group(3))
    values = [int(v) for v in found.group(2).split(",")]
    if node is None or layers <= 0:
        return False
    order = sorted(set(values))
    mapping = {old: max(0, layers - len(order) + i) for i, old in enumerate(order)}
    new = [mapping[v] if v >= 0 else max(v, -layers) for v in values]
    if node.args.get(key) == new:
        return False
    node.args[key] = new
    return True


# "hidden_size_per_layer_input must be 0, got 256" (Gemma 4 assistant): a field the validator pins to one value,
# named without its sub-config, takes it wherever the tree holds the value it got.
_REQUIRED_VALUE = re.compile(r"\b(\w+) must be (-?\d+|True|False|None), got (-?\d+|True|False|None)\b")


def _literal(text: str) -> Any:
    return {"True": True, "False": False, "None": None}.get(text, int(text) if text.lstrip("-").isdigit() else text)


def _repair_required_value(root: Node, message: str) -> bool:
    found = _REQUIRED_VALUE.search(message)
    if not found:
        return False
    key, wanted, got = found.group(1), _literal(found.group(2)), _literal(found.group(3))
    changed = False
    for node in root.walk():
        if key in node.args and node.args[key] == got and node.args[key] is not wanted:
            node.args[key] = wanted
            changed = True
    return changed


# "The audio token range ends at 266440, beyond the vocabulary (`text_config.vocab_size` = 1024)" (Apertus 1.5): the
# shrunk vocabulary must hold the token ranges the config declares, so it grows to the end of the range.
_VOCABULARY_RANGE = re.compile(r"ends at (\d+),? (?:beyond|past|outside) the vocabulary \(`([\w.]+)` = (\d+)\)")


def _repair_vocabulary_range(root: Node, message: str) -> bool:
    found = _VOCABULARY_RANGE.search(message)
    if not found:
        return False
    node, key = _resolve(root, found.group(2))
    end = int(found.group(1))
    if node is None or int(node.args.get(key) or 0) >= end:
        return False
    node.args[key] = end
    return True
