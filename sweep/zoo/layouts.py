"""Other layouts of the same sample, for inputs whose layout differs by family.

Audio features as ``(B, mels, T)`` or ``(B, T, mels)``, waveforms as ``(B, T)`` or ``(B, C, T)``, images as one
tile, a pair or a clip, ids per codebook or per choice: the config does not say which, so
:func:`sweep.zoo.inputs.candidate_inputs` tries each (the first that runs wins).
"""

from __future__ import annotations

from typing import Any

import torch

from sweep.zoo.context import Context, image_channels, model_modalities
from sweep.zoo.modalities import WITH_FEATURES, audio_frames, image_sizes


def alternative_layouts(ctx: Context, base: dict[str, Any]) -> list[dict[str, Any]]:
    """Other layouts of the same sample, for inputs whose layout differs by family (each an update of base), in the
    order they are tried: audio, images, packed or tiled images, ids per codebook or choice."""
    return [*_audio_layouts(ctx, base), *_image_layouts(ctx, base), *_packed_image_layouts(ctx, base),
            *_id_layouts(ctx, base)]


def _audio_layouts(ctx: Context, base: dict[str, Any]) -> list[dict[str, Any]]:
    """Features time-major or with a channel axis; waveforms with channels, or a (B, T, mels) spectrogram."""
    out: list[dict[str, Any]] = []
    if isinstance(base.get("input_features"), torch.Tensor):
        x = base["input_features"]
        if x.dim() == 3:
            t = x.transpose(1, 2).contiguous()
            masks = {k: torch.ones(t.shape[0], t.shape[1], dtype=torch.long) for k in WITH_FEATURES if k in base}
            out += [{"input_features": t, **masks}, {"input_features": t[:, None]}]
    if isinstance(base.get("input_values"), torch.Tensor):
        x = base["input_values"]
        channels = ctx.find("audio_channels", "num_channels", "in_channels", default=1)
        out.append({"input_values": x[:, None, :].repeat(1, channels, 1).contiguous()})
        if ctx.find("num_mel_bins") is not None:  # spectrogram transformers call their (B, T, mels) input_values
            out.append({"input_values": ctx.floats(ctx.batch, audio_frames(ctx), int(ctx.find("num_mel_bins")))})
    return out


def _image_layouts(ctx: Context, base: dict[str, Any]) -> list[dict[str, Any]]:
    """(B, C, H, W) pixels as one tile, as a pair, or as a clip."""
    out: list[dict[str, Any]] = []
    if isinstance(base.get("pixel_values"), torch.Tensor) and base["pixel_values"].dim() == 4:
        x4 = base["pixel_values"]
        tiled = {"pixel_values": x4[:, None]}  # (B, tiles=1, C, H, W) layouts
        if "pixel_attention_mask" in base:
            tiled["pixel_attention_mask"] = base["pixel_attention_mask"][:, None]
        if "image_attention_mask" in ctx.params and isinstance(base.get("input_ids"), torch.Tensor):
            ids = base["input_ids"]  # IDEFICS: which of the images each text token attends to, (B, S, images)
            tiled["image_attention_mask"] = torch.ones(*ids.shape, 1, dtype=torch.long)
        out.append(tiled)
        if "pixel_attention_mask" in base:  # one flag per real tile (Granite-Docling): (B, tiles)
            out.append({**tiled, "pixel_attention_mask": torch.ones(x4.shape[0], 1, dtype=torch.bool)})
        x = base["pixel_values"]  # image pairs (keypoint matching): (B, 2, C, H, W)
        out.append({"pixel_values": torch.stack([x, x.flip(-1)], dim=1)})
        frames = ctx.find("num_frames")
        if isinstance(frames, int) and frames > 1 and "pixel_values_videos" not in ctx.params:
            out.append({"pixel_values": base["pixel_values"][:, None].repeat(1, frames, 1, 1, 1)})  # a clip
        patch = ctx.find("patch_size", where=lambda c: c is ctx.vision_config(), default=None)
        temporal = ctx.find("temporal_patch_size", where=lambda c: c is ctx.vision_config(), default=None)
        if isinstance(patch, int) and isinstance(temporal, int):  # one channels-last patch clip per image token
            # (Inkling): (tokens, temporal_patch, P, P, C), one token per image
            out.append({"pixel_values": ctx.floats(x4.shape[0], temporal, patch, patch, x4.shape[1])})
    return out


