"""Longformer-style global attention with every position as a candidate global slot, so no shape is data.

Pattern: Longformer (and LED's encoder, copied from it) give some tokens global attention. The model asks
``is_index_global_attn.flatten().any().item()`` and branches on it, then gathers the global tokens with
``nonzero()`` into ``max_num_global_attn_indices = num_global.max()`` slots: the branch is a guard on data and
every tensor of the global path has a data-dependent size, so torch.export fails (``Eq(u1, 1)``). Here the global
slots are the ``seq_len`` positions themselves: slot ``j`` of a row holds its ``j``-th global token (found by a
``searchsorted`` over the running count of global tokens) and the slots past the row's count are masked exactly
where the model masks its padding slots (``finfo.min`` scores, zero values). The scores of a real slot are the same
dot products, the masked ones add exact zeros to each softmax sum, and a row without global tokens computes the
local-only path's numbers, so one program serves every input; the global tokens' own outputs are gathered back by
their rank instead of an index_put on ``nonzero()`` positions. Cost: the global path is ``seq_len`` slots wide
(O(seq_len^2) scores per head), which export-sized inputs afford; a call asking for attention maps keeps the
model's own path (its maps are ``max_num_global_attn_indices`` wide, a data-dependent shape).
No upstream issue found; the model's own ``onnx_export`` switch covers only the chunking, not the global path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def global_slots(is_index_global_attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(order, valid, rank)`` for ``is_index_global_attn`` ``[batch, seq]``: ``order[b, j]`` the position of row
    ``b``'s ``j``-th global token (clamped into range past the row's count), ``valid[b, j]`` whether slot ``j``
    holds one, ``rank[b, p]`` the slot of the global token at position ``p``."""
    seq_len = is_index_global_attn.shape[1]
    running = is_index_global_attn.long().cumsum(1)  # [batch, seq]: global tokens at or before each position
    slots = torch.arange(seq_len, device=is_index_global_attn.device)
    order = torch.searchsorted(running, slots.expand_as(running).contiguous(), right=True).clamp(max=seq_len - 1)
    valid = slots[None, :] < running[:, -1:]
    rank = (running - 1).clamp(min=0)
    return order, valid, rank


def dense_global_self_attention(self, hidden_states, attention_mask=None, is_index_masked=None,
                                is_index_global_attn=None, is_global_attn=None, output_attentions=False):
    """``LongformerSelfAttention.forward`` (and LED's encoder copy) without output attentions, computed with
    ``seq_len`` global slots (see the module docstring); ``is_global_attn`` is not read."""
    hidden_states = hidden_states.transpose(0, 1)  # [seq, batch, embed]
    seq_len, batch_size, embed_dim = hidden_states.size()
    heads, head_dim, window = self.num_heads, self.head_dim, self.one_sided_attn_window_size
    minimum = torch.finfo(hidden_states.dtype).min

    query = (self.query(hidden_states) / math.sqrt(head_dim)).view(seq_len, batch_size, heads, head_dim)
    query = query.transpose(0, 1)  # [batch, seq, heads, dim]
    key = self.key(hidden_states).view(seq_len, batch_size, heads, head_dim).transpose(0, 1)
    value = self.value(hidden_states).view(seq_len, batch_size, heads, head_dim).transpose(0, 1)

    local_scores = self._sliding_chunks_query_key_matmul(query, key, window)
    removed = (attention_mask != 0)[:, :, None, None]
    float_mask = removed.type_as(query).masked_fill(removed, minimum)
    local_scores = local_scores + self._sliding_chunks_query_key_matmul(float_mask.new_ones(float_mask.size()),
                                                                        float_mask, window)

    order, valid, rank = global_slots(is_index_global_attn)
    by_slot = order[:, :, None, None].expand(-1, -1, heads, head_dim)
    global_keys = key.gather(1, by_slot)  # [batch, slot, heads, dim]
    global_scores = torch.einsum("blhd,bshd->blhs", (query, global_keys))
    global_scores = global_scores.masked_fill(~valid[:, None, None, :], minimum)

    probs = F.softmax(torch.cat((global_scores, local_scores), dim=-1), dim=-1, dtype=torch.float32)
    probs = probs.masked_fill(is_index_masked[:, :, None, None], 0.0).type_as(local_scores)
    probs = F.dropout(probs, p=self.dropout, training=self.training)

    global_values = torch.where(valid[:, :, None, None], value.gather(1, by_slot), 0.0)
    from_global = torch.matmul(probs.narrow(-1, 0, seq_len).transpose(1, 2).clone(),
                               global_values.transpose(1, 2).clone()).transpose(1, 2)
    from_local = self._sliding_chunks_matmul_attn_probs_value(probs.narrow(-1, seq_len, 2 * window + 1).contiguous(),
                                                              value, window)
    attn_output = (from_global + from_local).transpose(0, 1).reshape(seq_len, batch_size, embed_dim).contiguous()

    # the global tokens' own outputs: their queries over every key
    global_hidden = torch.where(valid.T[:, :, None], hidden_states.gather(
        0, order.T[:, :, None].expand(-1, -1, embed_dim)), 0.0)  # [slot, batch, embed]
    global_query = (self.query_global(global_hidden) / math.sqrt(head_dim)).contiguous()
    global_query = global_query.view(seq_len, batch_size * heads, head_dim).transpose(0, 1)
    global_key = self.key_global(hidden_states).contiguous().view(-1, batch_size * heads, head_dim).transpose(0, 1)
    global_value = self.value_global(hidden_states).contiguous().view(-1, batch_size * heads, head_dim).transpose(0, 1)
    scores = torch.bmm(global_query, global_key.transpose(1, 2)).view(batch_size, heads, seq_len, seq_len)
    scores = scores.masked_fill(~valid[:, None, :, None], minimum)
    scores = scores.masked_fill(is_index_masked[:, None, None, :], minimum)
    global_probs = F.softmax(scores.view(batch_size * heads, seq_len, seq_len), dim=-1, dtype=torch.float32)
    global_probs = F.dropout(global_probs.type_as(scores), p=self.dropout, training=self.training)
    global_output = torch.bmm(global_probs, global_value).view(batch_size, heads, seq_len, head_dim)
    at_position = global_output.gather(2, rank[:, None, :, None].expand(-1, heads, -1, head_dim))
    at_position = at_position.permute(2, 0, 1, 3).reshape(seq_len, batch_size, embed_dim)
    attn_output = torch.where(is_index_global_attn.T[:, :, None], at_position, attn_output)
    return (attn_output.transpose(0, 1),)
