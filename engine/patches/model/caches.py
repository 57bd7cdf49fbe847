"""Cache updates that branch on the traced prompt length, written to hold for every length."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from engine.patches.registry import register_patch
from engine.swap import swap_attributes


def _prefill_conv_state_padded(cache):
    """``cache.update_conv_state`` with a prefill's conv state left-padded by ``kernel`` zero columns before the
    cache's own update: longer than the kernel at every length, so the cache's padding branch is never taken;
    its last ``kernel`` columns (what the cache keeps) are the branch's, and the extra zeros only lengthen the
    states the short convolution runs over before its output is sliced back to the prompt's length."""
    update = cache.update_conv_state

    def update_conv_state(conv_states, layer_idx, state_idx=0, **kwargs):
        layer = cache.layers[layer_idx]
        kernel = kwargs.get("conv_kernel_size") or layer.conv_kernel_size.get(state_idx)
        if (isinstance(kernel, int) and isinstance(conv_states.shape[-1], torch.SymInt)
                and not layer.has_previous_state[state_idx] and not layer.record_past):
            conv_states = F.pad(conv_states, (kernel, 0))
        return update(conv_states, layer_idx, state_idx, **kwargs)

    return update_conv_state


@register_patch("dynamo", "transformers.models.lfm3.modeling_lfm3.Lfm3ShortConv.forward")
def _patch_prefill_conv_state_padded_whatever_its_length(original):
    """Pattern: ``if full_conv_states.shape[-1] < self.conv_kernel_size[state_idx]: pad``
    (``LinearAttentionLayer.update_conv_state``), a Python test of the traced prompt length: traced longer than the
    kernel, the program guards ``seq >= kernel`` and refuses shorter prompts (Lfm3, kernel 7: 'between 7 and 254').

    Rewrite: while the short convolution runs, the cache's update gets a conv state already padded by ``kernel`` zero
    columns (:func:`_prefill_conv_state_padded`): the test is false at every length, with the same cached state and
    sliced output (a causal convolution pads with zeros on the left anyway). Lfm3 only. No upstream issue found; TODO
    (transformers): pad without the branch."""

    @functools.wraps(original)
    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        if cache is None or not hasattr(cache, "layers") or not isinstance(hidden_states.shape[1], torch.SymInt):
            return original(self, hidden_states, cache, attention_mask, **kwargs)
        with swap_attributes([(cache, "update_conv_state", _prefill_conv_state_padded(cache))]):
            return original(self, hidden_states, cache, attention_mask, **kwargs)

    return forward