def _packed_image_layouts(ctx: Context, base: dict[str, Any]) -> list[dict[str, Any]]:
    """Pixels packed side by side (NaViT), in tiles of a tile grid (Mllama), as patches grouped per image, or with
    each image's size."""
    out: list[dict[str, Any]] = []
    if "target_sizes" in ctx.params and isinstance(base.get("pixel_values"), torch.Tensor) and base[
            "pixel_values"].dim() == 4:  # NaViT packing (MiniCPM-V): every image's patches side by side, (1, C, P, N*P)
        b, c, h, w = base["pixel_values"].shape
        patch = ctx.find("patch_size", default=14)
        patch = patch[0] if isinstance(patch, (list, tuple)) else patch
        out.append({"pixel_values": ctx.floats(1, c, patch, b * (h // patch) * (w // patch) * patch)})
    if "aspect_ratio_ids" in ctx.params and isinstance(base.get("pixel_values"), torch.Tensor) and base[
            "pixel_values"].dim() == 4:  # Mllama: (B, images, tiles, C, H, W), one image in one tile
        x = base["pixel_values"]
        tiles = int(ctx.find("max_num_tiles", default=4))
        pixels = torch.zeros(x.shape[0], 1, tiles, *x.shape[1:])
        pixels[:, 0, 0] = x
        tile_mask = torch.zeros(x.shape[0], 1, tiles, dtype=torch.long)
        tile_mask[:, :, 0] = 1
        update = {"pixel_values": pixels, "aspect_ratio_ids": torch.ones(x.shape[0], 1, dtype=torch.long),
                  "aspect_ratio_mask": tile_mask}
        ids = base.get("input_ids")
        if "cross_attention_mask" in ctx.params and isinstance(ids, torch.Tensor):
            cross = torch.zeros(*ids.shape, 1, tiles, dtype=torch.long)
            cross[..., 0] = 1
            update["cross_attention_mask"] = cross
        out.append(update)
    grid = base.get("image_grid_thw", base.get("grid_thw"))
    if isinstance(grid, torch.Tensor) and isinstance(base.get("pixel_values"), torch.Tensor):
        x = base["pixel_values"]
        if x.dim() == 2 and x.shape[0] % ctx.batch == 0:  # patches grouped per image: (B, patches, dim)
            out.append({"pixel_values": x.view(ctx.batch, -1, x.shape[-1])})
        patch = ctx.find("patch_size", default=14)
        channels = image_channels(ctx)
        if x.dim() == 2 and isinstance(patch, int) and x.shape[1] == channels * patch * patch:
            out.append({"pixel_values": x.view(-1, channels, patch, patch)})  # one image per patch (Kimi-K2.5)
            if x.shape[0] % ctx.batch == 0:  # patches grouped per image (PaddleOCR-VL): (B, N, C, P, P)
                out.append({"pixel_values": x.view(ctx.batch, -1, channels, patch, patch)})
            merge = ctx.find("spatial_merge_size", "merge_size", default=1)
            if isinstance(merge, int) and merge > 1 and x.shape[0] % (merge * merge) == 0:
                # one channels-last tile per merged token (Inkling2): (N / m^2, m * P, m * P, C), each tile the
                # m x m patches it merges, and the grid counted in merged tokens
                tiles = x.view(-1, merge, merge, channels, patch, patch).permute(0, 1, 4, 2, 5, 3)
                merged = grid.clone()
                merged[:, 1:] //= merge
                key = "image_grid_thw" if "image_grid_thw" in base else "grid_thw"
                out.append({"pixel_values": tiles.reshape(-1, merge * patch, merge * patch, channels).contiguous(),
                            key: merged})
    if "image_sizes" in ctx.params and "pixel_values" in base and "image_sizes" not in base:
        out.append({"image_sizes": image_sizes(ctx)})  # any-resolution models (LLaVA-NeXT)
    return out


def _id_layouts(ctx: Context, base: dict[str, Any]) -> list[dict[str, Any]]:
    """Decoder ids per codebook (stacked rows or a trailing axis), and text per choice (multiple choice)."""
    out: list[dict[str, Any]] = []
    codebooks = ctx.find("num_codebooks")
    if codebooks is None and not {"image", "video"} & set(model_modalities(ctx.model)):
        codebooks = ctx.find("num_channels")  # audio decoders that call their codebooks channels (Dia)
    ids = base.get("decoder_input_ids")
    if isinstance(codebooks, int) and codebooks > 1 and isinstance(ids, torch.Tensor) and ids.dim() == 2:
        stacked = ids.repeat_interleave(codebooks, dim=0)  # one row per codebook (MusicGen): (B * codebooks, S)
        out.append({"decoder_input_ids": stacked})
        if "decoder_attention_mask" in base:
            out.append({"decoder_input_ids": stacked, "decoder_attention_mask": torch.ones_like(stacked)})
        out.append({"decoder_input_ids": ids[..., None].repeat(1, 1, codebooks)})  # codebooks last: (B, S, codebooks)
    ids = base.get("input_ids")
    if isinstance(codebooks, int) and codebooks > 1 and isinstance(ids, torch.Tensor) and ids.dim() == 2:
        # a decoder-only model over codebooks (MusicGen's decoder): a row per codebook, the mask per sample (B, S)
        out.append({"input_ids": ids.repeat_interleave(codebooks, dim=0)})
    text = {k: v for k, v in base.items() if k in CHOICE_INPUTS and isinstance(v, torch.Tensor) and v.dim() == 2}
    # multiple choice: (B, choices, S), for a forward that documents num_choices (the multiple-choice heads); another
    # model that refuses 2-D ids for its own reason (VibeVoice's placeholder count) must not get 3-D ones by accident
    if "input_ids" in text and "num_choices" in (getattr(type(ctx.model).forward, "__doc__", None) or ""):
        out.append({k: torch.stack([v, v.flip(1)], dim=1) for k, v in text.items()})
    return out


CHOICE_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "bbox", "global_attention_mask")
