"""The per-node shrinking rules: one named function per pattern, applied to each config node in :data:`RULES` order.

Each rule reads and edits one node's raw arguments through a :class:`NodeShrink`, which also carries what earlier
rules decided (the old head count and head dim, the widths before shrinking). Rules are driven by config field
names (:mod:`sweep.zoo.fields`) and value equalities, never by a model type; the order matters (heads decide the
head dim, widths come before the lists that follow them, layers before per-layer patterns). A new pattern is a new
function added to :data:`RULES` where its inputs are ready.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from sweep.zoo.config_tree import Node
from sweep.zoo.fields import (AUDIO_POSITIONS, CHANNEL_LISTS, CONTEXT_PATCHES, DEPTH_LISTS, EXPERT_COUNTS,
                              EXPERT_TOP_K, FRAME_COUNTS, GROUP_COUNTS, HEAD_COUNTS, HEAD_DIMS, HEAD_LISTS,
                              KV_HEAD_COUNTS, LAYER_COUNTS, LAYER_INDEX_FIELDS, LOW_RANKS, MAX_KEYPOINTS, MAX_QUERIES,
                              MAX_SINKHORN, MAX_FRAMES, OTHER_LAYER_COUNTS, PASS_COUNTS, POSITIONS, PRIMARY_WIDTHS,
                              QUERY_COUNTS, ROPE_HEAD_DIMS, SHARED_EXPERTS, SMALL_STATE, STAGE_BLOCK_COUNTS, STATE_SIZES,
                              VOCABS, WIDE, ZERO_EXPERTS, int_list, is_int, is_intermediate_name,
                              is_token_field, is_width_name, primary_width, proportional, resample_pattern)
from sweep.zoo.layer_counts import (keep_kv_sharing, layer_sections, min_layers, rederived_per_layer,
                                    remap_layer_indices, shrink_layer_type_list, shrink_periods)
from sweep.zoo.profiles import Profile


@dataclasses.dataclass
class NodeShrink:
    """One config node being shrunk: what the rules read, and what earlier rules decided for later ones."""

    node: Node
    profile: Profile
    widths: set[int]  # every primary width in the tree: fields equal to one are widths too
    token_map: dict[int, int]  # old special token id -> new
    old_width: int | None  # the node's primary width before shrinking
    old_heads: int | None = None  # set by shrink_heads
    heads: int = 0  # the new head count (shrink_heads)
    old_head_dim: int | None = None  # set by shrink_head_dims
    new_head_dim: int = 0
    before_widths: dict[str, int] = dataclasses.field(default_factory=dict)  # set by shrink_widths

    @property
    def args(self) -> dict[str, Any]:
        return self.node.args

    @property
    def new_width(self) -> int:
        return self.profile.width


# -- the rules, in the order shrink_node applies them ----------------------------------------------------------


def remap_token_ids(s: NodeShrink) -> None:
    """Special token ids outside the new vocab take their new ids (the same map in every sub-config)."""
    for key, value in list(s.args.items()):
        if not is_token_field(key, s.node.cls):
            continue
        if is_int(value) and value in s.token_map:
            s.args[key] = s.token_map[value]
        elif isinstance(value, (list, tuple)):
            s.args[key] = type(value)(s.token_map.get(v, v) if is_int(v) else v for v in value)


def shrink_heads(s: NodeShrink) -> None:
    """Head counts first (they decide head_dim): at most the profile's heads."""
    args = s.args
    head_keys = [k for k in args if k in HEAD_COUNTS or (k.endswith("_heads") and k not in KV_HEAD_COUNTS
                                                          and "key_value" not in k and "kv" not in k)]
    for key in head_keys:
        if is_int(args.get(key)) and args[key] > 0:
            s.old_heads = s.old_heads or args[key]
            args[key] = min(args[key], s.profile.heads)
    s.heads = min(s.old_heads, s.profile.heads) if s.old_heads else s.profile.heads


