"""Sparse-attention indexers that pick each query's key blocks, as fixed-size tensor ops over all queries at once.

Pattern: Qwen4-Exp's QSA indexer loops over batch and queries, takes ``torch.nonzero`` of a query's visible keys,
pools them ``compress_ratio`` at a time into blocks, scores each block against the query and keeps the best
``token_budget // compress_ratio`` blocks plus the incomplete tail. The visible count is unbacked and ``if
num_complete_blocks > 0`` guards on it (``(u0//2) > 0``).

Rewrite: every query's visible keys in order (each scattered to its rank), blocks gathered from that order, the same
pooling, norm, rotation and scores for all blocks at once, the best complete blocks by pairwise comparison, the
selection as a mask by each key's rank. No ``sort``/``nonzero`` (ExecuTorch's portable kernels lack them). A tie
for the last place (scores of exactly 0) goes to the earlier block; ``topk``'s choice is unspecified there. Cost:
``batch x queries x keys x head_dim`` gathered, ``batch x queries x blocks^2`` compared. No upstream issue found.
"""

from __future__ import annotations

import functools
import math
import sys

import torch

from engine.patches.registry import register_patch


def visible_in_order(visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(order, count, rank)`` for a boolean ``[..., keys]`` mask: ``order[..., i]`` the position of the ``i``-th
    visible key (the invisible ones after them, in order), ``count`` the visible keys, ``rank`` each key's index
    among the visible ones (meaningless where invisible): what ``nonzero()`` of each row lists, at a fixed size.
    A scatter of each key to its place, not a sort (ExecuTorch's portable kernels have no ``sort``)."""
    positions = torch.arange(visible.shape[-1], device=visible.device).expand_as(visible)
    running = visible.long().cumsum(-1)  # visible keys up to and including each
    count = running[..., -1:]
    place = torch.where(visible, running - 1, count + positions - running)
    return torch.zeros_like(place).scatter(-1, place, positions), count[..., 0], running - 1


def best_blocks(scores: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """Whether each block is among the ``k`` highest-scoring valid ones of its row, ties going to the earlier block
    (``topk`` of a short CPU row returns them so; it promises no order): by each block's count of valid blocks
    ranked before it, ``[..., blocks, blocks]`` comparisons."""
    before = scores[..., :, None] > scores[..., None, :]
    index = torch.arange(scores.shape[-1], device=scores.device)
    before |= (scores[..., :, None] == scores[..., None, :]) & (index[:, None] < index[None, :])
    ahead = (before & valid[..., :, None]).sum(dim=-2)
    return valid & (ahead < k)


def select_blocks(self, hidden_states, position_embeddings, attention_mask, cache=None):
    """``Qwen4ExpTextQSAIndexer.forward`` without per-query loops (see the module docstring)."""
    rotate = sys.modules[type(self).__module__].apply_rotary_pos_emb
    batch_size, seq_length, _ = hidden_states.shape
    hidden_shape = (batch_size, seq_length, -1, self.index_head_dim)
    full_cos, full_sin = position_embeddings
    current_cos, current_sin = full_cos[:, -seq_length:, :], full_sin[:, -seq_length:, :]

    q, token_k = torch.split(self.index_qk_proj(hidden_states),
                             [self.index_n_heads * self.index_head_dim, self.index_kv_heads * self.index_head_dim], dim=-1)
    q, raw_keys = q.reshape(*hidden_shape), token_k.reshape(*hidden_shape).squeeze(2)
    q = rotate(self.q_layernorm(q), cos=current_cos, sin=current_sin, unsqueeze_dim=2)
    if cache is not None:
        raw_keys = cache.update_indexer(raw_keys, self.layer_idx)

    visible = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    visible = visible[:, 0].expand(batch_size, seq_length, -1)  # [batch, queries, keys]
    ratio = self.compress_ratio
    order, count, rank = visible_in_order(visible)
    complete = count // ratio  # [batch, queries]
    # [batch, queries, block, ratio]: a gather of the complete blocks' places (a slice to them guards on the parity)
    places = torch.arange((order.shape[-1] // ratio) * ratio, device=order.device)
    blocks = order.gather(-1, places.expand(*order.shape[:-1], -1)).unflatten(-1, (-1, ratio))
    rows = torch.arange(batch_size, device=hidden_states.device)[:, None, None]
    pooled = raw_keys[rows[..., None], blocks].float().mean(dim=-2).to(raw_keys.dtype)
    starts = blocks[..., 0]
    block_keys = rotate(self.k_layernorm(pooled).unsqueeze(-2), cos=full_cos[rows, starts], sin=full_sin[rows, starts],
                        unsqueeze_dim=-2).squeeze(-2)
    scores = torch.matmul(q.float(), block_keys.float().transpose(-1, -2)).transpose(-1, -2)
    scores = torch.relu(scores).sum(dim=-1) / math.sqrt(self.index_head_dim)  # [batch, queries, block]
    chosen = best_blocks(scores, torch.arange(scores.shape[-1], device=scores.device) < complete[..., None],
                         self.block_topk)
    chosen = torch.cat([chosen, chosen.new_zeros((*chosen.shape[:-1], 1))], dim=-1)  # a slot for the tail's tokens

    block_of = torch.div(rank.clamp(min=0), ratio, rounding_mode="floor")
    tail = block_of >= complete[..., None]
    selected = visible & (tail | chosen.gather(-1, block_of.clamp(max=chosen.shape[-1] - 1)))
    return selected.unsqueeze(1)


@register_patch("dynamo", "transformers.models.qwen4_exp.modeling_qwen4_exp.Qwen4ExpTextQSAIndexer.forward")
def _patch_block_selection_without_per_query_nonzero(original):
    return functools.wraps(original)(select_blocks)


_patch_block_selection_without_per_query_nonzero.__doc__ = __doc__
