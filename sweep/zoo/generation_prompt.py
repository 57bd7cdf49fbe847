"""The prompt of a generation case: the forward's sample as ``generate()`` takes it.

A class whose own ``generate()`` requires an input the forward's sample lacks (Pop2Piano's ``input_features``: the
feature extractor's output, where the forward's sample has token ids) gets that input from the zoo's recipe for
its name, in the first layout on which eager ``generate()`` runs a token; the prompt is then those inputs alone
(the sample's mask belongs to the ids it replaces). Fields a checkpoint's ``generation_config.json`` ships and
``generate()`` requires come from the class's ``generation_config`` entry in ``data/overrides.yaml``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from sweep.zoo import modalities, overrides
from sweep.zoo.context import BATCH, Context, Hints, forward_parameters, text_width


def generation_prompt(model: torch.nn.Module, sample: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """The inputs a generation case calls ``generate()`` with (see the module docstring)."""
    _checkpoint_generation_config(model)
    # generate() starts an encoder-decoder's decoder from its start token, and computes a prompt's positions itself
    # (the case's M-RoPE position_ids are for one forward)
    prompt = {k: v for k, v in sample.items() if not k.startswith("decoder_") and k != "position_ids"}
    missing = [name for name in required_by_own_generate(model) if name not in prompt]
    if not missing:
        return prompt
    first = None
    for candidate in _candidates(model, missing, seed):
        first = first or candidate
        try:
            with torch.no_grad():
                model.generate(**copy.deepcopy(candidate), max_new_tokens=1, do_sample=False, num_beams=1,
                               num_return_sequences=1)
        except Exception:  # noqa: BLE001 - the next layout; the case's own eager run reports the last one's error
            continue
        return candidate
    return first if first is not None else prompt


def own_generate(model: torch.nn.Module) -> Callable | None:
    """The ``generate()`` the model's class defines itself; None where it has transformers' shared one, or none."""
    from transformers import GenerationMixin

    own = getattr(type(model), "generate", None)
    return None if own is None or own is GenerationMixin.generate else own


def required_by_own_generate(model: torch.nn.Module) -> list[str]:
    """The parameters without a default of a ``generate()`` the class defines itself (not the shared one)."""
    own = own_generate(model)
    if own is None:
        return []
    params = list(inspect.signature(own).parameters.values())[1:]  # after self
    return [p.name for p in params if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _candidates(model: torch.nn.Module, names: list[str], seed: int) -> Iterator[dict[str, Any]]:
    """The missing inputs by their recipes: as the recipe lays them out, then with the text model's width as their
    last dimension (features already embedded, ``(batch, frames, hidden)``)."""
    width = text_width(model)
    for hints in [Hints()] + ([Hints(feature_dim=width)] if width else []):
        ctx = Context(config=model.config, model=model, gen=torch.Generator().manual_seed(seed), batch=BATCH,
                      hints=hints, params=forward_parameters(model))
        made = {}
        for name in names:
            recipe = modalities.recipe_for(name, ctx)
            value = recipe(ctx) if recipe is not None else None
            if value is None:
                return
            made[name] = value
        yield made


def _checkpoint_generation_config(model: torch.nn.Module) -> None:
    config = getattr(model, "config", None)
    fields = overrides.for_class(type(model).__name__, getattr(config, "model_type", "")).get("generation_config", {})
    generation_config = getattr(model, "generation_config", None)
    for key, value in fields.items():
        if generation_config is not None and not hasattr(generation_config, key):
            setattr(generation_config, key, copy.deepcopy(value))
