"""Sample inputs synthesised from a model's forward signature, its config and its modalities.

:func:`candidate_inputs` returns, in order of preference, the input dicts worth trying: most models have one;
families whose layout the config does not pin down (audio features as ``(B, mels, T)`` or ``(B, T, mels)``,
waveforms as ``(B, T)`` or ``(B, C, T)``) get one candidate per layout, and :mod:`sweep.zoo` keeps the first that
runs. Every dict is deterministic for a seed, has batch size :data:`BATCH`, and holds no labels.

Multimodal placeholders: the text gets ``Hints.image_tokens`` image tokens per row. The first guess comes from the
config; when the model's own check says ``tokens: X, features: Y`` the zoo retries with ``Y / BATCH``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import inspect
from typing import Any

import torch

from sweep import modalities as m

BATCH = 2
SEQ = 8

# Forward parameters never synthesised: training targets, caches, and alternatives to the ids we do give.
NEVER = {"labels", "past_key_values", "inputs_embeds", "decoder_inputs_embeds", "use_cache", "output_attentions",
         "output_hidden_states", "return_dict", "cache_position", "head_mask", "decoder_head_mask",
         "cross_attn_head_mask", "position_ids", "decoder_position_ids", "kwargs", "return_loss",
         "encoder_outputs", "logits_to_keep", "num_logits_to_keep", "start_positions", "end_positions",
         "next_sentence_label", "mc_labels", "future_values", "mask_labels", "class_labels", "sentence_order_label",
         "output_router_logits", "interpolate_pos_encoding", "bool_masked_pos", "noise", "mm_encoder_outputs"}


@dataclasses.dataclass
class Hints:
    """What the zoo learned from earlier failed attempts."""

    image_tokens: int | None = None
    audio_tokens: int | None = None
    feature_dim: int | None = None  # last dimension input_features must have
    frames: int | None = None  # audio frames the model asked for (a multiple of its window)
    tiles: int | None = None  # image tiles per sample (any-resolution layouts: (B, tiles, C, H, W))
    text_len: int = SEQ
    samples: int | None = None  # waveform length the model asked for (a multiple of its hop)
    image_side: int | None = None  # image side the model asked for (multi-scale patching)
    patch_width: int | None = None  # pixels as flattened patches (num_patches, patch_width), as the model asked
    text_width: int | None = None  # hidden size of the text model (some checks count features as numel)
    no_cache: bool = False  # the forward failed building its KV cache: run it with use_cache=False


def forward_parameters(model: torch.nn.Module) -> dict[str, inspect.Parameter]:
    params = inspect.signature(model.forward).parameters
    return {k: p for k, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _required(params: dict[str, inspect.Parameter]) -> set[str]:
    return {k for k, p in params.items() if p.default is inspect.Parameter.empty}


def candidate_inputs(model: torch.nn.Module, seed: int = 0, hints: Hints | None = None) -> list[dict[str, Any]]:
    """Input dicts to try, best first."""
    hints = hints or Hints()
    config = model.config
    params = forward_parameters(model)
    wanted = _wanted(model, params)
    gen = torch.Generator().manual_seed(seed)
    ctx = m.Context(config=config, model=model, gen=gen, batch=BATCH, hints=hints, params=params)
    if hints.text_width is None:
        try:  # the width of inputs_embeds
            hints.text_width = int(model.get_input_embeddings().weight.shape[-1])
        except Exception:  # noqa: BLE001 - models without a token embedding
            hints.text_width = None

    base: dict[str, Any] = {}
    for name in sorted(wanted, key=_priority):
        recipe = m.RECIPES.get(name)
        if recipe is None:
            continue
        value = recipe(ctx)
        if value is not None:
            base[name] = value
    for name, value in ctx.made.items():  # companions a recipe made on the way (image_grid_thw)
        if name in params and name not in base and name not in NEVER and not (
                "inputs" in base and name in GENERIC_ALTERNATIVES):  # Perceiver: `inputs` or the named input
            base[name] = value
    if "inputs" in base:  # Perceiver: `inputs` replaces the named inputs
        for name in GENERIC_ALTERNATIVES:
            base.pop(name, None)
    if hints.no_cache and "use_cache" in params:
        base["use_cache"] = False
    variants = [base]
    variants += [{**base, **update} for update in m.alternative_layouts(ctx, base)]
    missing = [n for n in _required(params) if n not in base and n not in NEVER]
    if missing:
        for v in variants:
            v.update({k: x for k, x in m.fallback(ctx, missing).items() if k not in v})
    return variants


GENERIC_ALTERNATIVES = ("input_ids", "pixel_values", "input_values")

# Inputs whose shapes others depend on come first (the image grid decides how many placeholder ids the text has).
FIRST = ("pixel_values", "hidden_states", "inputs", "input_features", "input_values", "past_values", "input_ids", "decoder_input_ids")


def _priority(name: str) -> int:
    return FIRST.index(name) if name in FIRST else len(FIRST)


def _wanted(model: torch.nn.Module, params: dict[str, inspect.Parameter]) -> list[str]:
    """Forward parameters to fill: the main input, required ones, and those the modalities call for."""
    config = model.config
    main = model.main_input_name
    names = [n for n in (main if isinstance(main, (list, tuple)) else [main]) if n in params]
    names += [n for n in params if n in _required(params)]
    modalities = set(getattr(model, "input_modalities", ()) or ())
    for modality in ("vision", "audio"):  # a tower the config leaves out takes no inputs (text-only defaults)
        if f"{modality}_config" in getattr(type(config), "sub_configs", {}) and getattr(
                config, f"{modality}_config", None) is None:
            modalities.discard("image" if modality == "vision" else "audio")
    if ("text" in modalities and modalities & {"image", "video"} and "input_ids" in params
            and "input_ids" not in names):
        names.append("input_ids")  # image-first models that read text too (Kosmos-2, InstructBLIP-Video)
    for name in params:
        if name in ("mm_token_type_ids", "pixel_attention_mask", "target_sizes", "image_merge_sizes") and (
                "pixel_values" in names):
            names.append(name)
        if name in m.WITH_FEATURES and "input_features" in names:
            names.append(name)
        if name in m.ALWAYS_WITH_IDS and "input_ids" in names:
            names.append(name)
        if name in m.MODALITY_INPUTS.get("image", ()) and "image" in modalities:
            names.append(name)
        if name in m.MODALITY_INPUTS.get("audio", ()) and "audio" in modalities and not any(
                a in names for a in m.MODALITY_INPUTS["audio"]):
            names.append(name)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        names.append("decoder_input_ids")
        if "decoder_attention_mask" in params:
            names.append("decoder_attention_mask")
    if m.needs_time_series(params):
        names += [n for n in m.TIME_SERIES_INPUTS if n in params]
    if all(n in params for n in m.TRAJECTORY_INPUTS):
        names += list(m.TRAJECTORY_INPUTS)
    out = []
    for n in names:
        if n not in out and n not in NEVER:
            out.append(n)
    return out


# The models' own consistency checks, and what each one teaches.
_PLACEHOLDERS = re.compile(r"(image|audio|video)?\s*(?:features|embeddings)? and (?:\w+ )?tokens do not match\W*"
                           r"tokens:?\s*(\d+)\D{1,40}?features:?\s*(\d+)", re.IGNORECASE | re.DOTALL)
_MULTIPLE = re.compile(r"feature_length` to be a multiple of .{0,40}?\((\d+)\), but got (\d+)")
_PATCH_WIDTH = re.compile(r"pixel_values has patch width \d+ but the model expects (\d+)")
_PATCHES_FOR = re.compile(r"Got (\d+) image patches for \d+ image placeholder tokens")
_TOO_SMALL = re.compile(r"too small to be scaled with scaled_images_ratios=\[([\d.]+)[^\]]*\] when patch_size=(\d+)")
_SAMPLES = re.compile(r"input_values`? length (\d+) is not a multiple of (\d+)")
_TILES = re.compile(r"split_with_sizes expects split_sizes to sum exactly to \d+ \(input tensor's size at dimension "
                    r"0\), but got split_sizes=\[(\d+)")
_NORMALIZED = re.compile(r"normalized_shape=\[(\d+)\], expected input with shape \[\*, \1\], but got input of "
                         r"size\s*\[(\d+), (\d+), (\d+)\]")


def _round_up(got: int, multiple: int) -> int:
    return max(multiple, (got + multiple - 1) // multiple * multiple)


#: (check's message, hint it sets, the hint's value from the match), tried in order
_LEARNED_SIZES = (
    (_MULTIPLE, "frames", lambda m: _round_up(int(m.group(2)), int(m.group(1)))),
    (_PATCH_WIDTH, "patch_width", lambda m: int(m.group(1))),
    (_PATCHES_FOR, "image_tokens", lambda m: max(1, int(m.group(1)) // BATCH)),
    (_TOO_SMALL, "image_side", lambda m: int(math.ceil(int(m.group(2)) / float(m.group(1))))),
    (_SAMPLES, "samples", lambda m: _round_up(int(m.group(1)), int(m.group(2)))),
    (_TILES, "tiles", lambda m: int(m.group(1))),
    (_NORMALIZED, "feature_dim", lambda m: int(m.group(1))),
)


_SIZE_AT_LAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at "
                           r"non-singleton dimension 2")
_MATMUL = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")


def _raised_in_cache(exc: BaseException) -> bool:
    """Whether the error was raised while building or filling the KV cache (transformers' cache_utils)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith("transformers/cache_utils.py"):
            return True
        tb = tb.tb_next
    return False


def refine_hints(hints: Hints, exc: BaseException, candidate: dict[str, Any] | None = None) -> bool:
    """Learn from a model's own check what the inputs must look like; True when a hint changed."""
    message = str(exc)
    if not hints.no_cache and _raised_in_cache(exc):
        hints.no_cache = True  # a config the cache cannot read (BLT's layer count lives in its sub-configs)
        return True
    found = _MATMUL.search(message)
    features = (candidate or {}).get("input_features")
    size = _SIZE_AT_LAST.search(message)
    if isinstance(features, torch.Tensor) and features.dim() == 3 and (found or size):
        got, wanted = (int(found.group(2)), int(found.group(3))) if found else (int(size.group(1)),
                                                                                 int(size.group(2)))
        # the audio features' last dimension feeds the first Linear (stacked frames): (B, T, wanted)
        if features.shape[-1] == got and got != wanted and hints.feature_dim != wanted:
            hints.feature_dim = wanted
            return True
    found = _PLACEHOLDERS.search(message)
    if found:
        modality = (found.group(1) or "image").lower()
        tokens, features = int(found.group(2)), int(found.group(3))
        per_row = max(1, features // BATCH)
        field = "audio_tokens" if modality == "audio" else "image_tokens"
        width = hints.text_width
        if (getattr(hints, field) == per_row and tokens == features and width
                and features % (width * BATCH) == 0):
            # the count matched and the check still failed: "features" was the feature tensor's numel
            per_row = features // (width * BATCH)
        if getattr(hints, field) != per_row:
            setattr(hints, field, per_row)
            return True
        return False
    for pattern, field, value in _LEARNED_SIZES:
        found = pattern.search(message)
        if found and getattr(hints, field) != value(found):
            setattr(hints, field, value(found))
            return True
    return False
