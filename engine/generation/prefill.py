"""The prefill as a decode step over an empty cache, where the decode program also computes the prefill."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from engine.pytree import fill_leaves, get_leaf_tensors, is_cache_object
from engine.generation.decode_merge import growing_dim
from engine.generation.plan import GenerationPlan


# ─── Prefill as a decode step over an empty cache ─────────────────────────────────────────────────

def cache_kwargs(kwargs: Mapping[str, Any]) -> list[str]:
    """The names of the cache objects among a step's kwargs."""
    return [k for k, v in kwargs.items() if is_cache_object(v)]


def empty_cache_leaves(prefill_cache: Any, first: Any, second: Any) -> dict[str, torch.Tensor] | None:
    """The decode cache's leaves as they are before any token, or None when they cannot be told.

    A decode step with a symbolic query length also computes the prefill when given the cache as it is before the
    prompt: growing leaves (a dynamic cache's keys and values) at length 0, leaves the prefill received as it received
    them (a counter), zeros for the rest (a static cache's buffers, allocated zeroed at first update). ``first`` and
    ``second`` are the caches of two consecutive one-token decode calls. A candidate: the exporter keeps it only once
    the decode program reproduces the eager prefill on it (where it fails, as for a sliding window shorter than the
    prompt, the prefill gets its own program)."""
    before = get_leaf_tensors(prefill_cache) if prefill_cache is not None else {}
    a, b = get_leaf_tensors(first), get_leaf_tensors(second)
    if not a or set(a) != set(b):
        return None
    empty = {}
    for name, leaf in a.items():
        grown = growing_dim(leaf, b[name])
        if grown is not None:
            empty[name] = leaf.new_zeros([0 if d == grown else s for d, s in enumerate(leaf.shape)])
        elif name in before:
            if before[name].shape != leaf.shape:
                return None
            empty[name] = before[name].clone()
        else:
            empty[name] = torch.zeros_like(leaf)
    return empty


def prefill_through_decode(plan: GenerationPlan, prefill_kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """Decode-step kwargs that compute the prefill: the prefill's values, the decode cache refilled with
    :attr:`GenerationPlan.empty_cache`. None when the two steps do not take the same kwargs."""
    decode = plan.templates[plan.decode]
    cache_names = cache_kwargs(decode)
    if plan.empty_cache is None or len(cache_names) != 1:
        return None
    tensors = lambda kwargs: {k for k, v in kwargs.items() if isinstance(v, torch.Tensor)}  # noqa: E731
    if tensors(decode) != tensors(prefill_kwargs):
        return None
    out = {k: prefill_kwargs.get(k, v) for k, v in decode.items()}
    # copies: a program that updates its cache in place (a static cache's) must not fill the plan's empty one
    out[cache_names[0]] = fill_leaves(decode[cache_names[0]], {k: v.clone() for k, v in plan.empty_cache.items()})
    return out
