"""Samples for forward parameters no recipe knows: required ones, and optional ones the forward turned out to need.

:func:`parameter_input` reads the parameter's name, its annotation and config fields named after it;
:func:`can_make` says whether a parameter a model's error names is worth adding (:mod:`sweep.zoo.input_lessons`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from sweep.zoo.context import SEQ, Context, vocab_size
from sweep.zoo.modalities import recipe_for

# Width of a named float input, and size of a named index input, from config fields named after the parameter.
WIDTH_FIELDS = ("{}_dim", "max_{}_dim", "{}_embedding_dim", "{}_hidden_size", "{}_size")
COUNT_FIELDS = ("{}_size", "num_{}s", "num_{}", "{}_vocab_size")
SEQUENCE_SUFFIXES = ("embeds", "hidden_states", "_states", "_sequence")
INDEX_ANNOTATIONS = ("Long", "Int", "long", "int64")


def _stems(name: str) -> list[str]:
    """``speaker_embeddings`` -> speaker_embeddings, speaker_embedding, speaker; ``context_hidden_states`` ->
    context_hidden_states, context."""
    out = [name]
    for suffix in ("_hidden_states", "_embeds", "_embeddings", "_values", "_features", "_ids"):
        if name.endswith(suffix) and len(name) > len(suffix):
            out.append(name[:-len(suffix)])
    out += [s[:-1] for s in list(out) if s.endswith("s")]
    return list(dict.fromkeys(out))


def _annotation(ctx: Context, name: str) -> str:
    param = ctx.params.get(name)
    if param is None or param.annotation is inspect.Parameter.empty:
        return ""
    return str(getattr(param.annotation, "__name__", param.annotation))


def _named_size(ctx: Context, name: str, patterns: tuple[str, ...]) -> int | None:
    for stem in _stems(name):
        for pattern in patterns:
            value = ctx.find(pattern.format(stem))
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _embedding_tables(model: torch.nn.Module) -> set[int]:
    return {m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)}


def _main_made(ctx: Context) -> torch.Tensor | None:
    """The input a padding mask most likely covers: the audio or series input, else the ids."""
    for key in ("input_values", "past_values", "input_features", "input_ids"):
        if isinstance(ctx.made.get(key), torch.Tensor):
            return ctx.made[key]
    return None


def parameter_input(ctx: Context, name: str) -> torch.Tensor | None:
    """A sample of a parameter no recipe knows, from its name, its annotation and config fields named after it.

    * ``X_mask`` / ``X_padding`` next to a made input ``X``: ones / zeros; ``X_cutoffs`` / ``X_lengths``: one segment
      spanning all of ``X``;
    * indices: ``*_type_ids`` zeros, ``*_ids`` token ids, ``num_*`` small counts, a parameter with a config count
      ``X_size`` / ``num_Xs`` sizing an embedding table: indices into it, ``(B, 1)``; other integer tensors: positions
      inside the text, ``(B, SEQ)``;
    * floats: a config width named after the parameter (``max_state_dim``) gives ``(B, width)``; otherwise ``(B, SEQ,
      width)`` at the model's width.
    """
    annotation = _annotation(ctx, name)
    for suffix, fill in (("_padding_mask", 1), ("_mask", 1), ("_padding", 0)):
        base = ctx.made.get(name[:-len(suffix)]) if name.endswith(suffix) else None
        if isinstance(base, torch.Tensor):
            return torch.full(tuple(base.shape[:2]), fill, dtype=torch.long)
    for suffix, shape in (("_cutoffs", (ctx.batch, 1)), ("_lengths", (ctx.batch,))):
        base = ctx.made.get(name[:-len(suffix)]) if name.endswith(suffix) else None
        if isinstance(base, torch.Tensor):  # one segment spanning the whole input
            return torch.full(shape, base.shape[-1], dtype=torch.long)
    features = ctx.made.get("input_features")
    hop = ctx.find("hop_length")
    if name.endswith("sample_lengths") and isinstance(features, torch.Tensor) and isinstance(hop, int) and hop > 0:
        # waveform samples behind each spectrogram (Dots3Note's chunk_sample_lengths): frames x hop, frames on the
        # last axis of (B, mels, T) features
        return torch.full((features.shape[0],), features.shape[-1] * hop, dtype=torch.long)
    if name.endswith("mask"):
        like = _main_made(ctx)
        if "padding" in name and like is not None and like.is_floating_point():  # over audio / series samples
            return torch.ones(like.shape[0], like.shape[-1], dtype=torch.long)
        ids = ctx.made.get("input_ids")
        return torch.ones_like(ids) if ids is not None else torch.ones(ctx.batch, SEQ, dtype=torch.long)
    indices = any(a in annotation for a in INDEX_ANNOTATIONS)
    count = _named_size(ctx, name, COUNT_FIELDS)
    if count is not None and count in _embedding_tables(ctx.model) and (indices or "float" not in annotation.lower()):
        return torch.randint(0, count, (ctx.batch, 1), generator=ctx.gen)
    if name.endswith("type_ids"):
        return torch.zeros(ctx.batch, SEQ, dtype=torch.long)
    if name.endswith(("ids", "task_inputs")):
        return ctx.token_ids((ctx.batch, SEQ), vocab_size(ctx))
    if name.startswith("num_"):
        return torch.ones(ctx.batch, SEQ, dtype=torch.long)
    if indices:
        return torch.randint(1, SEQ, (ctx.batch, SEQ), generator=ctx.gen)
    width = _named_size(ctx, name, WIDTH_FIELDS)
    if width is not None and not name.endswith(SEQUENCE_SUFFIXES):
        return ctx.floats(ctx.batch, width)
    width = width or ctx.find("hidden_size", "d_model", default=None) or ctx.hints.text_width or 32
    return ctx.floats(ctx.batch, SEQ, int(width))


def can_make(name: str, param: inspect.Parameter | None = None) -> bool:
    """Whether a recipe or the fallback makes a sensible value for a parameter the model's errors name: a recipe by
    name, a name that says it is a tensor (pixels, masks, ids, embeddings), or a tensor annotation (flags and
    options such as ``use_cache`` or ``return_dict`` stay out)."""
    if recipe_for(name) is not None or name.endswith(("pixel_values", "mask", "masks", "ids", "embeds")):
        return True
    annotation = "" if param is None or param.annotation is inspect.Parameter.empty else str(param.annotation)
    return "Tensor" in annotation


def fallback(ctx: Context, names: list[str]) -> dict[str, Any]:
    out = {}
    for name in names:
        value = parameter_input(ctx, name)
        if value is not None:
            out[name] = value
            ctx.made.setdefault(name, value)
    return out


