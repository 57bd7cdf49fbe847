"""Sample inputs synthesised from a model's forward signature, its config and its modalities.

:func:`candidate_inputs` returns, in order of preference, the input dicts worth trying: most models have one;
families whose layout the config does not pin down get one candidate per layout (:mod:`sweep.zoo.layouts`), and
:mod:`sweep.zoo.build` keeps the first that runs. Every dict is deterministic for a seed, has batch size
:data:`~sweep.zoo.context.BATCH`, and holds no labels. What the model's own errors taught (the
:class:`~sweep.zoo.context.Hints` that :func:`sweep.zoo.input_lessons.refine_hints` fills) shapes the next round.

Multimodal placeholders: the text gets ``Hints.image_tokens`` image tokens per row. The first guess comes from the
config; when the model's own check says ``tokens: X, features: Y`` the zoo retries with ``Y / BATCH``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from sweep.zoo import modalities as m
from sweep.zoo.context import (BATCH, NEVER, Context, Hints, forward_parameters, model_modalities, required, skipped,
                               text_width)
from sweep.zoo.fallback import fallback
from sweep.zoo.layouts import alternative_layouts


def candidate_inputs(model: torch.nn.Module, seed: int = 0, hints: Hints | None = None) -> list[dict[str, Any]]:
    """Input dicts to try, best first."""
    hints = hints or Hints()
    config = model.config
    params = forward_parameters(model)
    wanted = list(dict.fromkeys(_wanted(model, params) + [n for n in hints.extra if n in params]))
    gen = torch.Generator().manual_seed(seed)
    ctx = Context(config=config, model=model, gen=gen, batch=BATCH, hints=hints, params=params)
    if hints.text_width is None:
        hints.text_width = text_width(model)

    base: dict[str, Any] = {}
    for name in sorted(wanted, key=_priority):
        recipe = m.recipe_for(name, ctx)
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
    # required parameters (even those never synthesised otherwise) and optional ones the forward turned out to
    # need (hints.extra), by name, annotation and config
    missing = [n for n in [*required(params), *hints.extra] if n in params and n not in base]
    fallen = fallback(ctx, list(dict.fromkeys(missing))) if missing else {}
    base.update(fallen)
    variants = [base]
    variants += [{**base, **update} for update in alternative_layouts(ctx, base)]
    for name, value in fallen.items():  # a sequence of unknown layout: also channels first (conv stacks)
        if value.is_floating_point() and value.dim() == 3 and name not in hints.shapes:
            variants.append({**base, name: value.transpose(1, 2).contiguous()})
    return [_learned(v, hints, gen) for v in variants]


def _learned(candidate: dict[str, Any], hints: Hints, gen: torch.Generator) -> dict[str, Any]:
    """Shapes and index bounds the model's own errors taught, applied to one candidate."""
    out = dict(candidate)
    for name, shape in hints.shapes.items():
        value = out.get(name)
        if isinstance(value, torch.Tensor) and tuple(value.shape) != shape:
            if value.is_floating_point():
                out[name] = torch.randn(*shape, generator=gen)
            elif value.numel() and bool((value == value.flatten()[0]).all()):  # a constant (a mask of ones)
                out[name] = torch.full(shape, int(value.flatten()[0]), dtype=value.dtype)
            else:
                top = max(1, int(value.max()) + 1) if value.numel() else 1
                out[name] = torch.randint(0, hints.bounds.get(name, top), shape, generator=gen)
    for name in hints.bool_masks:
        if isinstance(out.get(name), torch.Tensor):
            out[name] = out[name].bool()
    for name, bound in hints.bounds.items():
        value = out.get(name)
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.numel() and int(
                value.max()) >= bound:
            out[name] = value % bound
    return out


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
    names += [n for n in params if n in required(params)]
    modalities = set(model_modalities(model))
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
        if n not in out and not skipped(n, params):
            out.append(n)
    return out

