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
    text_len: int = SEQ


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

    base: dict[str, Any] = {}
    for name in sorted(wanted, key=_priority):
        recipe = m.RECIPES.get(name)
        if recipe is None:
            continue
        value = recipe(ctx)
        if value is not None:
            base[name] = value
    variants = [base]
    for name, alternatives in m.alternative_layouts(ctx, base).items():
        variants += [{**base, name: alt} for alt in alternatives]
    missing = [n for n in _required(params) if n not in base and n not in NEVER]
    if missing:
        for v in variants:
            v.update(m.fallback(ctx, missing))
    return variants


# Inputs whose shapes others depend on come first (the image grid decides how many placeholder ids the text has).
FIRST = ("pixel_values", "input_features", "input_values", "past_values", "input_ids", "decoder_input_ids")


def _priority(name: str) -> int:
    return FIRST.index(name) if name in FIRST else len(FIRST)


def _wanted(model: torch.nn.Module, params: dict[str, inspect.Parameter]) -> list[str]:
    """Forward parameters to fill: the main input, required ones, and those the modalities call for."""
    config = model.config
    names = [model.main_input_name] if model.main_input_name in params else []
    names += [n for n in params if n in _required(params)]
    modalities = set(getattr(model, "input_modalities", ()) or ())
    for name in params:
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
    out = []
    for n in names:
        if n not in out and n not in NEVER:
            out.append(n)
    return out


_MISMATCH = re.compile(r"tokens:?\s*(\d+)\D{1,40}?features:?\s*(\d+)", re.IGNORECASE | re.DOTALL)


def refine_hints(hints: Hints, exc: BaseException) -> bool:
    """Learn the placeholder count from the model's own "tokens: X, features: Y" check; True when it changed."""
    found = _MISMATCH.search(str(exc))
    if not found:
        return False
    features = int(found.group(2))
    per_row = max(1, features // BATCH)
    if hints.image_tokens == per_row:
        return False
    hints.image_tokens = per_row
    return True
