"""Capture: one ``model.generate`` recorded as the real forward kwargs of its prefill and decode calls."""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from engine.pytree import is_cache_object
from engine.generation.plan import MODALITIES


# ─── Capture ─────────────────────────────────────────────────────────────────────────────────────

def snapshot(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Copy call kwargs as they are *at call time* (the forward mutates caches in place)."""
    return {k: (v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in kwargs.items()}


@contextlib.contextmanager
def recording(module: torch.nn.Module, calls: list[dict[str, Any]]) -> Iterator[None]:
    """Record the kwargs of every call of ``module`` (positional arguments are bound to their names)."""
    import inspect

    signature = inspect.signature(module.forward)

    def hook(mod, args, kwargs):
        bound = signature.bind_partial(*args, **kwargs).arguments
        extra = bound.pop("kwargs", {}) if "kwargs" in signature.parameters else {}
        calls.append(snapshot({**bound, **extra}))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


class FeatureMethod(torch.nn.Module):
    """A module whose forward is ``owner.<method>(**kwargs)``: generate() encodes images/videos through the
    base model's ``get_<modality>_features`` method, so that method is what a generation loop must export."""

    def __init__(self, owner: torch.nn.Module, method: str):
        super().__init__()
        self.owner = owner
        self.method = method
        self.train(owner.training)  # a new module starts in training mode; the owner says what is traced

    def forward(self, **kwargs: Any) -> Any:
        return getattr(self.owner, self.method)(**kwargs)


@contextlib.contextmanager
def recording_method(owner: Any, method: str, calls: list[dict[str, Any]]) -> Iterator[None]:
    original = getattr(owner, method)

    @functools.wraps(original)  # generate() picks the method's kwargs from its signature
    def recorded(*args: Any, **kwargs: Any) -> Any:
        import inspect

        bound = inspect.signature(original).bind_partial(*args, **kwargs).arguments
        extra = bound.pop("kwargs", {})
        calls.append(snapshot({**bound, **extra}))
        return original(*args, **kwargs)

    from engine.swap import swap_attributes

    with swap_attributes([(owner, method, recorded)]):
        yield


def feature_methods(model: torch.nn.Module) -> dict[str, str]:
    """``{modality: method}`` for the ``get_<modality>_features`` methods generate() may call."""
    base = getattr(model, "base_model", model)
    return {m: f"get_{m}_features" for m in MODALITIES if callable(getattr(base, f"get_{m}_features", None))}


def _fresh_cache(cache: Any, model: torch.nn.Module) -> Any:
    """A caller's ``StaticCache`` re-created at capture time, so patches active during the capture shape its layers (a
    cache built earlier keeps the layers it got then); other caches are copied."""
    from transformers import StaticCache

    if isinstance(cache, StaticCache) and cache.layers:
        max_cache_len = max(layer.max_cache_len for layer in cache.layers if hasattr(layer, "max_cache_len"))
        return StaticCache(config=model.config, max_cache_len=max_cache_len)
    return copy.deepcopy(cache)


def run_generate(model: torch.nn.Module, inputs: Mapping[str, Any], tokens: int) -> torch.Tensor:
    kwargs = {k: (_fresh_cache(v, model) if is_cache_object(v) else copy.deepcopy(v)) for k, v in inputs.items()}
    with torch.no_grad():
        out = model.generate(**kwargs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, num_beams=1,
                             num_return_sequences=1)
    return out if isinstance(out, torch.Tensor) else out.sequences
