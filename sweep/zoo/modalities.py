"""One recipe per forward parameter: how to make a sample of it from the config.

Recipes read config fields (vocab, image size, channels, mel bins, context length, ...) from whichever config in
the tree holds them (:class:`sweep.zoo.context.Context`), and write into ``Context.made`` so later recipes can match
shapes (the attention mask follows the ids). :data:`RECIPES` maps a forward parameter name to its recipe;
:func:`recipe_for` also knows parameters by what their name says. Other layouts of the same sample live in
:mod:`sweep.zoo.layouts`, samples for parameters no recipe knows in :mod:`sweep.zoo.fallback`.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from transformers import PreTrainedConfig

from sweep.zoo.context import (AUDIO_FRAMES, SEQ, WAVEFORM, Context, image_channels, image_side, image_token_id,
                               model_modalities, vocab_size)

ALWAYS_WITH_IDS = ("attention_mask", "bbox", "decoder_input_ids", "visual_feats", "visual_pos",
                   "image_embeds_position_mask")
REGIONS = 4  # detected image regions for models fed region features (LXMERT)
WITH_FEATURES = ("input_features_mask", "feature_attention_mask", "input_features_attention_mask")
MODALITY_INPUTS = {
    "image": ("pixel_values",),
    "audio": ("input_features", "input_values"),
}
TIME_SERIES_INPUTS = ("past_values", "past_time_features", "past_observed_mask", "static_categorical_features",
                      "static_real_features", "future_time_features")


# -- text -----------------------------------------------------------------------------------------------------


def input_ids(ctx: Context) -> torch.Tensor:
    vocab = vocab_size(ctx)
    length = ctx.hints.text_len
    ids = ctx.token_ids((ctx.batch, length), vocab)
    eos = getattr(ctx.text_config(), "eos_token_id", None)
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    if isinstance(eos, int) and 0 <= eos < vocab:  # classification heads of encoder-decoders pool on <eos>
        ids[:, -1] = eos
    image_id = image_token_id(ctx)
    if image_id is not None and "pixel_values" in ctx.made:
        n = ctx.hints.image_tokens or _guess_image_tokens(ctx)
        ids = _insert(ids, image_id, n)
    audio_id = ctx.find("audio_token_id", "audio_token_index")
    audio_input = next((k for k in ("input_features", "input_values") if k in ctx.made), None)
    if audio_id is not None and audio_input is not None:
        ids = _insert(ids, audio_id, ctx.hints.audio_tokens or 1)
    for token in getattr(ctx.hints, "tokens", ()):  # special tokens the model said every row needs
        ids = _insert(ids, token, 1)
    ctx.made["input_ids"] = ids
    return ids


def _insert(ids: torch.Tensor, token: int, count: int) -> torch.Tensor:
    """``count`` placeholder tokens after the first token of every row."""
    placeholder = torch.full((ids.shape[0], count), token, dtype=torch.long)
    return torch.cat([ids[:, :1], placeholder, ids[:, 1:]], dim=1)


def image_embeds_position_mask(ctx: Context) -> torch.Tensor | None:
    """Kosmos-2: 1 where the image's latent queries replace text embeddings, right after the first token."""
    ids = ctx.made.get("input_ids")
    if ids is None:
        return None
    count = int(ctx.find("latent_query_num", default=1))
    mask = torch.zeros_like(ids)
    mask[:, 1:1 + count] = 1
    return mask


def mm_token_type_ids(ctx: Context) -> torch.Tensor | None:
    """1 where an image placeholder sits (Qwen-VL style multimodal RoPE), 0 elsewhere."""
    ids = ctx.made.get("input_ids")
    image_id = image_token_id(ctx)
    if ids is None or image_id is None:
        return None
    return (ids == image_id).int()