def shrink_kv_heads(s: NodeShrink) -> None:
    """KV head counts follow the heads: all of them, one, or half (grouped-query attention stays grouped)."""
    args, heads, old_heads = s.args, s.heads, s.old_heads
    kv_keys = list(KV_HEAD_COUNTS) + [k for k in args if k.endswith(("_key_value_heads", "_kv_heads"))
                                      and k not in KV_HEAD_COUNTS]  # per-attention-kind counts (swa_*)
    for key in kv_keys:
        value = args.get(key)
        if value is None and key in s.node.fields and old_heads and key == "num_key_value_heads":
            args[key] = heads  # None means one kv head per head; some models do not fill it in
        elif is_int(value) and value > 0 and old_heads:
            args[key] = heads if value >= old_heads else (1 if value == 1 else max(1, heads // 2))


def shrink_head_dims(s: NodeShrink) -> None:
    """Head dims (and per-attention-kind ones equal to the old head dim) become width // heads, at least 4."""
    args, old_width, old_heads = s.args, s.old_width, s.old_heads
    if old_width and old_heads:
        s.old_head_dim = args.get("head_dim") if is_int(args.get("head_dim")) else old_width // old_heads
    s.new_head_dim = max(4, s.new_width // s.heads)
    for key, value in list(args.items()):
        kind_head_dim = (key.endswith("_head_dim") and key not in ROPE_HEAD_DIMS and "rope" not in key
                         and is_int(value) and s.old_head_dim and value == s.old_head_dim)  # swa_head_dim
        if (key in HEAD_DIMS or kind_head_dim) and (is_int(value) or value is None) and key in s.node.fields:
            if is_int(value) and value > 0 or (value is None and key == "head_dim" and old_heads):
                args[key] = s.new_head_dim


def scale_rotary_dims(s: NodeShrink) -> None:
    """Rotary dims stay the same share of the head dim (and even)."""
    for key in ("rotary_dim", "rotary_emb_dim", "rope_dim"):
        value = s.args.get(key)
        if is_int(value) and value > 0 and s.old_head_dim:
            s.args[key] = max(2, (value * s.new_head_dim // s.old_head_dim) // 2 * 2)


def shrink_widths(s: NodeShrink) -> None:
    """Every width-like int equal to a model width (or at least WIDE) becomes the tiny width; intermediates cap."""
    args, new_width = s.args, s.new_width
    s.before_widths = {k: v for k, v in args.items() if is_int(v) and v > 0}
    for key, value in list(args.items()):
        if not is_int(value) or value <= 0:
            continue
        if key in PRIMARY_WIDTHS or (is_width_name(key) and (value in s.widths or value >= WIDE)):
            if value > new_width:
                args[key] = new_width
        elif is_intermediate_name(key) and value > s.profile.intermediate:
            args[key] = s.profile.intermediate


def follow_shrunk_feature_dims(s: NodeShrink) -> None:
    """Feature dims equal to a width this node just shrank follow it (Mimi's codebook_dim, ZoeDepth's bottleneck)."""
    # Mimi's codebook_dim = its VQ hidden dimension, ZoeDepth's bottleneck_features = its fusion_hidden_size
    args = s.args
    shrunk = {before: args[k] for k, before in s.before_widths.items() if args.get(k) != before}
    for key, value in list(args.items()):
        if (is_int(value) and value in shrunk and (key.endswith(("_dim", "_dimension")) or (
                key.endswith("_features") and not key.startswith("num_"))) and key not in HEAD_DIMS
                and key not in ROPE_HEAD_DIMS and "head" not in key and not is_intermediate_name(key)):
            args[key] = shrunk[value]


def keep_stem_ratio(s: NodeShrink) -> None:
    """A stem width that hierarchical stages double up to the model width (CLAP) keeps that ratio to the new one."""
    # CLAP: patch_embeds_hidden_size * 2**3 = hidden_size
    args, old_width, new_width = s.args, s.old_width, s.new_width
    stages = next((len(args[k]) for k in DEPTH_LISTS if int_list(args.get(k))), 0)
    if old_width and stages > 1 and new_width % 2 ** (stages - 1) == 0:
        for key, value in list(args.items()):
            if (any(w in key for w in ("hidden", "embed", "width", "dim", "channels")) and is_int(value)
                    and s.before_widths.get(key) == value and key not in HEAD_DIMS
                    and value * 2 ** (stages - 1) == old_width):
                args[key] = new_width // 2 ** (stages - 1)


def split_layout_embeddings(s: NodeShrink) -> None:
    """2-D layout embeddings (LayoutLMv3): 4 coordinate and 2 shape embeddings concatenate to the width."""
    args = s.args
    width = primary_width(s.node)
    if is_int(args.get("coordinate_size")) and is_int(args.get("shape_size")) and width:
        shape = max(1, width // 6)
        while (width - 2 * shape) % 4:
            shape += 1
        args["shape_size"], args["coordinate_size"] = shape, (width - 2 * shape) // 4


def cap_codec_base_widths(s: NodeShrink) -> None:
    """Codec widths doubled at every up/downsampling stage start small (SEANet's num_filters; DAC, Xcodec2)."""
    # SEANet doubles num_filters per stage; DAC's and Xcodec2's base encoder width is doubled per ratio (48 * 2**5)
    args = s.args
    _cap(args, ("num_filters",), s.profile.min_channel)
    if any("sampling_ratios" in k and int_list(v) and len(v) > 2 for k, v in args.items()):
        _cap(args, tuple(k for k in args if k.endswith("hidden_size") and k not in PRIMARY_WIDTHS
                         and k.startswith("encoder")), s.profile.min_channel)


def halve_position_features(s: NodeShrink) -> None:
    """Sine/Fourier position features: half the width each for x and y (SAM's num_pos_feats = hidden_size // 2)."""
    value = s.args.get("num_pos_feats")
    if is_int(value) and 2 * value in s.widths and 2 * value > s.new_width:
        s.args["num_pos_feats"] = s.new_width // 2


def keep_depthwise_groups(s: NodeShrink) -> None:
    """Depthwise convolutions over the width (Mimi's upsample_groups = hidden_size) keep groups == channels."""
    for key, value in list(s.args.items()):
        if (key.endswith("groups") and key not in GROUP_COUNTS and is_int(value) and value > s.new_width
                and (value in s.widths or value == s.old_width)):
            s.args[key] = s.new_width


def follow_width_lists(s: NodeShrink) -> None:
    """Uniform lists of a model width follow it; a ramp of channels ending at one keeps its ratios."""
    # a detector's decoder_in_channels = [hidden] * levels; UnlimitedOCR's downsample_channels = (512, 1024)
    args, widths, new_width, node = s.args, s.widths, s.new_width, s.node
    for key, value in list(args.items()):
        if (int_list(value) and len(set(value)) == 1 and value[0] in widths and value[0] > new_width
                and key not in CHANNEL_LISTS and any(w in key.lower() for w in ("channel", "hidden", "dim"))):
            args[key] = type(value)(new_width for _ in value)
            node.width_lists.add(key)
        elif (int_list(value) and len(set(value)) > 1 and value[-1] in widths and value[-1] > new_width
              and max(value) == value[-1] and key not in CHANNEL_LISTS
              and any(w in key.lower() for w in ("channel", "hidden", "dim"))):
            args[key] = type(value)(max(1, v * new_width // value[-1]) for v in value)
            node.width_lists.add(key)


def shrink_layers(s: NodeShrink) -> None:
    """Layer counts, never below what layer types and layer indices need; per-layer lists and indices follow."""
    args, node = s.args, s.node
    for key in LAYER_INDEX_FIELDS:  # indices __post_init__ derives from constants are remapped like given ones
        derived = node.derived_patterns.get(key)
        if args.get(key) is None and key in node.fields and int_list(derived):
            args[key] = list(derived)
    old_layers = next((args[k] for k in LAYER_COUNTS if is_int(args.get(k)) and args[k] > 0), None)
    if not old_layers:
        shrink_layer_type_list(node, args, s.profile)
        return
    need = min_layers(node, s.profile, old_layers)
    target = min(old_layers, need)
    for key in LAYER_COUNTS:  # each stack (encoder, decoder, ...) shrinks on its own
        if is_int(args.get(key)) and args[key] > need:
            args[key] = need
    if target < old_layers:
        for key in layer_sections(node, old_layers):
            args[key] = 1
    for key, value in list(args.items()):
        if (isinstance(value, (list, tuple)) and len(value) == old_layers and old_layers > target
                and key not in CHANNEL_LISTS):
            args[key] = type(value)(resample_pattern(list(value), target))
    for key, pattern in node.derived_patterns.items():  # per-layer counts and indices are re-derived
        if args.get(key) is None and len(pattern) == old_layers and not rederived_per_layer(pattern):
            args[key] = resample_pattern(list(pattern), target)
    remap_layer_indices(node, old_layers, target)
    shrink_periods(node, target)
    keep_kv_sharing(node)


def cap_other_stacks(s: NodeShrink) -> None:
    """Side stacks at the profile's layers, recurrent passes at one, a series context at CONTEXT_PATCHES patches."""
    args = s.args
    _cap(args, OTHER_LAYER_COUNTS, s.profile.layers)
    _cap(args, PASS_COUNTS, 1)
    patch = args.get("patch_length")
    if is_int(patch) and patch > 0:
        _cap(args, ("context_length",), CONTEXT_PATCHES * patch)


def shrink_experts(s: NodeShrink) -> None:
    """Mixture of experts: few experts, a small top-k, one shared expert and one group; unset counts get set."""
    args, node, profile = s.args, s.node, s.profile
    _cap(args, EXPERT_COUNTS, profile.experts)
    unset = [k for k in EXPERT_COUNTS if k in node.fields and args.get(k) is None]
    moe_config = "moe_intermediate_size" in node.fields or any(k in node.fields for k in EXPERT_TOP_K)
    if unset and moe_config and not any(is_int(args.get(k)) for k in EXPERT_COUNTS):
        args[unset[0]] = profile.experts  # an MoE config whose expert count has no default (set by checkpoints)
        if "moe_intermediate_size" in node.fields and args.get("moe_intermediate_size") is None:
            args["moe_intermediate_size"] = profile.intermediate
        for key in SHARED_EXPERTS:
            if key in node.fields and args.get(key) is None:
                args[key] = 1
    has_experts = any(is_int(args.get(k)) and args[k] > 1 for k in EXPERT_COUNTS)
    for key in EXPERT_TOP_K:
        if is_int(args.get(key)) and args[key] > profile.top_k:
            args[key] = profile.top_k
        elif key in node.fields and args.get(key) is None and has_experts:
            args[key] = profile.top_k  # a None top-k default is not runnable
    _cap(args, SHARED_EXPERTS, 1)
    _cap(args, ZERO_EXPERTS, profile.experts)
    _cap(args, GROUP_COUNTS, 1)


def cap_counts(s: NodeShrink) -> None:
    """Object queries, keypoints (-1 keeps all), Sinkhorn iterations, frames, state sizes and low ranks capped."""
    args = s.args
    _cap(args, QUERY_COUNTS, MAX_QUERIES)
    if is_int(args.get("max_keypoints")) and not 0 < args["max_keypoints"] <= MAX_KEYPOINTS:
        args["max_keypoints"] = MAX_KEYPOINTS
    _cap(args, ("sinkhorn_iterations",), MAX_SINKHORN)
    _cap(args, FRAME_COUNTS, MAX_FRAMES)
    _cap(args, STATE_SIZES, SMALL_STATE)
    _cap(args, LOW_RANKS, s.profile.low_rank)
    _cap(args, ROPE_HEAD_DIMS, 8)
    _cap(args, ("first_k_dense_replace",), 1)


def cap_vocab_and_positions(s: NodeShrink) -> None:
    """Vocabularies, position tables, spectrogram lengths and audio positions at the profile's sizes."""
    args, profile = s.args, s.profile
    _cap(args, tuple(k for k in args if k in VOCABS or "vocab" in k.lower()), profile.vocab)
    _cap(args, POSITIONS, profile.max_positions)
    if is_int(args.get("max_length")) and args["max_length"] > profile.audio_positions * 2:
        args["max_length"] = profile.audio_positions * 2  # spectrogram frames (AST) or generation length
    _cap(args, AUDIO_POSITIONS, profile.audio_positions)


def fill_required_unset(s: NodeShrink) -> None:
    """Fields whose default is None but which a forward needs get a value (see :func:`_fill_required_unset`)."""
    _fill_required_unset(s.node, s.profile, s.token_map)


def shrink_geometry(s: NodeShrink) -> None:
    """Images, windows and stage depths shrink, and channel lists scale (unless the profile keeps geometry)."""
    if not s.profile.keep_geometry:
        _shrink_vision(s.node, s.profile)
        s.node.channel_map = _shrink_channel_lists(s.node, s.profile, s.old_width)


def rescale_rope_sections(s: NodeShrink) -> None:
    """Multimodal RoPE sections still sum to half the head dim."""
    _rescale_sections(s.node, s.heads)


def keep_state_space_product(s: NodeShrink) -> None:
    """Mamba2-style blocks: ``expand * hidden_size == num_heads * head_dim``."""
    args = s.args
    width, expand, n_heads = primary_width(s.node), args.get("expand"), args.get("num_heads")
    if is_int(width) and is_int(expand) and is_int(n_heads) and is_int(args.get("head_dim")):
        inner = expand * width
        args["num_heads"] = min(n_heads, max(1, inner // 8))
        args["head_dim"] = inner // args["num_heads"]


RULES: tuple[Callable[[NodeShrink], None], ...] = (
    remap_token_ids, shrink_heads, shrink_kv_heads, shrink_head_dims, scale_rotary_dims, shrink_widths,
    follow_shrunk_feature_dims, keep_stem_ratio, split_layout_embeddings, cap_codec_base_widths,
    halve_position_features, keep_depthwise_groups, follow_width_lists, shrink_layers, cap_other_stacks,
    shrink_experts, cap_counts, cap_vocab_and_positions, fill_required_unset, shrink_geometry,
    rescale_rope_sections, keep_state_space_product,
)


def shrink_node(node: Node, profile: Profile, widths: set[int], token_map: dict[int, int]) -> None:
    """Shrink one config node in place by every rule of :data:`RULES`, in order (the caller walks the sub-configs)."""
    state = NodeShrink(node=node, profile=profile, widths=widths, token_map=token_map, old_width=primary_width(node))
    for rule in RULES:
        rule(state)


# -- helpers of the rules --------------------------------------------------------------------------------------


def scale_channel_list(values: list[int], divisor: float, minimum: int) -> list[int]:
    """Divide channel counts, rounding up to multiples of ``minimum``; counts below it (RGB inputs) stay."""
    step = minimum
    return [v if v < minimum else max(minimum, int(math.ceil(v / divisor / step)) * step) for v in values]


def _cap(args: dict, keys: tuple[str, ...], limit: int) -> None:
    """Every int field of ``keys`` above ``limit`` becomes ``limit``."""
    for key in keys:
        if is_int(args.get(key)) and args[key] > limit:
            args[key] = limit


PREDICTION_LENGTH = 4
HIERARCHICAL_WINDOW = 2


def _fill_required_unset(node: Node, profile: Profile, token_map: dict[int, int]) -> None:
    args = node.args
    if "vocab_size" in node.fields and args.get("vocab_size") is None:
        args["vocab_size"] = profile.vocab
    if "pad_token_id" in node.fields and args.get("pad_token_id") is None and is_int(args.get("vocab_size")):
        # the smallest id no other special token uses (padding ids also index position tables, e.g. ESM)
        used = {v for k, v in args.items() if is_token_field(k, node.cls) and is_int(v)}
        args["pad_token_id"] = min(i for i in range(len(used) + 1) if i not in used)
    if "default_language" in node.fields and args.get("default_language") is None and args.get("languages"):
        args["default_language"] = list(args["languages"])[0]  # X-MOD refuses to guess the language adapter
    width = primary_width(node)
    dims = args.get("axial_pos_embds_dim")
    if int_list(dims) and width and sum(dims) != width:  # Reformer: axial position factors sum to the width
        args["axial_pos_embds_dim"] = type(dims)(proportional(list(dims), width))
    types = args.get("layer_types") or node.derived_patterns.get("layer_types") or []
    if ("sliding_window" in node.fields and args.get("sliding_window") is None and isinstance(types, (list, tuple))
            and "sliding_attention" in types):  # sliding layers with no window (set by checkpoints)
        args["sliding_window"] = profile.window
    if "prediction_length" in node.fields and args.get("prediction_length") is None:
        args["prediction_length"] = PREDICTION_LENGTH


def _shrink_vision(node: Node, profile: Profile) -> None:
    args = node.args
    patch = args.get("patch_size")
    patch = patch[0] if int_list(patch) else patch
    image = args.get("image_size")
    if is_int(image) or int_list(image):
        stages = next((len(args[k]) for k in DEPTH_LISTS if int_list(args.get(k))), 0)
        if is_int(patch) and patch > 0:
            grid = max(profile.image_grid, 2 ** stages)  # hierarchical models halve the grid per stage
            merge = args.get("spatial_merge_size") or args.get("merge_size") or 1
            if is_int(merge) and merge > 1:
                grid = max(grid, merge * 2)
            window = args.get("window_size")
            if is_int(window) and window % patch == 0 and window > patch:  # windows in pixels
                grid = max(grid, window // patch)
            elif is_int(window) and stages > 1:  # windows in patches: the last stage still holds one window
                window = min(window, HIERARCHICAL_WINDOW)
                args["window_size"] = window
                grid = max(grid, window * 2 ** (stages - 1))
            side = patch * grid
        else:
            side = profile.conv_image_size
        old = image if is_int(image) else max(image)
        if side < old:
            args["image_size"] = side if is_int(image) else type(image)(side for _ in image)
    for key in ("window_size",):
        value = args.get(key)
        pixel_window = is_int(patch) and patch > 1 and is_int(value) and value % patch == 0 and value > patch
        if is_int(value) and value > profile.window and not pixel_window:
            args[key] = profile.window
            rate = next((v for k, v in args.items() if "downsample" in k and is_int(v) and v > 1), None)
            if rate and value % rate == 0:  # windows pooled by a downsampling rate keep a whole multiple of it
                args[key] = rate * max(1, profile.window // rate)
    for key in (*DEPTH_LISTS, *STAGE_BLOCK_COUNTS):
        if int_list(args.get(key)):
            args[key] = type(args[key])(min(v, 1) if v > 0 else v for v in args[key])
    for key in HEAD_LISTS:
        value = args.get(key)
        if int_list(value) and value[0] > 0:
            args[key] = type(value)(max(1, v // value[0]) for v in value)


def _shrink_channel_lists(node: Node, profile: Profile, old_width: int | None) -> dict[int, int]:
    """One value map per config for chained channel lists (conv nets), keeping the ratios between stages.

    Returns the map (old channels -> new) so that lists elsewhere in the tree that name the same channels (a
    detector's ``encoder_in_channels`` = its backbone's stage channels) follow it.
    """
    args = node.args
    lists = {k: args[k] for k in CHANNEL_LISTS if int_list(args.get(k))}
    if not lists:
        return {}
    smallest = min((v for values in lists.values() for v in values if v >= profile.min_channel), default=0)
    if not smallest:
        return {}
    divisor = max(1.0, smallest / profile.min_channel)
    mapping: dict[int, int] = {}
    for key, values in lists.items():
        new = scale_channel_list(list(values), divisor, profile.min_channel)
        mapping.update(zip(values, new))
        args[key] = type(values)(new)
    for key in ("embedding_size", "stem_channels", "num_filters", "hidden_size", "embed_dim", "out_features_dim"):
        value = args.get(key)
        if is_int(value) and value > 0 and key not in lists:
            args[key] = scale_channel_list([value], divisor, profile.min_channel)[0]
            mapping[value] = args[key]
    # Block tables (PP-LCNet's block_configs: [kernel, in, out, stride, se] per block, per stage), given or derived
    # by __post_init__: channel entries take the same divisor (kernels and strides stay under the floor).
    for key in set(args) | set(node.derived_patterns):
        table = args.get(key) if args.get(key) is not None else node.derived_patterns.get(key)
        if (any(w in key for w in BLOCK_TABLE_WORDS) and _nested(table)
                and any(is_int(v) and mapping.get(v, v) != v for v in _leaves(table))):
            args[key] = _scale_table(table, divisor, profile.min_channel)
    return mapping


BLOCK_TABLE_WORDS = ("block", "channel", "stage")


def _nested(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and any(isinstance(v, (list, tuple)) for v in value)


def _leaves(value: Any):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def _scale_table(value: Any, divisor: float, minimum: int) -> Any:
    if isinstance(value, (list, tuple)):
        return [_scale_table(v, divisor, minimum) for v in value]
    return scale_channel_list([value], divisor, minimum)[0] if is_int(value) else value


def _rescale_sections(node: Node, heads: int) -> None:
    """Section lists that must sum to half the head dim (multimodal RoPE) are rescaled proportionally."""
    head_dim = node.args.get("head_dim")
    if not is_int(head_dim):
        width = primary_width(node)
        head_dim = width // heads if width else None
    if not head_dim:
        return
    for key in ("rope_parameters", "rope_scaling"):
        rope = node.args.get(key)
        if isinstance(rope, dict) and int_list(rope.get("mrope_section")):
            rope = dict(rope)
            rope["mrope_section"] = proportional(rope["mrope_section"], head_dim // 2)
            node.args[key] = rope
    if int_list(node.args.get("mrope_section")):
        node.args["mrope_section"] = proportional(node.args["mrope_section"], head_dim // 2)
