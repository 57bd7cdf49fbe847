"""Two recorded one-token decode calls merged into one two-token step, so the exported decode keeps its
query length symbolic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from engine.generation.plan import GenerationPlan, TOKEN_INPUTS


# ─── Decode-call merge ───────────────────────────────────────────────────────────────────────────

def _token_dim(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The dim that carries the new token: the last dim of size 1 shared by both calls."""
    if a.shape != b.shape:
        return None
    dims = [d for d in range(a.ndim) if a.shape[d] == 1]
    return dims[-1] if dims else None


def growing_dim(a: torch.Tensor, b: torch.Tensor) -> int | None:
    if a.ndim != b.ndim:
        return None
    grown = [d for d in range(a.ndim) if b.shape[d] == a.shape[d] + 1]
    same = [d for d in range(a.ndim) if b.shape[d] == a.shape[d]]
    return grown[0] if len(grown) == 1 and len(same) == a.ndim - 1 else None


def _counts_on(a: torch.Tensor, b: torch.Tensor, dim: int) -> bool:
    """Whether ``b`` is ``a`` with the next position appended along ``dim`` (positions of a step without cache),
    rather than another value (a mask's 1)."""
    if a.shape[dim] == 0 or not torch.equal(b.narrow(dim, 0, a.shape[dim]), a):
        return False
    return torch.equal(b.narrow(dim, a.shape[dim], 1), a.narrow(dim, a.shape[dim] - 1, 1) + 1)


def _per_token_dim(name: str, a: torch.Tensor, b: torch.Tensor, prefill: Mapping[str, Any] | None,
                   prompt_length: int | None) -> int | None:
    """The dim along which a kwarg holds one entry per processed token although it repeats (the same in both decode
    calls): size 1 there in the decode calls, the prompt's length there in the prefill."""
    before = (prefill or {}).get(name)
    if name in TOKEN_INPUTS or not isinstance(before, torch.Tensor) or before.ndim != a.ndim or not prompt_length:
        return None
    dims = [d for d in range(a.ndim) if a.shape[d] == 1 and before.shape[d] == prompt_length
            and all(before.shape[o] == a.shape[o] for o in range(a.ndim) if o != d)]
    return dims[-1] if dims and prompt_length > 1 and torch.equal(a, b) else None


def merge_decode_calls(first: dict[str, Any], second: dict[str, Any], plan: GenerationPlan,
                       prefill: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One two-token decode step from two one-token calls: token kwargs concatenated, growing kwargs taken
    from the second call, everything else (the cache before the first call included) from the first.

    A kwarg that is the same in both calls but held the prompt's length in the ``prefill`` along the dim the
    decode calls have at 1 is per-token (generate() repeats its last position): concatenated too, and recorded in
    ``plan.per_token``."""
    ids = (prefill or {}).get("decoder_input_ids", (prefill or {}).get("input_ids"))
    prompt_length = ids.shape[-1] if isinstance(ids, torch.Tensor) and ids.ndim >= 1 else None
    merged = {}
    for name, a in first.items():
        b = second.get(name)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            growing, token_dim = growing_dim(a, b), _token_dim(a, b)
            carries_tokens = token_dim is not None and (name in TOKEN_INPUTS or not torch.equal(a, b))
            per_token = None if growing is not None or carries_tokens else _per_token_dim(name, a, b, prefill, prompt_length)
            if per_token is not None:  # token_type_ids, a per-token image mask: one entry per query token
                plan.per_token[name] = per_token
                merged[name] = torch.cat([a, b], dim=per_token)
            elif growing is not None:  # e.g. an attention mask: one position more per token
                plan.growing[name] = growing
                if name not in TOKEN_INPUTS and _counts_on(a, b, growing):
                    plan.growing_positions.append(name)
                merged[name] = b
            elif carries_tokens:  # ids, positions: concatenated into a two-token query
                plan.token_dims[name] = token_dim
                merged[name] = torch.cat([a, b], dim=token_dim)
            else:  # the same every step (an encoder's mask, ...)
                merged[name] = a
        else:
            merged[name] = a
    return merged
