"""The generic config shrinker: a model type's default config, made tiny while staying self-consistent.

Pipeline (:func:`shrink_config`):

1. **Raw tree.** Read the default config back as the *raw* constructor arguments (:mod:`sweep.config_tree`), so
   that ``__post_init__`` re-derives ``head_dim``, ``layer_types``, sliding patterns, ... from the shrunk values.
2. **Token ids.** Every ``*_token_id`` / ``*_token_index`` in the tree outside the new vocab is remapped, the same
   old id to the same new id in every sub-config, onto the top of the new vocab.
3. **Rules.** Each node (the config and each sub-config) is shrunk by the rules below, driven by config field
   names and by value equalities (every width equal to a model width becomes the one tiny width).
4. **Overrides.** The per-model overrides of ``sweep/data/overrides.yaml`` are applied last.
5. **Build.** Sub-configs first, then the config itself, through the config classes' own validation.

A :class:`Profile` holds the target sizes; :data:`PROFILES` is the ladder that :mod:`sweep.zoo` climbs when the
tiniest profile cannot build or run a model.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from sweep.config_tree import Node, build_config, raw_tree


@dataclasses.dataclass(frozen=True)
class Profile:
    """Target sizes for one rung of the shrink ladder."""

    name: str
    width: int = 32
    heads: int = 4
    layers: int = 2
    intermediate: int = 64
    vocab: int = 1024
    max_positions: int = 512
    image_grid: int = 4  # patches per side
    conv_image_size: int = 64  # image side for models without a patch size
    experts: int = 4
    top_k: int = 2
    low_rank: int = 16
    min_channel: int = 8
    audio_positions: int = 32
    window: int = 4
    keep_geometry: bool = False  # keep image/patch/window sizes and channel lists as the defaults have them


PROFILES: tuple[Profile, ...] = (
    Profile("tiny"),
    Profile("small", width=64, heads=4, intermediate=128, image_grid=8, conv_image_size=128, window=7,
            min_channel=16, audio_positions=64),
    Profile("geometry", width=64, heads=4, intermediate=128, keep_geometry=True),
)
# Tried when the profile that runs is over the parameter budget (conv stacks, codecs, big fixed heads).
BUDGET_PROFILES: tuple[Profile, ...] = (
    Profile("micro", width=16, heads=2, intermediate=32, vocab=256, max_positions=128, min_channel=4,
            experts=2, top_k=1, low_rank=8, image_grid=4, conv_image_size=32, audio_positions=16),
)


# -- field vocabularies --------------------------------------------------------------------------------------
# Names of config fields, grouped by what they mean. Transformers' configs share these names across families.

PRIMARY_WIDTHS = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "d_embed", "hidden_dim", "n_embed",
                  "model_dim", "width", "d_latents")
WIDTH_WORDS = ("hidden", "size", "dim", "embd", "embed", "d_model", "width", "channels", "proj")
NOT_WIDTH_WORDS = ("intermediate", "ffn", "head_dim", "vocab", "position", "image", "patch", "max_", "num_",
                   "layers", "window", "kernel", "stride", "bucket", "chunk", "length", "sample", "mel", "rank",
                   "group", "expert", "frame", "ratio", "feat", "_len", "seq", "token", "bins", "codebook",
                   "label", "class", "query", "rope", "rotary", "sliding", "local", "conv_dim", "pad", "offset",
                   "radius", "dilation", "block", "segment", "step", "scale", "dropout", "top", "size_per",
                   "spec_")  # a spectrogram side (CLAP's spec_size) is geometry: the model folds it by the mel bins
INTERMEDIATE_WORDS = ("intermediate", "ffn_dim", "d_ff", "n_inner", "mlp_dim", "ff_dim", "ffn_hidden",
                      "inner_dim", "filter_size", "feed_forward", "d_inner", "mlp_hidden", "dim_feedforward",
                      "encoder_ffn", "decoder_ffn", "hidden_dim_ffn")
LAYER_COUNTS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                "num_encoder_layers", "num_decoder_layers", "depth", "num_blocks", "text_layers", "vision_layers",
                "num_decoder_blocks", "num_encoder_blocks", "n_layers_encoder", "n_layers_decoder",
                "num_transformer_layers", "num_self_attends_per_block", "num_cross_attention_layers",
                "num_global_layers", "num_local_layers", "encoder_num_layers", "decoder_num_layers")
HEAD_COUNTS = ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads", "decoder_attention_heads",
               "n_heads", "attention_heads", "num_encoder_attention_heads", "num_decoder_attention_heads",
               "encoder_num_attention_heads", "decoder_num_attention_heads", "num_self_attention_heads",
               "num_cross_attention_heads", "n_attention_heads")
KV_HEAD_COUNTS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "num_key_value_groups", "n_kv_heads",
                  "multi_query_group_num", "kv_heads", "num_key_value_attention_heads")
HEAD_DIMS = ("head_dim", "attention_head_dim", "d_kv", "kv_channels", "head_size", "attention_head_size",
             "key_value_head_dim")
EXPERT_COUNTS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts", "n_experts",
                 "num_routed_experts", "expert_count")
EXPERT_TOP_K = ("num_experts_per_tok", "top_k", "moe_topk", "num_experts_per_token", "moe_k", "n_activated_experts",
                "router_topk", "experts_per_token", "top_k_experts")
SHARED_EXPERTS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
GROUP_COUNTS = ("n_group", "topk_group", "num_expert_groups", "num_groups_for_routing", "n_groups",
                "mamba_n_groups", "ssm_n_groups")
STATE_SIZES = ("state_size", "d_state", "ssm_state_size", "mamba_d_state", "d_conv_state")
SMALL_STATE = 16
FRAME_COUNTS = ("num_frames", "frames_per_clip")
# Object queries: two-stage detectors pick the top-k encoder tokens, which a tiny image has fewer of than 300.
QUERY_COUNTS = ("num_queries",)
MAX_QUERIES = 16
MAX_KEYPOINTS = 32
MAX_SINKHORN = 10
MAX_FRAMES = 4
LOW_RANKS = ("q_lora_rank", "kv_lora_rank", "o_lora_rank", "time_step_rank")
ROPE_HEAD_DIMS = ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "qk_head_dim")
VOCABS = ("vocab_size", "n_vocab", "text_vocab_size", "codebook_vocab_size", "target_vocab_size",
          "src_vocab_size", "tgt_vocab_size", "decoder_vocab_size")
POSITIONS = ("max_position_embeddings", "n_positions", "max_positions", "max_seq_len", "n_ctx",
             "max_sequence_length", "max_target_positions", "max_text_positions", "seq_length",
             "max_length", "text_max_position_embeddings")
AUDIO_POSITIONS = ("max_source_positions", "max_audio_positions")
LAYER_INDEX_FIELDS = ("vision_feature_layer", "out_indices", "global_attn_indexes", "vision_feature_layers",
                      "feature_layers", "select_layer", "intermediate_layers_indices", "backbone_out_indices",
                      "fullatt_block_indexes", "layer_ids", "deepstack_visual_indexes", "full_attention_layers",
                      "cross_attention_layers", "attn_layer_indices", "moe_layers", "global_layers",
                      "decoder_sparse_step_layers", "attn_layer_idx", "mlp_only_layers", "no_rope_layers_idx", "intermediate_hook_ids")
CHANNEL_LISTS = ("hidden_sizes", "embed_dims", "channels", "dims", "widths", "num_channels_list",
                 "hidden_dims", "embedding_sizes", "out_channels", "stage_channels", "neck_hidden_sizes",
                 "block_channels", "encoder_hidden_sizes", "decoder_hidden_sizes", "stem_channels",
                 "stage_in_channels", "stage_mid_channels", "stage_out_channels", "embed_dim_per_stage",
                 "hidden_size_per_stage", "in_channels_list", "conv_dim", "feature_channels",
                 "reassemble_hidden_size", "fusion_hidden_size", "in_channels", "neck_dims")
# Stacks beside the main one (a speech encoder, a predictor, a resampler, an MAE decoder): capped at the profile's
# layer count on their own, since no layer pattern or index refers to them.
OTHER_LAYER_COUNTS = ("speech_encoder_layers", "t2u_encoder_layers", "t2u_decoder_layers", "decoder_num_hidden_layers",
                      "encoder_num_hidden_layers", "pred_num_hidden_layers", "conf_num_hidden_layers",
                      "num_spatial_layers", "num_temporal_layers", "memory_attention_num_layers",
                      "text_encoder_num_layers", "l_layers", "x_layers", "r_layers", "resampler_depth",
                      "posterior_encoder_num_wavenet_layers", "prior_encoder_num_wavenet_layers",
                      "num_timestamp_prediction_layers", "layers", "aligner_num_add_layers", "num_mel_attn_blocks")
# Recurrent passes over the same layer stack (HRM: H_cycles x (L_cycles + 1) passes): one pass of each kind.
PASS_COUNTS = ("H_cycles", "L_cycles")
# Time series models walk their context patch by patch (TimesFM 2.5: 16,384 steps in patches of 32): four
# patches keep every code path at a fraction of the graph.
CONTEXT_PATCHES = 4
DEPTH_LISTS = ("depths", "num_layers_per_stage", "layers_per_stage", "block_repeats", "stage_depths",
               "num_blocks_per_stage", "depth_per_stage", "encoder_layers_per_stage", "repeats",
               "stage_num_layers", "num_hidden_layers_per_stage")
HEAD_LISTS = ("num_heads", "num_attention_heads", "heads", "num_heads_per_stage", "attention_heads")


WIDE = 128  # a width-named field at least this wide is a model width whatever its value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(_is_int(v) for v in value)


def primary_width(node: Node) -> int | None:
    for key in PRIMARY_WIDTHS:
        if _is_int(node.args.get(key)) and node.args[key] > 0:
            return node.args[key]
    return None


def tree_widths(node: Node) -> set[int]:
    """Every primary width in the tree: fields equal to one of them are widths too."""
    widths = set()
    for n in node.walk():
        w = primary_width(n)
        if w:
            widths.add(w)
    return widths


def _is_width_name(key: str) -> bool:
    k = key.lower()
    return (any(w in k for w in WIDTH_WORDS) and not any(w in k for w in NOT_WIDTH_WORDS)
            and not k.startswith("n_"))


def _is_intermediate_name(key: str) -> bool:
    return any(w in key.lower() for w in INTERMEDIATE_WORDS)


# -- token ids -----------------------------------------------------------------------------------------------


def _is_token_field(key: str) -> bool:
    k = key.lower()
    return k.endswith(("_token_id", "_token_ids", "_token_index", "_token_idx", "_id_token")) or k in {
        "pad_token_id", "image_token_index", "decoder_start_token_id", "padding_idx", "mask_token_id"}


def token_id_map(root: Node, vocab: int) -> dict[int, int]:
    """Old id -> new id for every special token id outside the new vocab, top of the vocab down."""
    ids = set()
    for node in root.walk():
        for key, value in node.args.items():
            if not _is_token_field(key):
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            ids.update(v for v in values if _is_int(v) and v >= vocab)
    return {old: vocab - 1 - i for i, old in enumerate(sorted(ids))}


def reserved_ids(root: Node, vocab: int) -> int:
    """How many ids at the top of the vocab the remap used (input synthesis stays below them)."""
    return len(token_id_map(root, vocab))


def _remap_tokens(node: Node, mapping: dict[int, int]) -> None:
    for key, value in list(node.args.items()):
        if not _is_token_field(key):
            continue
        if _is_int(value) and value in mapping:
            node.args[key] = mapping[value]
        elif isinstance(value, (list, tuple)):
            node.args[key] = type(value)(mapping.get(v, v) if _is_int(v) else v for v in value)


# -- rules ---------------------------------------------------------------------------------------------------


def _scale_channel_list(values: list[int], divisor: float, minimum: int) -> list[int]:
    """Divide channel counts, rounding up to multiples of ``minimum``; counts below it (RGB inputs) stay."""
    step = minimum
    return [v if v < minimum else max(minimum, int(math.ceil(v / divisor / step)) * step) for v in values]


def _resample_pattern(pattern: list, layers: int) -> list:
    """A per-layer list shrunk to ``layers`` entries, keeping one of each distinct value in first-seen order."""
    pattern = [list(v) if isinstance(v, tuple) else v for v in pattern]
    distinct = list(dict.fromkeys(_hashable(v) for v in pattern))
    order = [pattern[[_hashable(v) for v in pattern].index(d)] for d in distinct]
    out = list(order)
    i = 0
    while len(out) < layers:
        out.append(pattern[i % len(pattern)])
        i += 1
    return out[: max(layers, len(order))]


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def min_layers(node: Node, profile: Profile, old_layers: int) -> int:
    """The smallest layer count that keeps every layer type and every referenced layer index."""
    need = profile.layers
    for key, value in node.args.items():
        if isinstance(value, (list, tuple)) and len(value) == old_layers and old_layers > 1 and not _int_list(value):
            need = max(need, len({_hashable(v) for v in value}))
        if key in DEPTH_LISTS and _int_list(value) and len(value) == old_layers:
            need = max(need, old_layers)  # the "layers" are stages, one entry of each per-stage list each
        if key in LAYER_INDEX_FIELDS:
            values = value if isinstance(value, (list, tuple)) else [value]
            flat = [v for v in values if _is_int(v)]
            positives = [v for v in flat if v >= 0]
            negatives = [-v for v in flat if v < 0]
            if positives and not _every_layer(positives, old_layers):  # remapped onto the last layers: one each
                need = max(need, len(set(positives)))
            if negatives:
                need = max(need, max(negatives))
        if (isinstance(value, (list, tuple)) and 1 < len(value) < old_layers and not _int_list(value)
                and all(isinstance(v, str) for v in value)):
            # a cycle of block types repeated over the layers: keep every type's first position
            firsts = {v: value.index(v) for v in value}
            need = max(need, max(firsts.values()) + 1)
    for pattern in node.derived_patterns.values():
        if _rederived_per_layer(pattern):
            continue
        need = max(need, len({_hashable(v) for v in pattern}))
    return need


def _rederived_per_layer(pattern: Any) -> bool:
    """A derived per-layer list of counts or layer indices (not a 0/1 flag pattern): ``__post_init__`` derives it
    again for the new layer count, so it neither pins the count nor is resampled."""
    return _int_list(pattern) and not set(pattern) <= {0, 1}


def _every_layer(indices: list[int], layers: int) -> bool:
    """An index list naming every layer (Llama 4's ``moe_layers``): it means "all", whatever the count."""
    return layers > 1 and set(indices) == set(range(layers))


def _keep_kv_sharing(node: Node) -> None:
    """Layers that reuse another layer's KV cache (Gemma 3n): every layer type keeps one producing layer
    and one sharing layer, so the layer count is twice the number of types and the last half shares."""
    args = node.args
    shared = args.get("num_kv_shared_layers")
    layers_key = next((k for k in LAYER_COUNTS if _is_int(args.get(k))), None)
    if not _is_int(shared) or shared <= 0 or layers_key is None:
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


def _shrink_periods(node: Node, layers: int) -> None:
    """Every-k-th-layer patterns (``attn_layer_period`` / ``attn_layer_offset``) still hit a layer."""
    for key in [k for k in node.args if k.endswith("_period")]:
        period = node.args.get(key)
        offset_key = key[: -len("_period")] + "_offset"
        if _is_int(period) and period > layers:
            node.args[key] = layers
        offset = node.args.get(offset_key)
        if _is_int(offset) and _is_int(node.args.get(key)) and offset >= node.args[key]:
            node.args[offset_key] = node.args[key] - 1


def _remap_layer_indices(node: Node, old_layers: int, layers: int) -> None:
    """Non-negative layer indices move onto the last layers, in order (negative ones count from the end)."""
    for key in LAYER_INDEX_FIELDS:
        value = node.args.get(key)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        positives = sorted({v for v in values if _is_int(v) and v >= 0})
        if not positives or max(positives) < layers:
            continue
        if _every_layer(positives, old_layers):
            node.args[key] = type(value)(range(layers))
            continue
        one_based = key == "out_indices" or max(positives) == old_layers  # hidden states include the embeddings
        top = layers + 1 if one_based else layers
        mapping = {old: top - len(positives) + i for i, old in enumerate(positives)}
        new = [mapping.get(v, v) if _is_int(v) else v for v in values]
        node.args[key] = type(value)(new) if isinstance(value, (list, tuple)) else new[0]
        if key == "out_indices" and node.args.get("out_features") is not None:
            node.args["out_features"] = None  # re-derived from the remapped indices


def _cap(args: dict, keys: tuple[str, ...], limit: int) -> None:
    """Every int field of ``keys`` above ``limit`` becomes ``limit``."""
    for key in keys:
        if _is_int(args.get(key)) and args[key] > limit:
            args[key] = limit


def shrink_node(node: Node, profile: Profile, widths: set[int], token_map: dict[int, int]) -> None:
    """Shrink one config node in place (its sub-config nodes are shrunk by the caller)."""
    args = node.args
    _remap_tokens(node, token_map)
    old_width = primary_width(node)
    new_width = profile.width

    # Heads first: they decide head_dim.
    old_heads = None
    head_keys = [k for k in args if k in HEAD_COUNTS or (k.endswith("_heads") and k not in KV_HEAD_COUNTS
                                                          and "key_value" not in k and "kv" not in k)]
    for key in head_keys:
        if _is_int(args.get(key)) and args[key] > 0:
            old_heads = old_heads or args[key]
            args[key] = min(args[key], profile.heads)
    heads = min(old_heads, profile.heads) if old_heads else profile.heads
    kv_keys = list(KV_HEAD_COUNTS) + [k for k in args if k.endswith(("_key_value_heads", "_kv_heads"))
                                      and k not in KV_HEAD_COUNTS]  # per-attention-kind counts (swa_*)
    for key in kv_keys:
        value = args.get(key)
        if value is None and key in node.fields and old_heads and key == "num_key_value_heads":
            args[key] = heads  # None means one kv head per head; some models do not fill it in
        elif _is_int(value) and value > 0 and old_heads:
            args[key] = heads if value >= old_heads else (1 if value == 1 else max(1, heads // 2))

    old_head_dim = None
    if old_width and old_heads:
        old_head_dim = args.get("head_dim") if _is_int(args.get("head_dim")) else old_width // old_heads
    new_head_dim = max(4, new_width // heads)
    for key, value in list(args.items()):
        kind_head_dim = (key.endswith("_head_dim") and key not in ROPE_HEAD_DIMS and "rope" not in key
                         and _is_int(value) and old_head_dim and value == old_head_dim)  # swa_head_dim
        if (key in HEAD_DIMS or kind_head_dim) and (_is_int(value) or value is None) and key in node.fields:
            if _is_int(value) and value > 0 or (value is None and key == "head_dim" and old_heads):
                args[key] = new_head_dim
    # Rotary dims stay the same share of the head dim (and even).
    for key in ("rotary_dim", "rotary_emb_dim", "rope_dim"):
        value = args.get(key)
        if _is_int(value) and value > 0 and old_head_dim:
            args[key] = max(2, (value * new_head_dim // old_head_dim) // 2 * 2)

    # Widths: every width-like int equal to a model width becomes the tiny width.
    before_widths = {k: v for k, v in args.items() if _is_int(v) and v > 0}
    for key, value in list(args.items()):
        if not _is_int(value) or value <= 0:
            continue
        if key in PRIMARY_WIDTHS or (_is_width_name(key) and (value in widths or value >= WIDE)):
            if value > new_width:
                args[key] = new_width
        elif _is_intermediate_name(key) and value > profile.intermediate:
            args[key] = profile.intermediate
    # Feature dims equal to a width this node just shrank (Mimi's codebook_dim = its VQ hidden dimension, ZoeDepth's
    # bottleneck_features = its fusion_hidden_size).
    shrunk = {before: args[k] for k, before in before_widths.items() if args.get(k) != before}
    for key, value in list(args.items()):
        if (_is_int(value) and value in shrunk and (key.endswith(("_dim", "_dimension")) or (
                key.endswith("_features") and not key.startswith("num_"))) and key not in HEAD_DIMS
                and key not in ROPE_HEAD_DIMS and "head" not in key and not _is_intermediate_name(key)):
            args[key] = shrunk[value]
    # Hierarchical stages double a stem width up to the model width (CLAP's patch_embeds_hidden_size * 2**3 =
    # hidden_size): the stem keeps that ratio to the tiny width.
    stages = next((len(args[k]) for k in DEPTH_LISTS if _int_list(args.get(k))), 0)
    if old_width and stages > 1 and new_width % 2 ** (stages - 1) == 0:
        for key, value in list(args.items()):
            if (any(w in key for w in ("hidden", "embed", "width", "dim", "channels")) and _is_int(value)
                    and before_widths.get(key) == value and key not in HEAD_DIMS
                    and value * 2 ** (stages - 1) == old_width):
                args[key] = new_width // 2 ** (stages - 1)
    # 2-D layout embeddings (LayoutLMv3): 4 coordinate embeddings and 2 shape embeddings concatenate to the width.
    width = primary_width(node)
    if _is_int(args.get("coordinate_size")) and _is_int(args.get("shape_size")) and width:
        shape = max(1, width // 6)
        while (width - 2 * shape) % 4:
            shape += 1
        args["shape_size"], args["coordinate_size"] = shape, (width - 2 * shape) // 4
    # SEANet codecs double num_filters at every up/downsampling stage: the base count stays small.
    _cap(args, ("num_filters",), profile.min_channel)
    # Likewise a codec's base encoder width that doubles at every downsampling ratio (DAC, Xcodec2: 48 * 2**5).
    if any("sampling_ratios" in k and _int_list(v) and len(v) > 2 for k, v in args.items()):
        _cap(args, tuple(k for k in args if k.endswith("hidden_size") and k not in PRIMARY_WIDTHS
                         and k.startswith("encoder")), profile.min_channel)
    # Sine/Fourier position features: half the width each for x and y (SAM's num_pos_feats = hidden_size // 2).
    value = args.get("num_pos_feats")
    if _is_int(value) and 2 * value in widths and 2 * value > new_width:
        args["num_pos_feats"] = new_width // 2
    # Depthwise convolutions over the width (Mimi's upsample_groups = hidden_size) keep groups == channels.
    for key, value in list(args.items()):
        if (key.endswith("groups") and key not in GROUP_COUNTS and _is_int(value) and value > new_width
                and (value in widths or value == old_width)):
            args[key] = new_width
    # Uniform lists of a model width (a detector's decoder_in_channels = [hidden] * levels) follow the width.
    for key, value in list(args.items()):
        if (_int_list(value) and len(set(value)) == 1 and value[0] in widths and value[0] > new_width
                and key not in CHANNEL_LISTS and any(w in key.lower() for w in ("channel", "hidden", "dim"))):
            args[key] = type(value)(new_width for _ in value)
            node.width_lists.add(key)
        # A ramp of channels ending at a model width (UnlimitedOCR's downsample_channels = (512, 1024) into a
        # 1024-wide tower) keeps its ratios and ends at the new width.
        elif (_int_list(value) and len(set(value)) > 1 and value[-1] in widths and value[-1] > new_width
              and max(value) == value[-1] and key not in CHANNEL_LISTS
              and any(w in key.lower() for w in ("channel", "hidden", "dim"))):
            args[key] = type(value)(max(1, v * new_width // value[-1]) for v in value)
            node.width_lists.add(key)

    # Layer counts, never below what layer types and layer indices need.
    for key in LAYER_INDEX_FIELDS:  # indices __post_init__ derives from constants are remapped like given ones
        derived = node.derived_patterns.get(key)
        if args.get(key) is None and key in node.fields and _int_list(derived):
            args[key] = list(derived)
    old_layers = next((args[k] for k in LAYER_COUNTS if _is_int(args.get(k)) and args[k] > 0), None)
    if old_layers:
        need = min_layers(node, profile, old_layers)
        target = min(old_layers, need)
        for key in LAYER_COUNTS:  # each stack (encoder, decoder, ...) shrinks on its own
            if _is_int(args.get(key)) and args[key] > need:
                args[key] = need
        for key, value in list(args.items()):
            if isinstance(value, (list, tuple)) and len(value) == old_layers and old_layers > target and key not in CHANNEL_LISTS:
                args[key] = type(value)(_resample_pattern(list(value), target))
        for key, pattern in node.derived_patterns.items():  # per-layer counts and indices are re-derived
            if args.get(key) is None and len(pattern) == old_layers and not _rederived_per_layer(pattern):
                args[key] = _resample_pattern(list(pattern), target)
        _remap_layer_indices(node, old_layers, target)

        _shrink_periods(node, target)
        _keep_kv_sharing(node)
    _cap(args, OTHER_LAYER_COUNTS, profile.layers)
    _cap(args, PASS_COUNTS, 1)
    patch = args.get("patch_length")
    if _is_int(patch) and patch > 0:
        _cap(args, ("context_length",), CONTEXT_PATCHES * patch)

    # Mixture of experts and low-rank attention.
    _cap(args, EXPERT_COUNTS, profile.experts)
    unset = [k for k in EXPERT_COUNTS if k in node.fields and args.get(k) is None]
    moe_config = "moe_intermediate_size" in node.fields or any(k in node.fields for k in EXPERT_TOP_K)
    if unset and moe_config and not any(_is_int(args.get(k)) for k in EXPERT_COUNTS):
        args[unset[0]] = profile.experts  # an MoE config whose expert count has no default (set by checkpoints)
        if "moe_intermediate_size" in node.fields and args.get("moe_intermediate_size") is None:
            args["moe_intermediate_size"] = profile.intermediate
        for key in SHARED_EXPERTS:
            if key in node.fields and args.get(key) is None:
                args[key] = 1
    has_experts = any(_is_int(args.get(k)) and args[k] > 1 for k in EXPERT_COUNTS)
    for key in EXPERT_TOP_K:
        if _is_int(args.get(key)) and args[key] > profile.top_k:
            args[key] = profile.top_k
        elif key in node.fields and args.get(key) is None and has_experts:
            args[key] = profile.top_k  # a None top-k default is not runnable
    _cap(args, SHARED_EXPERTS, 1)
    _cap(args, GROUP_COUNTS, 1)
    _cap(args, QUERY_COUNTS, MAX_QUERIES)
    # Keypoint detectors keep every keypoint by default (-1) and matchers iterate Sinkhorn 100 times: slow on CPU.
    if _is_int(args.get("max_keypoints")) and not 0 < args["max_keypoints"] <= MAX_KEYPOINTS:
        args["max_keypoints"] = MAX_KEYPOINTS
    _cap(args, ("sinkhorn_iterations",), MAX_SINKHORN)
    _cap(args, FRAME_COUNTS, MAX_FRAMES)
    _cap(args, STATE_SIZES, SMALL_STATE)
    _cap(args, LOW_RANKS, profile.low_rank)
    _cap(args, ROPE_HEAD_DIMS, 8)
    _cap(args, ("first_k_dense_replace",), 1)

    # Vocab and positions.
    _cap(args, tuple(k for k in args if k in VOCABS or "vocab" in k.lower()), profile.vocab)
    _cap(args, POSITIONS, profile.max_positions)
    if _is_int(args.get("max_length")) and args["max_length"] > profile.audio_positions * 2:
        args["max_length"] = profile.audio_positions * 2  # spectrogram frames (AST) or generation length
    _cap(args, AUDIO_POSITIONS, profile.audio_positions)

    _fill_required_unset(node, profile, token_map)

    if not profile.keep_geometry:
        _shrink_vision(node, profile)
        node.channel_map = _shrink_channel_lists(node, profile, old_width)

    _rescale_sections(node, heads)
    _keep_state_space_product(node, heads)


# Tokens per image: as many as patches (PaliGemma) or fewer after pooling (Gemma3): the ratio is kept.
IMAGE_TOKEN_COUNTS = ("mm_tokens_per_image", "image_seq_length", "num_image_tokens", "image_token_count",
                      "tokens_per_image", "num_image_embeds", "latent_query_num")


def image_patches(root: Node) -> int | None:
    """Patches per image of the first config in the tree with an image size and a patch size."""
    for node in root.walk():
        image, patch = node.args.get("image_size"), node.args.get("patch_size")
        image = max(image) if _int_list(image) else image
        patch = patch[0] if _int_list(patch) else patch
        if _is_int(image) and _is_int(patch) and patch > 0:
            return (image // patch) ** 2
    return None


def image_side(root: Node) -> int | None:
    for node in root.walk():
        image = node.args.get("image_size")
        image = max(image) if _int_list(image) else image
        if _is_int(image):
            return image
    return None


def _scale_pinpoints(root: Node, old: int | None, new: int | None) -> None:
    """Any-resolution tilings (``image_grid_pinpoints``) scale with the image side."""
    if not old or not new or old == new:
        return
    for node in root.walk():
        points = node.args.get("image_grid_pinpoints") or node.derived_patterns.get("image_grid_pinpoints")
        if isinstance(points, (list, tuple)) and points and all(_int_list(p) for p in points):
            node.args["image_grid_pinpoints"] = [[v * new // old for v in p] for p in points]


def _scale_image_token_counts(root: Node, old: int | None, new: int | None) -> None:
    if not old or not new:
        return
    for node in root.walk():  # tables keyed by patches per image (Aria's patch_to_query_dict)
        for key, table in list(node.args.items()):
            keys = [int(k) for k in table] if isinstance(table, dict) and table and all(
                str(k).isdigit() for k in table) else []
            if keys:  # keyed by the default geometry's patch count, else the smallest entry is the default one
                ref = old if old in keys else min(keys)
                node.args[key] = {max(1, int(k) * new // ref): v for k, v in table.items()}
    if old == new:
        return
    for node in root.walk():
        for key in IMAGE_TOKEN_COUNTS:
            value = node.args.get(key)
            if not _is_int(value) or value <= 0:
                continue
            scaled = min(new, max(1, round(value * new / old)))
            if math.isqrt(value) ** 2 == value:  # square token grids stay square and tile the patch grid
                side = math.isqrt(new)
                scaled = max(d for d in range(1, side + 1) if side % d == 0 and d * d <= scaled) ** 2
            node.args[key] = scaled


def _clamp_tower_layer_indices(root: Node) -> None:
    """Layer indices in a config without layers of its own (VipLLaVA's ``vision_feature_layers``) index its
    vision tower's layers: they are clamped into the shrunk tower (repeats are fine, features are concatenated)."""
    for node in root.walk():
        if any(_is_int(node.args.get(k)) for k in LAYER_COUNTS):
            continue
        towers = [node.children["vision_config"]] if "vision_config" in node.children else list(node.children.values())
        layers = next((t.args[k] for t in towers for k in LAYER_COUNTS if _is_int(t.args.get(k))), None)
        if not layers:
            continue
        for key in LAYER_INDEX_FIELDS:
            value = node.args.get(key)
            values = list(value) if isinstance(value, (list, tuple)) else [value]
            if not values or not all(_is_int(v) for v in values):
                continue
            new = [max(v, -layers) if v < 0 else min(v, layers - 1) for v in values]
            node.args[key] = type(value)(new) if isinstance(value, (list, tuple)) else new[0]


def _keep_state_space_product(node: Node, heads: int) -> None:
    """Mamba2-style blocks: ``expand * hidden_size == num_heads * head_dim``."""
    args = node.args
    width, expand, n_heads = primary_width(node), args.get("expand"), args.get("num_heads")
    if _is_int(width) and _is_int(expand) and _is_int(n_heads) and _is_int(args.get("head_dim")):
        inner = expand * width
        args["num_heads"] = min(n_heads, max(1, inner // 8))
        args["head_dim"] = inner // args["num_heads"]


# Fields whose default is None but which a forward needs: a padding id (sequence classification with a batch > 1
# finds the last non-pad token) and a forecast horizon.
PREDICTION_LENGTH = 4
HIERARCHICAL_WINDOW = 2


def _fill_required_unset(node: Node, profile: Profile, token_map: dict[int, int]) -> None:
    args = node.args
    if "vocab_size" in node.fields and args.get("vocab_size") is None:
        args["vocab_size"] = profile.vocab
    if "pad_token_id" in node.fields and args.get("pad_token_id") is None and _is_int(args.get("vocab_size")):
        # the smallest id no other special token uses (padding ids also index position tables, e.g. ESM)
        used = {v for k, v in args.items() if _is_token_field(k) and _is_int(v)}
        args["pad_token_id"] = min(i for i in range(len(used) + 1) if i not in used)
    if "default_language" in node.fields and args.get("default_language") is None and args.get("languages"):
        args["default_language"] = list(args["languages"])[0]  # X-MOD refuses to guess the language adapter
    width = primary_width(node)
    dims = args.get("axial_pos_embds_dim")
    if _int_list(dims) and width and sum(dims) != width:  # Reformer: axial position factors sum to the width
        args["axial_pos_embds_dim"] = type(dims)(_proportional(list(dims), width))
    types = args.get("layer_types") or node.derived_patterns.get("layer_types") or []
    if ("sliding_window" in node.fields and args.get("sliding_window") is None and isinstance(types, (list, tuple))
            and "sliding_attention" in types):  # sliding layers with no window (set by checkpoints)
        args["sliding_window"] = profile.window
    if "prediction_length" in node.fields and args.get("prediction_length") is None:
        args["prediction_length"] = PREDICTION_LENGTH


PLACEHOLDER_FIELDS = ("image_token_index", "image_token_id", "video_token_index", "audio_token_id")


def _fill_unset_placeholder_ids(root: Node, profile: Profile, token_map: dict[int, int]) -> None:
    """A multimodal config whose image placeholder id defaults to None (BLIP-2) gets a reserved id."""
    vocabs = [n.args["vocab_size"] for n in root.walk() if _is_int(n.args.get("vocab_size"))]
    if not vocabs or not root.children:
        return
    for i, key in enumerate(PLACEHOLDER_FIELDS):
        if key in root.fields and root.args.get(key) is None:
            root.args[key] = min(min(vocabs), profile.vocab) - 2 - i - len(token_map)


def _shrink_vision(node: Node, profile: Profile) -> None:
    args = node.args
    patch = args.get("patch_size")
    patch = patch[0] if _int_list(patch) else patch
    image = args.get("image_size")
    if _is_int(image) or _int_list(image):
        stages = next((len(args[k]) for k in DEPTH_LISTS if _int_list(args.get(k))), 0)
        if _is_int(patch) and patch > 0:
            grid = max(profile.image_grid, 2 ** stages)  # hierarchical models halve the grid per stage
            merge = args.get("spatial_merge_size") or args.get("merge_size") or 1
            if _is_int(merge) and merge > 1:
                grid = max(grid, merge * 2)
            window = args.get("window_size")
            if _is_int(window) and window % patch == 0 and window > patch:  # windows in pixels
                grid = max(grid, window // patch)
            elif _is_int(window) and stages > 1:  # windows in patches: the last stage still holds one window
                window = min(window, HIERARCHICAL_WINDOW)
                args["window_size"] = window
                grid = max(grid, window * 2 ** (stages - 1))
            side = patch * grid
        else:
            side = profile.conv_image_size
        old = image if _is_int(image) else max(image)
        if side < old:
            args["image_size"] = side if _is_int(image) else type(image)(side for _ in image)
    for key in ("window_size",):
        value = args.get(key)
        pixel_window = _is_int(patch) and patch > 1 and _is_int(value) and value % patch == 0 and value > patch
        if _is_int(value) and value > profile.window and not pixel_window:
            args[key] = profile.window
            rate = next((v for k, v in args.items() if "downsample" in k and _is_int(v) and v > 1), None)
            if rate and value % rate == 0:  # windows pooled by a downsampling rate keep a whole multiple of it
                args[key] = rate * max(1, profile.window // rate)
    for key in DEPTH_LISTS:
        if _int_list(args.get(key)):
            args[key] = type(args[key])(min(v, 1) if v > 0 else v for v in args[key])
    for key in HEAD_LISTS:
        value = args.get(key)
        if _int_list(value) and value[0] > 0:
            args[key] = type(value)(max(1, v // value[0]) for v in value)


def _shrink_channel_lists(node: Node, profile: Profile, old_width: int | None) -> dict[int, int]:
    """One value map per config for chained channel lists (conv nets), keeping the ratios between stages.

    Returns the map (old channels -> new) so that lists elsewhere in the tree that name the same channels (a
    detector's ``encoder_in_channels`` = its backbone's stage channels) follow it.
    """
    args = node.args
    lists = {k: args[k] for k in CHANNEL_LISTS if _int_list(args.get(k))}
    if not lists:
        return {}
    smallest = min((v for values in lists.values() for v in values if v >= profile.min_channel), default=0)
    if not smallest:
        return {}
    divisor = max(1.0, smallest / profile.min_channel)
    mapping: dict[int, int] = {}
    for key, values in lists.items():
        new = _scale_channel_list(list(values), divisor, profile.min_channel)
        mapping.update(zip(values, new))
        args[key] = type(values)(new)
    for key in ("embedding_size", "stem_channels", "num_filters", "hidden_size", "embed_dim", "out_features_dim"):
        value = args.get(key)
        if _is_int(value) and value > 0 and key not in lists:
            args[key] = _scale_channel_list([value], divisor, profile.min_channel)[0]
            mapping[value] = args[key]
    # Block tables (PP-LCNet's block_configs: [kernel, in, out, stride, se] per block, per stage), given or derived
    # by __post_init__: channel entries take the same divisor (kernels and strides stay under the floor).
    for key in set(args) | set(node.derived_patterns):
        table = args.get(key) if args.get(key) is not None else node.derived_patterns.get(key)
        if (any(w in key for w in BLOCK_TABLE_WORDS) and _nested(table)
                and any(_is_int(v) and mapping.get(v, v) != v for v in _leaves(table))):
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
    return _scale_channel_list([value], divisor, minimum)[0] if _is_int(value) else value


def _follow_channel_maps(root: Node) -> None:
    """Channel lists naming a sub-config's channels (all values known to its map) take the mapped values."""
    for node in root.walk():
        for child in node.children.values():
            mapping = getattr(child, "channel_map", None) or {}
            if not mapping:
                continue
            for key, value in list(node.args.items()):
                if _is_int(value) and value in mapping and "feat" in key and any(
                        w in key for w in ("dim", "channel")):  # one backbone stage's channels (x4_feat_dim)
                    node.args[key] = mapping[value]
                    continue
                if key in CHANNEL_LISTS or key in node.width_lists or not _int_list(value) or not all(
                        v in mapping for v in value):
                    continue
                if any(w in key.lower() for w in ("channel", "hidden", "dim", "size")):
                    node.args[key] = type(value)(mapping[v] for v in value)


def _rescale_sections(node: Node, heads: int) -> None:
    """Section lists that must sum to half the head dim (multimodal RoPE) are rescaled proportionally."""
    head_dim = node.args.get("head_dim")
    if not _is_int(head_dim):
        width = primary_width(node)
        head_dim = width // heads if width else None
    if not head_dim:
        return
    for key in ("rope_parameters", "rope_scaling"):
        rope = node.args.get(key)
        if isinstance(rope, dict) and _int_list(rope.get("mrope_section")):
            rope = dict(rope)
            rope["mrope_section"] = _proportional(rope["mrope_section"], head_dim // 2)
            node.args[key] = rope
    if _int_list(node.args.get("mrope_section")):
        node.args["mrope_section"] = _proportional(node.args["mrope_section"], head_dim // 2)


def _proportional(sections: list[int], total: int) -> list[int]:
    old = sum(sections)
    out = [max(1, s * total // old) for s in sections]
    out[-1] += total - sum(out)
    return out


def default_config(config_class: type):
    """The config class's default instance; a default its own validator rejects (Gemma 4 assistant's text config
    keeps per-layer inputs the assistant forbids) is built unvalidated: the shrunk tree is repaired on rebuild."""
    try:
        return config_class()
    except Exception:  # noqa: BLE001 - re-raised when the class has no unvalidated constructor
        unvalidated = getattr(config_class.__init__, "__wrapped__", None)
        if unvalidated is None:
            raise
        config = config_class.__new__(config_class)
        unvalidated(config)
        return config


def _tower_width_sums(root: Node) -> list[tuple[Node, str, list[Node]]]:
    """Width fields whose default is the node's width plus its sub-configs' widths (a codec's fused semantic and
    acoustic features: Xcodec2's ``quantization_dim`` = ``hidden_size`` + ``semantic_model_config.hidden_size``)."""
    out = []
    for node in root.walk():
        own, towers = primary_width(node), [c for c in node.children.values() if primary_width(c)]
        if not own or not towers:
            continue
        total = own + sum(primary_width(c) for c in towers)
        for key, value in node.args.items():
            if key not in PRIMARY_WIDTHS and _is_width_name(key) and _is_int(value) and value == total:
                out.append((node, key, towers))
    return out


def _follow_tower_width_sums(sums: list[tuple[Node, str, list[Node]]]) -> None:
    for node, key, towers in sums:
        node.args[key] = primary_width(node) + sum(primary_width(c) for c in towers)


def shrink_config(config_class: type, profile: Profile = PROFILES[0], overrides: dict | None = None,
                  base=None, implicit_defaults: dict | None = None):
    """A tiny, validated instance of ``config_class`` (or of ``base``'s class, starting from ``base``).

    ``implicit_defaults`` are values the modeling code assumes when a config leaves them out (learned from a
    forward error by :func:`implicit_default_from_error`); they are added before shrinking so they shrink too.
    """
    root = raw_tree(base, from_defaults=False) if base is not None else raw_tree(default_config(config_class))
    widths = tree_widths(root)
    token_map = token_id_map(root, profile.vocab)
    old_patches = image_patches(root)
    old_side = image_side(root)
    old_sums = _tower_width_sums(root)
    for node in root.walk():
        shrink_node(node, profile, widths, token_map)
    _follow_tower_width_sums(old_sums)
    _scale_image_token_counts(root, old_patches, image_patches(root))
    _follow_channel_maps(root)
    _scale_pinpoints(root, old_side, image_side(root))
    _fill_unset_placeholder_ids(root, profile, token_map)
    _clamp_tower_layer_indices(root)
    for node in root.walk():  # exact values the modeling code asked for, after the generic rescaling
        for key, value in (implicit_defaults or {}).items():
            if key in node.fields and isinstance(value, dict) and (node.args.get(key) or "rope" in key):
                node.args[key] = {**(node.args.get(key) or {}), **value}
            elif key in node.fields and not isinstance(value, dict) and node.args.get(key) is None:
                node.args[key] = value  # a scalar the modeling code reads unconditionally (sliding_window)
        _raise_vocab(root, node, *(implicit_defaults or {}).get(VOCAB_AT_LEAST, (None, None)))
        got, wanted = (implicit_defaults or {}).get(PROJECTION_WIDTH, (None, None))
        for key, value in list(node.args.items()):  # a projection width the other tower's embedding must meet
            if got and "proj" in key and _is_width_name(key) and value == got:
                node.args[key] = wanted
    if overrides:
        root.apply(overrides)
    return build_with_repairs(root)


# -- values the modeling code assumes when the config leaves them out -----------------------------------------
# Qwen-VL style models split the rotary frequencies with `rope_parameters.get("mrope_section", [16, 24, 24])`: a
# default sized for head_dim 128. The forward error names the sections; they are added and rescaled.
_SPLIT_SECTIONS = re.compile(r"split_with_sizes expects split_sizes to sum exactly to (\d+) \(input tensor's size at "
                             r"dimension -1\).*?split_sizes=\[([\d, ]+)\]")


# Models that build a sliding-window mask even when no layer slides (Step3p7) need a window in the config.
_NO_WINDOW = re.compile(r"Could not find a `sliding_window` argument in the config, or it is not set")
IMPLICIT_WINDOW = 4
_SIMILARITY = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x\1\)")
#: key of an implicit value: (a vocabulary now, the ids it must hold)
VOCAB_AT_LEAST = "<vocab at least>"
#: key of an implicit value: (projection width now, the width the other embedding has)
PROJECTION_WIDTH = "<projection width>"


def _is_vocab(key: str) -> bool:
    return key in VOCABS or "vocab" in key.lower()


def _raise_vocab(root: Node, node: Node, small: int | None, need: int | None) -> None:
    """Vocabularies of ``small`` entries become the smallest vocabulary of the tree that holds ``need`` ids."""
    if not small:
        return
    sizes = [v for n in root.walk() for k, v in n.args.items() if _is_vocab(k) and _is_int(v) and v >= need]
    for key, value in list(node.args.items()):
        if _is_vocab(key) and value == small:
            node.args[key] = min(sizes, default=need)


def implicit_default_from_error(message: str) -> dict | None:
    if _NO_WINDOW.search(message):
        return {"sliding_window": IMPLICIT_WINDOW}
    found = _SIMILARITY.search(message)
    if found and found.group(2) != found.group(3):
        # (B x P) @ (Q x B): two embeddings of the same batch compared (contrastive logits) whose widths differ: one
        # tower's width is derived (ALIGN's EfficientNet: last channels x width coefficient), so the projection
        # width, shrunk on its own, must be the other embedding's width
        return {PROJECTION_WIDTH: (int(found.group(2)), int(found.group(3)))}
    found = _SPLIT_SECTIONS.search(message)
    if not found:
        return None
    total, sections = int(found.group(1)), [int(v) for v in found.group(2).split(",")]
    return {"rope_parameters": {"mrope_section": _proportional(sections, total)}}


# -- repairs from the config's own validation messages ---------------------------------------------------------
# "`vision_config.out_hidden_size` (1024) must equal `text_config.hidden_size` (32)": the first field takes the
# value of the second. Only equalities are repaired this way; any other message is the config_error reason.
_EQUALITY = re.compile(
    r"`?([\w.]+)`?\s*\((\d+)\)\s*(?:must|should)\s*(?:be\s*)?(?:equal|match)(?:\s*to)?\s*(?:the\s*)?"
    r"(?:[\w ]*?)`?([\w.\[\]]+)(?:\s*(?://|\*|\+|-)\s*\d+)?`?\s*(?:\(|=\s*)(\d+)")
MAX_REPAIRS = 6


def build_with_repairs(root: Node):
    last: Exception | None = None
    for _ in range(MAX_REPAIRS + 1):
        try:
            return build_config(root)
        except Exception as exc:  # noqa: BLE001 - parsed below; re-raised when no repair applies
            last = exc
            if not (_repair_equality(root, str(exc)) or _repair_layer_index(root, str(exc))
                    or _repair_required_value(root, str(exc))):
                raise
    raise last  # type: ignore[misc]


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
