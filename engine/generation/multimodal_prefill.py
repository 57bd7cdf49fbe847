"""A multimodal prefill through the exported reference components (embeddings, feature merge, language
model, ``lm_head``), learned where it is exact."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from engine.pytree import get_leaf_tensors, is_cache_object
from engine.generation.plan import GenerationPlan, MultimodalPrefill


# ─── Multimodal prefill through the reference components ─────────────────────────────────────────


def feature_rows(features: Any, field: str, width: int) -> torch.Tensor | None:
    """The rows of one field of a modality's features (``pooler_output``: a tuple of per-image tensors, or a
    single tensor; ``""``: the features are a bare tensor), concatenated as the model concatenates them."""
    leaves = [t for name, t in get_leaf_tensors(features).items() if name.split(".", 1)[0] == field or not field]
    if not leaves or any(t.shape[-1] != width for t in leaves):
        return None
    return torch.cat([t.reshape(-1, width) for t in leaves])


def merge_features(embeds: torch.Tensor, ids: torch.Tensor, kwargs: Mapping[str, Any],
                   placeholders: Mapping[str, tuple[int, str]]) -> torch.Tensor | None:
    """``embeds`` with each placeholder token's rows replaced by its modality's feature rows (None if the counts differ)."""
    merged = embeds.clone()
    for feed, (token, feature_field) in placeholders.items():
        key, _, sub = feed.partition(".")
        rows = feature_rows(kwargs[key][sub] if sub else kwargs[key], feature_field, embeds.shape[-1])
        mask = ids == token
        if rows is None or int(mask.sum()) != rows.shape[0]:
            return None
        merged[mask] = rows.to(merged.dtype)
    return merged


def learn_multimodal_prefill(model: torch.nn.Module, components: Mapping[str, tuple[torch.nn.Module, dict[str, Any]]],
                             plan: GenerationPlan) -> MultimodalPrefill | None:
    """How the prefill runs through ``embed_tokens`` + merge + ``language_model`` + ``lm_head``, or None.

    Learned eagerly from the captured calls, and only where it is exact: the language model's inputs other than
    its embeddings are the prefill's own (the same names, equal values: positions a model computes on its own,
    like Qwen2-VL's multimodal rotary ones, rule it out), the prompt's embeddings with each modality's feature
    rows put in place of one token's rows give exactly the embeddings the language model received, and
    ``lm_head`` read one of the language model's outputs. The exported programs are checked against the eager
    prefill once they exist (``export_for_generation``)."""
    needed = ("language_model", "lm_head", "prefill")
    try:
        embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    except (NotImplementedError, AttributeError):  # PreTrainedModel's default raises for models without one
        embed = None
    if not all(name in components for name in needed) or not isinstance(embed, torch.nn.Module) or not plan.encoders:
        return None
    language_model, lm_kwargs = components["language_model"]
    prefill = components["prefill"][1]
    ids, received = prefill.get(plan.token_input), lm_kwargs.get("inputs_embeds")
    if not isinstance(ids, torch.Tensor) or not isinstance(received, torch.Tensor) or len(components["lm_head"][1]) != 1:
        return None
    for name, value in lm_kwargs.items():
        if name == "inputs_embeds":
            continue
        if is_cache_object(value) != is_cache_object(prefill.get(name)):
            return None
        if isinstance(value, torch.Tensor) and not (isinstance(prefill.get(name), torch.Tensor) and torch.equal(value, prefill[name])):
            return None
    with torch.no_grad():
        text = embed(ids)
        if text.shape != received.shape:
            return None
        # placeholder candidates: the tokens whose rows the merge replaced
        replaced = [int(t) for t in ids[(text != received).any(-1)].unique()]
        placeholders = {}
        for feed in plan.encoders.values():
            key, _, sub = feed.partition(".")
            features = prefill.get(key, {}).get(sub) if sub else prefill.get(key)
            if features is None:  # generate() encoded this modality, the prompt's prefill holds none of it
                return None
            fields = sorted({name.split(".", 1)[0] for name in get_leaf_tensors(features)}) if features is not None else []
            placeholders[feed] = next(((token, field) for token in replaced for field in fields or [""]
                                       if merge_features(text, ids, prefill, {feed: (token, field)}) is not None), None)
        if None in placeholders.values():
            return None
        merged = merge_features(text, ids, prefill, placeholders)
        if merged is None or not torch.equal(merged, received):
            return None
        outputs = get_leaf_tensors(language_model(**copy.deepcopy(lm_kwargs)))
    head_input = next(iter(components["lm_head"][1].values()))
    hidden = next((name for name, t in outputs.items() if t.shape == head_input.shape and torch.equal(t, head_input)), None)
    return None if hidden is None else MultimodalPrefill(placeholders, hidden)
