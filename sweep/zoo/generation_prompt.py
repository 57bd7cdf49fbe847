"""The prompt of a generation case: the forward's sample as ``generate()`` takes it.

A class whose own ``generate()`` requires an input the forward's sample lacks (Pop2Piano's ``input_features``: the
feature extractor's output, where the forward's sample has token ids) gets that input from the zoo's recipe for
its name, in the first layout on which eager ``generate()`` runs a token; the prompt is then those inputs alone
(the sample's mask belongs to the ids it replaces). Fields a checkpoint's ``generation_config.json`` ships and
``generate()`` requires come from the class's ``generation_config`` entry in ``data/overrides.yaml``.
"""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap
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
    for candidate in _candidates(model, missing, seed):  # two tokens: a decode step reads its inputs too (Kyutai)
        first = first or candidate
        try:
            with torch.no_grad():
                model.generate(**copy.deepcopy(candidate), max_new_tokens=2, do_sample=False, num_beams=1,
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
    """The inputs a ``generate()`` the class defines itself (not the shared one) cannot run without: its parameters
    without a default, and the keywords it takes from its ``**kwargs`` and then uses without a None check
    (Kyutai's ``input_values = kwargs.get("input_values")`` sizes ``max_new_tokens`` from ``input_values.shape``)."""
    own = own_generate(model)
    if own is None:
        return []
    params = list(inspect.signature(own).parameters.values())[1:]  # after self
    named = [p.name for p in params if p.default is inspect.Parameter.empty
             and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    keywords = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
    return named + (_keywords_used_unchecked(own, keywords) if keywords else [])


def _keywords_used_unchecked(function: Callable, keywords: str) -> list[str]:
    """Names ``x = keywords.get("x")`` (or ``.pop``, or ``keywords["x"]``) binds in ``function`` whose attributes or
    items it then reads, with no ``x is None`` or ``"x" in keywords`` test anywhere in it."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return []
    nodes = list(ast.walk(tree))
    bound = {node.targets[0].id: key for node in nodes if isinstance(node, ast.Assign) and len(node.targets) == 1
             and isinstance(node.targets[0], ast.Name) and (key := _keyword_read(node.value, keywords)) is not None}
    used = {node.value.id for node in nodes if isinstance(node, (ast.Attribute, ast.Subscript))
            and isinstance(node.value, ast.Name) and isinstance(node.ctx, ast.Load)}
    compares = [node for node in nodes if isinstance(node, ast.Compare)]
    none_tested = {node.left.id for node in compares if isinstance(node.left, ast.Name)
                   and any(isinstance(c, ast.Constant) and c.value is None for c in node.comparators)}
    present_tested = {node.left.value for node in compares if isinstance(node.left, ast.Constant)
                      and any(isinstance(c, ast.Name) and c.id == keywords for c in node.comparators)}
    return [key for name, key in bound.items() if name in used and name not in none_tested
            and key not in present_tested]


def _keyword_read(value: ast.expr, keywords: str) -> str | None:
    """``"x"`` where ``value`` is ``keywords.get("x")``, ``keywords.pop("x")`` or ``keywords["x"]``."""
    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in ("get", "pop")
            and isinstance(value.func.value, ast.Name) and value.func.value.id == keywords and len(value.args) == 1):
        value = value.args[0]
    elif isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and value.value.id == keywords:
        value = value.slice
    else:
        return None
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None


def _candidates(model: torch.nn.Module, names: list[str], seed: int) -> Iterator[dict[str, Any]]:
    """The missing inputs by their recipes: as the recipe lays them out (a waveform also as one channel), then with
    the text model's width as their last dimension (features already embedded, ``(batch, frames, hidden)``)."""
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
        if made.get("input_values") is not None and made["input_values"].dim() == 2:  # codecs take (B, channels, T)
            yield {**made, "input_values": made["input_values"][:, None]}


def _checkpoint_generation_config(model: torch.nn.Module) -> None:
    config = getattr(model, "config", None)
    fields = overrides.for_class(type(model).__name__, getattr(config, "model_type", "")).get("generation_config", {})
    generation_config = getattr(model, "generation_config", None)
    for key, value in fields.items():
        if generation_config is not None and not hasattr(generation_config, key):
            setattr(generation_config, key, copy.deepcopy(value))
