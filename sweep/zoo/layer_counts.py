"""Layer counts: how few layers a config stack keeps, and the per-layer fields that follow a new count.

Used by :func:`sweep.zoo.shrink_rules.shrink_layers`: a stack keeps one layer of each layer type and every layer
an index field names (:func:`min_layers`); indices move onto the kept layers, every-k-th-layer periods and KV
sharing still hit a layer, and a stack counted only by its layer type list keeps one layer of each type.
"""

from __future__ import annotations

from typing import Any

from sweep.zoo.config_tree import Node
from sweep.zoo.fields import (DEPTH_LISTS, LAYER_COUNTS, LAYER_INDEX_FIELDS, OTHER_LAYER_COUNTS, hashable, int_list,
                              is_int, resample_pattern)
from sweep.zoo.profiles import Profile


def min_layers(node: Node, profile: Profile, old_layers: int) -> int:
    """The smallest layer count that keeps every layer type and every referenced layer index."""
    need = profile.layers
    for key, value in node.args.items():
        if isinstance(value, (list, tuple)) and len(value) == old_layers and old_layers > 1 and not int_list(value):
            need = max(need, len({hashable(v) for v in value}))
        if key in DEPTH_LISTS and int_list(value) and len(value) == old_layers:
            need = max(need, old_layers)  # the "layers" are stages, one entry of each per-stage list each
        if key in LAYER_INDEX_FIELDS:
            values = value if isinstance(value, (list, tuple)) else [value]
            flat = [v for v in values if is_int(v)]
            positives = [v for v in flat if v >= 0]
            negatives = [-v for v in flat if v < 0]
            if positives and not _every_layer(positives, old_layers):  # remapped onto the last layers: one each
                need = max(need, len(set(positives)))
            if negatives:
                need = max(need, max(negatives))
        if (isinstance(value, (list, tuple)) and 1 < len(value) < old_layers and not int_list(value)
                and all(isinstance(v, str) for v in value)):
            # a cycle of block types repeated over the layers: keep every type's first position
            firsts = {v: value.index(v) for v in value}
            need = max(need, max(firsts.values()) + 1)
    for pattern in node.derived_patterns.values():
        if rederived_per_layer(pattern):
            continue
        need = max(need, len({hashable(v) for v in pattern}))
    sections = layer_sections(node, old_layers)
    if sections:
        need = max(need, len(sections) + 1)  # one layer per section and one for the derived remainder
    return need


def layer_sections(node: Node, old_layers: int) -> list[str]:
    """Section counts of a layer stack whose remainder the config derives: Dory gives ``n_input_layers`` and
    ``n_output_layers`` (8 each of 36) and derives ``n_recurrent_layers`` as the total minus both, so a stack
    shrunk to 2 layers with its sections kept derives -14 recurrent layers and runs its layers twice. The sections
    shrink to one layer each, and the stack keeps one more for the remainder."""
    if not any(key.endswith("_layers") and node.args.get(key) is None for key in node.fields):
        return []
    sections = [key for key, value in node.args.items()
                if key.endswith("_layers") and key not in LAYER_COUNTS and key not in OTHER_LAYER_COUNTS
                and is_int(value) and 0 < value < old_layers]
    return sections if sum(node.args[key] for key in sections) < old_layers else []


def rederived_per_layer(pattern: Any) -> bool:
    """A derived per-layer list of counts or layer indices (not a 0/1 flag pattern): ``__post_init__`` derives it
    again for the new layer count, so it neither pins the count nor is resampled."""
    return int_list(pattern) and not set(pattern) <= {0, 1}


def _every_layer(indices: list[int], layers: int) -> bool:
    """An index list naming every layer (Llama 4's ``moe_layers``): it means "all", whatever the count."""
    return layers > 1 and set(indices) == set(range(layers))


def keep_kv_sharing(node: Node) -> None:
    """Layers that reuse another layer's KV cache (Gemma 3n): every layer type keeps one producing layer
    and one sharing layer, so the layer count is twice the number of types and the last half shares."""
    args = node.args
    shared = args.get("num_kv_shared_layers")
    layers_key = next((k for k in LAYER_COUNTS if is_int(args.get(k))), None)
    if not is_int(shared) or shared <= 0 or layers_key is None:
        return
    pattern = args.get("layer_types") or node.derived_patterns.get("layer_types") or []
    types = list(dict.fromkeys(pattern)) or ["full_attention"]
    before, after = args[layers_key], 2 * len(types)
    for key, value in list(args.items()):  # other per-layer lists follow the new count
        if isinstance(value, (list, tuple)) and len(value) == before and key != "layer_types":
            args[key] = type(value)((list(value) * after)[:after])
    args[layers_key] = after
    args["layer_types"] = types * 2
    args["num_kv_shared_layers"] = len(types)


def shrink_periods(node: Node, layers: int) -> None:
    """Every-k-th-layer patterns (``attn_layer_period`` / ``attn_layer_offset``) still hit a layer."""
    for key in [k for k in node.args if k.endswith("_period")]:
        period = node.args.get(key)
        offset_key = key[: -len("_period")] + "_offset"
        if is_int(period) and period > layers:
            node.args[key] = layers
        offset = node.args.get(offset_key)
        if is_int(offset) and is_int(node.args.get(key)) and offset >= node.args[key]:
            node.args[offset_key] = node.args[key] - 1


def remap_layer_indices(node: Node, old_layers: int, layers: int) -> None:
    """Non-negative layer indices move onto the last layers, in order (negative ones count from the end)."""
    for key in LAYER_INDEX_FIELDS:
        value = node.args.get(key)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        positives = sorted({v for v in values if is_int(v) and v >= 0})
        if not positives or max(positives) < layers:
            continue
        if _every_layer(positives, old_layers):
            node.args[key] = type(value)(range(layers))
            continue
        one_based = key == "out_indices" or max(positives) == old_layers  # hidden states include the embeddings
        top = layers + 1 if one_based else layers
        mapping = {old: top - len(positives) + i for i, old in enumerate(positives)}
        new = [mapping.get(v, v) if is_int(v) else v for v in values]
        node.args[key] = type(value)(new) if isinstance(value, (list, tuple)) else new[0]
        if key == "out_indices" and node.args.get("out_features") is not None:
            node.args["out_features"] = None  # re-derived from the remapped indices




def shrink_layer_type_list(node: Node, args: dict, profile: Profile) -> None:
    """A stack counted by its per-layer type list alone (NemotronH's ``layers_block_type``, which ``__post_init__``
    reads from ``hybrid_override_pattern``; its ``num_hidden_layers`` is deprecated and unset): the list keeps one
    layer of each type, in first-seen order, as a counted stack's per-layer lists do. The list is always passed:
    derived from an argument the raw tree does not keep (the pattern string), it would fall back to the default."""
    keys = {"layer_types", (getattr(node.cls, "attribute_map", None) or {}).get("layer_types")} - {None}
    for key in sorted(keys & (set(args) | set(node.derived_patterns))):
        pattern = args.get(key) or node.derived_patterns.get(key)
        if isinstance(pattern, (list, tuple)) and pattern and all(isinstance(v, str) for v in pattern):
            args[key] = resample_pattern(list(pattern), min(len(pattern), min_layers(node, profile, len(pattern))))
