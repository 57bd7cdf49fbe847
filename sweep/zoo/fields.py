"""What config field names mean: the vocabularies the shrinker, its rules and the config lessons share.

Transformers' configs share field names across families (``hidden_size``, ``num_attention_heads``, ``*_token_id``);
the zoo recognises a field by these tuples and predicates, never by a model type. Kept below :mod:`sweep.zoo.shrink`,
:mod:`sweep.zoo.shrink_rules`, :mod:`sweep.zoo.repairs` and the lessons (:mod:`sweep.zoo.init_lessons`,
:mod:`sweep.zoo.implicit_default_lessons`) so that none imports another for a name list.
"""

from __future__ import annotations

from typing import Any

from sweep.zoo.config_tree import Node

# Names of config fields, grouped by what they mean.

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
# Zero-compute (identity) experts routed to alongside the real ones (LongCat-Flash: 256 by default)
ZERO_EXPERTS = ("zero_expert_num",)
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
# Per-stage counts of repeated blocks that no other rule reads (Funnel's block_sizes, HGNetV2's blocks per stage
# and layers per block, EfficientNet's block repeats, CvT's depth list, MobileViTV2's attention blocks): one each.
STAGE_BLOCK_COUNTS = ("block_sizes", "stage_num_blocks", "stage_numb_of_layers", "num_block_repeats", "depth",
                      "n_attn_blocks")
HEAD_LISTS = ("num_heads", "num_attention_heads", "heads", "num_heads_per_stage", "attention_heads")


WIDE = 128  # a width-named field at least this wide is a model width whatever its value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(is_int(v) for v in value)


def primary_width(node: Node) -> int | None:
    for key in PRIMARY_WIDTHS:
        if is_int(node.args.get(key)) and node.args[key] > 0:
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


def is_width_name(key: str) -> bool:
    k = key.lower()
    return (any(w in k for w in WIDTH_WORDS) and not any(w in k for w in NOT_WIDTH_WORDS)
            and not k.startswith("n_"))


def is_intermediate_name(key: str) -> bool:
    return any(w in key.lower() for w in INTERMEDIATE_WORDS)


def is_token_field(key: str, config_class: type | None = None) -> bool:
    """Whether ``key`` holds a token id: by its name, or (given its config class) as the field an ``attribute_map``
    alias with a token-id name reads (Molmo2's ``image_token_id`` is ``image_patch_id``)."""
    k = key.lower()
    if k.endswith(("_token_id", "_token_ids", "_token_index", "_token_idx", "_id_token")) or k in {
            "pad_token_id", "image_token_index", "decoder_start_token_id", "padding_idx", "mask_token_id"}:
        return True
    aliases = getattr(config_class, "attribute_map", None) or {}
    return any(target == key and is_token_field(alias) for alias, target in aliases.items())


def is_vocab(key: str) -> bool:
    return key in VOCABS or "vocab" in key.lower()


def resample_pattern(pattern: list, layers: int) -> list:
    """A per-layer list shrunk to ``layers`` entries, keeping one of each distinct value in first-seen order."""
    pattern = [list(v) if isinstance(v, tuple) else v for v in pattern]
    distinct = list(dict.fromkeys(hashable(v) for v in pattern))
    order = [pattern[[hashable(v) for v in pattern].index(d)] for d in distinct]
    out = list(order)
    i = 0
    while len(out) < layers:
        out.append(pattern[i % len(pattern)])
        i += 1
    return out[: max(layers, len(order))]


def hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, hashable(v)) for k, v in value.items()))
    return value


def proportional(sections: list[int], total: int) -> list[int]:
    old = sum(sections)
    out = [max(1, s * total // old) for s in sections]
    out[-1] += total - sum(out)
    return out
