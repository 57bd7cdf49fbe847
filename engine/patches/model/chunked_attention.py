"""Local attention computed chunk by chunk in a Python loop over the sequence, run as one block-masked attention.

Pattern: ``for chunk_start in range(0, seq_length, stride)`` slicing the queries and keys into windows and
concatenating each window's attention (Canine's character encoder). The loop runs once per window of the traced
length, so torch.export pins the length. One attention over the whole sequence, whose mask also hides every key
outside the query's window, gives each query the same keys and so the same softmax (masked keys weigh exactly 0).
"""

from __future__ import annotations

import functools

import torch

from engine.patches.registry import register_patch


def window_mask(length: int | torch.SymInt, stride: int, to_width: int, device: torch.device) -> torch.Tensor:
    """``[length, length]`` bool: query ``i`` sees key ``j`` when ``j`` lies in the key window of ``i``'s chunk
    (chunk ``i // stride``, keys ``[k * stride, k * stride + to_width)``)."""
    positions = torch.arange(length, device=device)
    start = (positions // stride * stride)[:, None]
    return (positions[None, :] >= start) & (positions[None, :] < start + to_width)


def block_masked_local_attention(module, hidden_states: torch.Tensor, attention_mask: torch.Tensor):
    """Canine's local attention (``CanineAttention.forward`` with ``local=True``) as one call of its self-attention:
    the 0/1 ``[batch, from, to]`` mask becomes the additive one the module makes of it, plus ``-inf`` outside the
    window (below the padding's dtype minimum), so a query whose window keys are all padding still spreads over its
    window only, as in the loop. Each window holds its query, so no row is all ``-inf``."""
    length = hidden_states.shape[1]
    keys = hidden_states
    visible = window_mask(length, module.attend_from_chunk_stride, module.attend_to_chunk_width, hidden_states.device)
    allowed = attention_mask.to(hidden_states.dtype)
    if module.always_attend_to_first_position:  # the first key joins every window, as an extra key
        keys = torch.cat([hidden_states[:, :1], hidden_states], dim=1)
        visible = torch.cat([torch.ones_like(visible[:, :1]), visible], dim=1)
        allowed = torch.cat([allowed[:, :, :1], allowed], dim=2)
    outside = torch.zeros_like(visible, dtype=hidden_states.dtype).masked_fill(~visible, float("-inf"))
    additive = (1.0 - allowed)[:, None] * torch.finfo(hidden_states.dtype).min + outside[None, None]
    return module.self(hidden_states, keys, additive)[0]


@register_patch("dynamo", "transformers.models.canine.modeling_canine.CanineAttention.forward")
def _patch_chunk_loop_as_window_mask(original):
    """Pattern: ``CanineAttention.forward`` with ``local=True`` loops over ``range(0, seq, stride)`` windows
    (models/canine/modeling_canine.py), which pins the sequence length (``Eq(seq, 8)``). Rewritten as one
    block-masked attention (:func:`block_masked_local_attention`) where the windows tile the sequence: query chunks
    as wide as their stride, key chunks on the same stride, the first position not attending to all, no attention
    probabilities asked (the loop returns them per window). Upstream: https://github.com/huggingface/transformers/issues/47491."""

    @functools.wraps(original)
    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        tiles = (self.attend_from_chunk_width == self.attend_from_chunk_stride == self.attend_to_chunk_stride
                 and not self.first_position_attends_to_all)
        if not self.local or output_attentions or not tiles or getattr(attention_mask, "ndim", None) != 3:
            return original(self, hidden_states, attention_mask, output_attentions)
        attention_output = block_masked_local_attention(self, hidden_states, attention_mask)
        return (self.output(attention_output, hidden_states),)

    return forward