def _guess_image_tokens(ctx: Context) -> int:
    for key in ("mm_tokens_per_image", "image_seq_length", "num_image_tokens", "image_token_count",
                "num_query_tokens", "tokens_per_image", "vision_soft_tokens_per_image"):
        value = ctx.find(key)
        if isinstance(value, int) and value > 0:
            return value
    h, w = image_side(ctx)
    patch = ctx.find("patch_size", default=16)
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    return max(1, (h // patch) * (w // patch))


def attention_mask(ctx: Context) -> torch.Tensor | None:
    ids = ctx.made.get("input_ids")
    if ids is None:
        return None
    return torch.ones_like(ids)


def token_type_ids(ctx: Context) -> torch.Tensor | None:
    ids = ctx.made.get("input_ids")
    return None if ids is None else torch.zeros_like(ids)


def decoder_input_ids(ctx: Context) -> torch.Tensor:
    ids = ctx.token_ids((ctx.batch, ctx.hints.text_len), vocab_size(ctx, decoder=True))
    start = ctx.find("decoder_start_token_id")
    if isinstance(start, int):
        ids[:, 0] = start
    ctx.made["decoder_input_ids"] = ids
    return ids


def decoder_attention_mask(ctx: Context) -> torch.Tensor | None:
    ids = ctx.made.get("decoder_input_ids")
    return None if ids is None else torch.ones_like(ids)


def bbox(ctx: Context) -> torch.Tensor:
    ids = ctx.made.get("input_ids")
    length = ids.shape[1] if ids is not None else SEQ
    corners = torch.randint(0, 1000, (ctx.batch, length, 2, 2), generator=ctx.gen).sort(dim=2).values
    return corners.reshape(ctx.batch, length, 4)  # (x0, y0, x1, y1) with x0 <= x1, y0 <= y1


def visual_feats(ctx: Context) -> torch.Tensor:
    """Region features of an object detector: (B, regions, visual_feat_dim)."""
    return ctx.floats(ctx.batch, REGIONS, int(ctx.find("visual_feat_dim", default=2048)))


def visual_pos(ctx: Context) -> torch.Tensor:
    """Normalised region boxes: (B, regions, visual_pos_dim) in [0, 1]."""
    return torch.rand(ctx.batch, REGIONS, int(ctx.find("visual_pos_dim", default=4)), generator=ctx.gen)


# -- vision ---------------------------------------------------------------------------------------------------


def pixel_values(ctx: Context) -> torch.Tensor:
    h, w = image_side(ctx)
    c = image_channels(ctx)
    if "image_grid_thw" in ctx.params or "grid_thw" in ctx.params or "image_grid_hw" in ctx.params:
        return _patchified_pixels(ctx, c, h, w)
    if getattr(ctx.hints, "patch_width", None):  # flattened patches, one placeholder each (NeoMME)
        per_row = ctx.hints.image_tokens or 4
        ctx.hints.image_tokens = per_row
        values = ctx.floats(ctx.batch * per_row, ctx.hints.patch_width)
        ctx.made["pixel_values"] = values
        return values
    if "pixel_position_ids" in ctx.params:  # Gemma 4: patchified (B, patches, C*P*P) with (x, y) per patch
        patch = ctx.find("patch_size", default=16)
        side = max(1, h // patch)
        ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        positions = torch.stack([xs.flatten(), ys.flatten()], dim=-1)
        ctx.made["pixel_position_ids"] = positions[None].repeat(ctx.batch, 1, 1)
        values = ctx.floats(ctx.batch, side * side, c * patch * patch)
        ctx.made["pixel_values"] = values
        return values
    if "spatial_shapes" in ctx.params:
        made = patch_sequence(ctx)
        ctx.made.update(made)
        return made["pixel_values"]
    if frames_video := _video_frames(ctx):
        values = ctx.floats(ctx.batch, frames_video, c, h, w)
        ctx.made["pixel_values"] = values
        return values
    if ctx.hints.tiles:
        values = ctx.floats(ctx.batch, ctx.hints.tiles, c, h, w)
    else:
        values = ctx.floats(ctx.batch, c, h, w)
    ctx.made["pixel_values"] = values
    return values


def flattened_patches(ctx: Context) -> torch.Tensor:
    """Pix2Struct: (B, patches, 2 + patch width), each patch led by its 1-based row and column on a 4 x 4 grid."""
    patch = ctx.find("patch_size", default=16)
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    width = int(ctx.find("patch_embed_hidden_size", default=None) or image_channels(ctx) * patch * patch)
    side = 4
    rows, cols = torch.meshgrid(torch.arange(1, side + 1), torch.arange(1, side + 1), indexing="ij")
    limit = int(ctx.find("seq_len", default=side + 1)) - 1  # row/column embeddings have seq_len entries
    positions = torch.stack([rows.flatten(), cols.flatten()], dim=-1).clamp(max=max(0, limit)).float()
    values = torch.cat([positions[None].repeat(ctx.batch, 1, 1), ctx.floats(ctx.batch, side * side, width)], dim=-1)
    ctx.made["flattened_patches"] = values
    return values


def _video_frames(ctx: Context) -> int | None:
    frames = ctx.find("num_frames", where=lambda cfg: cfg is ctx.vision_config()) or ctx.find("num_frames")
    modalities = model_modalities(ctx.model)
    # pixel_values hold a clip when the model reads video and has no separate video input
    if isinstance(frames, int) and frames > 0 and "video" in modalities and "pixel_values_videos" not in ctx.params:
        return frames
    return None


def _patchified_pixels(ctx: Context, c: int, h: int, w: int) -> torch.Tensor:
    """Qwen-VL style: (sum of t*h*w patches, C * temporal_patch * patch * patch) plus ``image_grid_thw``."""
    patch = ctx.find("patch_size", default=14)
    temporal = ctx.find("temporal_patch_size", "patch_temporal", default=1)
    merge = ctx.find("spatial_merge_size", "merge_size", default=1)
    gh, gw = h // patch, w // patch
    if isinstance(merge, int) and merge > 1:  # whole merge blocks: a 64-pixel side in 20-pixel patches is 3, not 2k
        gh, gw = max(merge, gh - gh % merge), max(merge, gw - gw % merge)
    grid = torch.tensor([[1, gh, gw]] * ctx.batch)
    ctx.made["image_grid_thw"] = ctx.made["grid_thw"] = grid
    ctx.made["image_grid_hw"] = grid[:, 1:]  # (height, width) grids without the temporal axis (Nemotron-H Omni)
    ctx.hints.image_tokens = ctx.hints.image_tokens or (gh * gw) // (merge * merge)
    values = ctx.floats(ctx.batch * gh * gw, c * temporal * patch * patch)
    ctx.made["pixel_values"] = values
    return values


def pixel_values_videos(ctx: Context) -> torch.Tensor:
    """(B, frames, C, H, W); frames from the config (a multiple of the tubelet size where there is one)."""
    h, w = image_side(ctx)
    frames = ctx.find("num_frames", "frames_per_clip", default=None) or 2 * int(ctx.find("tubelet_size", default=1))
    return ctx.floats(ctx.batch, int(frames), image_channels(ctx), h, w)


def patch_sequence(ctx: Context) -> dict[str, torch.Tensor]:
    """NaFlex style (Siglip2): (B, patches, C*P*P) with ``spatial_shapes`` and ``pixel_attention_mask``."""
    h, w = image_side(ctx)
    patch = ctx.find("patch_size", default=16)
    patches = int(ctx.find("num_patches", default=0) or (h // patch) * (w // patch))
    side = int(patches ** 0.5)
    return {"pixel_values": ctx.floats(ctx.batch, side * side, image_channels(ctx) * patch * patch),
            "spatial_shapes": torch.tensor([[side, side]] * ctx.batch),
            "pixel_attention_mask": torch.ones(ctx.batch, side * side, dtype=torch.long)}


def pixel_attention_mask(ctx: Context) -> torch.Tensor | None:
    """Ones over the pixels (tiled layouts: one mask per tile)."""
    if "pixel_attention_mask" in ctx.made:
        return ctx.made["pixel_attention_mask"]
    x = ctx.made.get("pixel_values")
    if x is None or x.dim() < 4:
        return None
    return torch.ones(*x.shape[:-3], *x.shape[-2:], dtype=torch.bool)


def _patch_grid(ctx: Context) -> torch.Tensor:
    """(B, 2) patches per side of each image (MiniCPM-V's ``target_sizes``)."""
    h, w = image_side(ctx)
    patch = ctx.find("patch_size", default=14)
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    return torch.tensor([[h // patch, w // patch]] * ctx.batch, dtype=torch.int32)


def _merge_sizes(ctx: Context) -> torch.Tensor | None:
    """One spatial merge size per image (VideoLLaMA3), alongside patchified pixels."""
    grid = ctx.made.get("image_grid_thw", ctx.made.get("grid_thw"))
    if grid is None:
        return None
    return torch.full((grid.shape[0],), int(ctx.find("spatial_merge_size", "merge_size", default=1)))


def image_grid_thw(ctx: Context) -> torch.Tensor | None:
    return ctx.made.get("image_grid_thw")


def pixel_mask(ctx: Context) -> torch.Tensor:
    h, w = image_side(ctx)
    return torch.ones(ctx.batch, h, w, dtype=torch.long)


def image_sizes(ctx: Context) -> torch.Tensor:
    h, w = image_side(ctx)
    return torch.tensor([[h, w]] * ctx.batch)


# -- audio ----------------------------------------------------------------------------------------------------


def _mel_bins(ctx: Context) -> int:
    return ctx.find("num_mel_bins", "feature_size", "n_mels", "input_feat_per_channel", "num_mel_filters",
                    "input_feat_size", default=80)


def audio_frames(ctx: Context) -> int:
    if ctx.hints.frames:
        return ctx.hints.frames
    positions = ctx.find("max_source_positions")
    if isinstance(positions, int) and positions > 0:
        return 2 * positions
    frames = ctx.find("max_length")  # spectrogram transformers with fixed-length position embeddings
    return frames if isinstance(frames, int) and frames > 0 else AUDIO_FRAMES


def input_features(ctx: Context) -> torch.Tensor:
    mels = ctx.hints.feature_dim or _mel_bins(ctx)
    channels = ctx.find("input_channels", default=1) if ctx.find("input_feat_per_channel") else 1
    if ctx.hints.feature_dim:  # the model said which last dimension it wants: (B, T, F)
        x = ctx.floats(ctx.batch, audio_frames(ctx), mels)
        ctx.made["input_features"] = x
        return x
    x = ctx.floats(ctx.batch, mels * channels, audio_frames(ctx))
    ctx.made["input_features"] = x
    return x


def features_mask(ctx: Context) -> torch.Tensor | None:
    x = ctx.made.get("input_features")
    if x is None:
        return None
    frames = x.shape[1] if ctx.hints.feature_dim else x.shape[-1]  # (B, T, F) once the model named F
    return torch.ones(x.shape[0], frames, dtype=torch.long)


def generic_inputs(ctx: Context) -> torch.Tensor:
    """Models whose main input is just ``inputs`` (Perceiver): by the modality the class declares."""
    base = getattr(ctx.model, "perceiver", ctx.model)
    if hasattr(base, "input_preprocessor"):  # the preprocessor decides the input: none means ready embeddings
        kind = type(base.input_preprocessor).__name__.lower()
        if base.input_preprocessor is None:
            return ctx.floats(ctx.batch, SEQ, int(ctx.find("d_model", "hidden_size", default=32)))
        if "text" in kind:
            return input_ids(ctx)
    modalities = model_modalities(ctx.model)
    if "image" in modalities:
        return pixel_values(ctx)
    if "audio" in modalities:
        return input_values(ctx)
    return input_ids(ctx)


def _mel_sequence(ctx: Context) -> torch.Tensor:
    """(B, T, mels): encoders that name their spectrogram input ``audio_mel``."""
    return ctx.floats(ctx.batch, audio_frames(ctx), _mel_bins(ctx))


def input_values(ctx: Context) -> torch.Tensor:
    values = ctx.floats(ctx.batch, ctx.hints.samples or WAVEFORM)
    ctx.made["input_values"] = values
    return values


def latents(ctx: Context) -> torch.Tensor:
    """Codec decoders' continuous latents: (B, hidden, frames)."""
    width = ctx.find("hidden_size", "latent_dim", "dimension", default=32)
    return ctx.floats(ctx.batch, int(width), 4)


# -- time series ----------------------------------------------------------------------------------------------


def needs_time_series(params: dict[str, inspect.Parameter]) -> bool:
    return "past_values" in params


def _history_length(ctx: Context) -> int:
    context = ctx.find("context_length", default=None) or ctx.find("prediction_length", default=8) * 2
    lags = ctx.find("lags_sequence", default=[0]) or [0]
    return int(context) + int(max(lags))


def _series_channels(ctx: Context) -> int:
    return int(ctx.find("input_size", "num_input_channels", "num_channels", default=1) or 1)


def past_values(ctx: Context) -> torch.Tensor:
    channels = _series_channels(ctx)
    shape = (ctx.batch, _history_length(ctx)) + ((channels,) if channels > 1 or "num_input_channels" in
                                                  vars(ctx.config) else ())
    values = ctx.floats(*shape)
    ctx.made["past_values"] = values
    return values


def past_observed_mask(ctx: Context) -> torch.Tensor:
    return torch.ones_like(ctx.made.get("past_values", past_values(ctx)))


def _time_features(ctx: Context) -> int:
    return int(ctx.find("num_time_features", default=0) or 0) + int(ctx.find("num_dynamic_real_features",
                                                                           default=0) or 0)


def past_time_features(ctx: Context) -> torch.Tensor | None:
    """(B, history, time features); zero features is a valid (empty) last dimension."""
    return ctx.floats(ctx.batch, _history_length(ctx), _time_features(ctx))


def future_time_features(ctx: Context) -> torch.Tensor | None:
    length = ctx.find("prediction_length", default=None)
    return ctx.floats(ctx.batch, length, _time_features(ctx)) if length else None


def static_categorical_features(ctx: Context) -> torch.Tensor | None:
    n = ctx.find("num_static_categorical_features", default=0)
    if not n:
        return None
    cardinality = ctx.find("cardinality", default=[2] * n)
    cols = [torch.randint(0, max(1, card), (ctx.batch, 1), generator=ctx.gen) for card in cardinality[:n]]
    return torch.cat(cols, dim=1)


def static_real_features(ctx: Context) -> torch.Tensor | None:
    n = ctx.find("num_static_real_features", default=0)
    return ctx.floats(ctx.batch, n) if n else None


# -- offline reinforcement learning (trajectories) ------------------------------------------------------------

TRAJECTORY_INPUTS = ("states", "actions", "rewards", "returns_to_go", "timesteps")


def _trajectory(ctx: Context, name: str) -> torch.Tensor:
    length = 4
    if name == "timesteps":
        top = int(ctx.find("max_ep_len", default=16))
        return torch.randint(0, max(1, top), (ctx.batch, length), generator=ctx.gen)
    width = {"states": ctx.find("state_dim", default=4), "actions": ctx.find("act_dim", default=4)}.get(name, 1)
    return ctx.floats(ctx.batch, length, int(width))


def flow_timestep(ctx: Context) -> torch.Tensor:
    """A flow-matching forward's ``timestep``, one per sample in [0, 1) (PI0 draws it from a Beta distribution when
    the caller gives none: a random draw that eager and a program would make differently)."""
    return torch.rand(ctx.batch, generator=ctx.gen)


# -- inputs named after another input or a sub-config ---------------------------------------------------------


def prefixed_pixel_values(ctx: Context, name: str) -> torch.Tensor:
    """``high_res_pixel_values``, ``codebook_pixel_values``, ``prompt_pixel_values``: images for the sub-config
    whose name holds the prefix (``high_res_vision_config``, ``image_codebook_config``), else like ``pixel_values``."""
    prefix = name[: -len("pixel_values")].strip("_")
    for c in ctx.configs():
        for key in getattr(c, "sub_configs", {}) or {}:
            sub = getattr(c, key, None)
            if prefix and prefix in key and isinstance(sub, PreTrainedConfig):
                size = getattr(sub, "image_size", None) or 64
                h, w = (size[0], size[-1]) if isinstance(size, (list, tuple)) else (size, size)
                channels = getattr(sub, "num_channels", None) or getattr(sub, "in_channels", None) or 3
                values = ctx.floats(ctx.batch, int(channels), int(h), int(w))
                ctx.made[name] = values
                return values
    main = ctx.made.get("pixel_values")
    values = ctx.floats(*main.shape) if isinstance(main, torch.Tensor) else ctx.floats(ctx.batch, image_channels(ctx),
                                                                                       *image_side(ctx))
    ctx.made[name] = values
    return values


def _paired_mask(ctx: Context, name: str) -> torch.Tensor | None:
    """``prompt_masks`` beside ``prompt_pixel_values``: a mask shaped like the images it belongs to."""
    images = ctx.made.get(name.rstrip("s")[: -len("mask")] + "pixel_values")
    return None if images is None else torch.ones_like(images)


def _num_patches(ctx: Context) -> int:
    for module in ctx.model.modules():  # the patch embedding knows (video: frames / tubelet * patches per frame)
        value = getattr(module, "num_patches", None)
        if isinstance(value, int) and value > 0:
            return value
    h, w = image_side(ctx)
    patch = ctx.find("patch_size", default=16)
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    return max(1, (h // patch) * (w // patch))


def bool_masked_pos(ctx: Context) -> torch.Tensor:
    """Half of the patches masked, the same count in every row (batched masked-modeling needs equal counts)."""
    n = _num_patches(ctx)
    order = torch.stack([torch.randperm(n, generator=ctx.gen) for _ in range(ctx.batch)])
    return order < max(1, n // 2)


def encoder_hidden_states(ctx: Context) -> torch.Tensor:
    """States of an encoder the model cross-attends to (Q-Former over image features): (B, S, encoder width)."""
    width = ctx.find("encoder_hidden_size", "cross_attention_hidden_size", "hidden_size", default=32)
    values = ctx.floats(ctx.batch, SEQ, int(width))
    ctx.made["encoder_hidden_states"] = values
    return values


def global_attention_mask(ctx: Context) -> torch.Tensor | None:
    """Longformer: global attention on the first (<s>/[CLS]) token only, as for classification."""
    ids = ctx.made.get("input_ids")
    if ids is None:
        return None
    mask = torch.zeros_like(ids)
    mask[:, 0] = 1
    return mask


def recipe_for(name: str, ctx: Context | None = None) -> Callable[[Context], Any] | None:
    """The recipe for a forward parameter: by its exact name, else by what its name says it is."""
    if name in RECIPES:
        return RECIPES[name]
    if name.endswith("pixel_values"):
        return lambda ctx: prefixed_pixel_values(ctx, name)
    if name.endswith(("_mask", "_masks")) and ctx is not None and (
            name.rstrip("s")[: -len("mask")] + "pixel_values") in ctx.params:
        return lambda ctx: _paired_mask(ctx, name)
    return None


RECIPES: dict[str, Callable[[Context], Any]] = {
    "input_ids": input_ids,
    "attention_mask": attention_mask,
    "token_type_ids": token_type_ids,
    "decoder_input_ids": decoder_input_ids,
    "decoder_attention_mask": decoder_attention_mask,
    "bbox": bbox,
    "visual_feats": visual_feats,
    "visual_pos": visual_pos,
    "pixel_values": pixel_values,
    "image_grid_thw": image_grid_thw,
    "grid_thw": lambda ctx: ctx.made.get("grid_thw"),
    "spatial_shapes": lambda ctx: ctx.made.get("spatial_shapes"),
    "pixel_attention_mask": pixel_attention_mask,
    "pixel_values_videos": pixel_values_videos,
    "mm_token_type_ids": mm_token_type_ids,
    "image_embeds_position_mask": image_embeds_position_mask,
    "pixel_position_ids": lambda ctx: ctx.made.get("pixel_position_ids"),
    "merge_sizes": lambda ctx: _merge_sizes(ctx),
    "image_merge_sizes": lambda ctx: _merge_sizes(ctx),
    "task_inputs": lambda ctx: ctx.token_ids((ctx.batch, int(ctx.find("task_seq_len", default=SEQ))), vocab_size(ctx)),
    "target_sizes": lambda ctx: _patch_grid(ctx),
    "inputs": lambda ctx: generic_inputs(ctx),
    "audio_mel": lambda ctx: _mel_sequence(ctx),
    "audio_mel_mask": lambda ctx: torch.zeros(ctx.batch, audio_frames(ctx), dtype=torch.bool),
    "hidden_states": lambda ctx: pixel_values(ctx) if "grid_thw" in ctx.params else None,
    **{name: (lambda ctx, name=name: _trajectory(ctx, name)) for name in TRAJECTORY_INPUTS},
    "pixel_mask": pixel_mask,
    "flattened_patches": flattened_patches,
    "bool_masked_pos": bool_masked_pos,
    "encoder_hidden_states": encoder_hidden_states,
    "encoder_attention_mask": lambda ctx: (torch.ones(ctx.made["encoder_hidden_states"].shape[:2], dtype=torch.long)
                                           if "encoder_hidden_states" in ctx.made else None),
    "global_attention_mask": global_attention_mask,
    "classes_structure": lambda ctx: torch.ones(ctx.batch, dtype=torch.long),  # one class prompt per image
    "image_sizes": image_sizes,
    "input_features": input_features,
    "input_values": input_values,
    "latents": latents,
    "timestep": flow_timestep,
    **{name: features_mask for name in WITH_FEATURES},
    "past_values": past_values,
    "past_observed_mask": past_observed_mask,
    "past_time_features": past_time_features,
    "future_time_features": future_time_features,
    "static_categorical_features": static_categorical_features,
    "static_real_features": static_real_features,
}
