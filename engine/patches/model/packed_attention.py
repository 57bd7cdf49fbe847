"""Packed variable-length attention (vision towers that take ``cu_seqlens``) traced as one masked SDPA.

Pattern: Qwen-VL-style vision towers pack every image's patches into one sequence with ``cu_seqlens`` boundaries
(built in-graph from ``grid_thw``). With a flash implementation the attention takes the boundaries
(``cu_seq_lens_q``); with ``sdpa`` or ``eager`` it splits the sequence per image,
``torch.split(states, lengths.tolist())``, attends each piece and concatenates them. The lengths are
data-dependent, so ``.tolist()`` fails under torch.export (``GuardOnDataDependentSymNode`` in ``_refs.unbind``:
https://github.com/pytorch/pytorch/issues/126685). While a model is traced, every module whose forward takes
``cu_seqlens`` gets :data:`IMPLEMENTATION` instead of ``sdpa``/``eager``: its name asks for the flash path (transformers
routes on ``"flash" in config._attn_implementation``), and it computes that path as one SDPA over a block-diagonal
mask, token i attending token j only within one segment. That is per-image attention (the masked scores get weight
0), traced once for any number and size of images.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from engine.patches.registry import register_trace_context

#: the attention implementation the packed modules run while traced ("flash" in it selects the cu_seqlens path)
IMPLEMENTATION = "flash_varlen_as_masked_sdpa"
#: implementations whose packed path splits per segment, and which the masked SDPA computes exactly
REPLACED = ("sdpa", "eager")


def segment_ids(cu_seqlens: torch.Tensor, length: int | torch.SymInt) -> torch.Tensor:
    """The segment each of ``length`` packed positions lies in: the number of boundaries ``cu_seqlens[1:]`` at or
    before it (a comparison and a sum, with no data-dependent shape)."""
    positions = torch.arange(length, device=cu_seqlens.device)
    return (positions[:, None] >= cu_seqlens[None, 1:]).sum(-1)


def masked_sdpa_varlen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                 value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                                 scaling: float | None = None, is_causal: bool | None = None,
                                 cu_seq_lens_q: torch.Tensor | None = None, cu_seq_lens_k: torch.Tensor | None = None,
                                 max_length_q: int | None = None, max_length_k: int | None = None, **kwargs):
    """The flash varlen call as SDPA: ``(batch, heads, seq, dim)`` states packed along ``seq`` by ``cu_seq_lens_q``
    (and ``cu_seq_lens_k``), attending within their segment; a call without boundaries is plain SDPA."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    keys_boundaries = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
    same_segment = segment_ids(cu_seq_lens_q, query.shape[-2])[:, None] == segment_ids(keys_boundaries,
                                                                                        key.shape[-2])[None, :]
    mask = same_segment[None, None]
    if attention_mask is not None:
        mask = mask & attention_mask.bool() if attention_mask.dtype == torch.bool else \
            torch.where(mask, attention_mask, torch.finfo(attention_mask.dtype).min)
    if key.shape[1] != query.shape[1]:  # grouped key/value heads
        key, value = (repeat_kv(t, query.shape[1] // key.shape[1]) for t in (key, value))
    # torch's SDPA directly: transformers' sdpa_attention_forward asks `q_length > 1`, a guard on a packed length
    # that is data-dependent in some towers (ColQwen2)
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return output.transpose(1, 2).contiguous(), None


def _register() -> None:
    """Make :data:`IMPLEMENTATION` known to transformers (on first use: a plain module's export never imports
    transformers' modeling utilities)."""
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, masked_sdpa_varlen_attention)


def _takes_cu_seqlens(module: torch.nn.Module) -> bool:
    try:
        return "cu_seqlens" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


@register_trace_context("dynamo")
@contextlib.contextmanager
def packed_attention_as_masked_sdpa(model: torch.nn.Module) -> Iterator[list[str]]:
    """While inside, the configs of ``model``'s modules whose forward takes ``cu_seqlens`` (and that use ``sdpa`` or
    ``eager``) name :data:`IMPLEMENTATION`; yields their class names; restored on exit."""
    configs = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "_attn_implementation_internal", None) in REPLACED and _takes_cu_seqlens(module):
            configs[id(config)] = config
    originals = [(config, config._attn_implementation_internal) for config in configs.values()]
    if originals:
        _register()
    try:
        for config, _ in originals:  # the internal field: the property's setter would recurse into sub-configs
            config._attn_implementation_internal = IMPLEMENTATION
        yield [type(config).__name__ for config, _ in originals]
    finally:
        for config, original in originals:
            config._attn_implementation_internal = original
