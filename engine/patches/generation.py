"""Patches active only while ``export_for_generation`` exports its components (scope ``"generation"``).

A generation step is exported once and then run at every cache length, so cache state that tracing would
freeze into constants must instead follow the tensors' (symbolic) shapes.
"""

from __future__ import annotations

import torch

from engine.patches.registry import register_patch


# ── Correctness (this scope has no speed patches) ───────────────────────────────────────────────────────────

_SLIDING = "transformers.cache_utils.DynamicSlidingWindowLayer"


def _history_length(layer) -> int:
    """Tokens the layer holds; 0 before its first update, and while its keys are still the 1-D placeholder that
    ``lazy_initialization`` leaves (a subclass may keep the prompt elsewhere: UnlimitedOcr's ``prefill_keys``)."""
    return layer.keys.shape[-2] if layer.is_initialized and layer.keys.ndim >= 2 else 0


@register_patch("generation", f"{_SLIDING}.update")
def _patch_sliding_window_counter_update(original):
    """Pattern: ``DynamicSlidingWindowLayer`` counts tokens in a Python int (``cumulative_length``) and crops its
    keys to the window; that int decides the mask sizes, so an exported decode step bakes the traced cache
    length in and rejects or miscomputes every other step. Upstream:
    https://github.com/huggingface/transformers/issues/44609

    For exported generation steps the layer keeps the whole history instead: its length is the keys' symbolic
    length, and the sliding-window mask still limits attention to the window, so tokens are unchanged. The
    cost is memory: sliding layers grow like full-attention ones.
    """

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        return self.keys, self.values

    return update


@register_patch("generation", f"{_SLIDING}.get_mask_sizes")
def _patch_sliding_window_counter_mask_sizes(original):
    """Same pattern as :func:`_patch_sliding_window_counter_update`: mask sizes from the kept history."""

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return _history_length(self) + query_length, 0

    return get_mask_sizes


@register_patch("generation", f"{_SLIDING}.get_seq_length")
def _patch_sliding_window_counter_seq_length(original):
    """Same pattern as :func:`_patch_sliding_window_counter_update`: positions from the kept history."""

    def get_seq_length(self) -> int:
        return _history_length(self)

    return get_seq_length


@register_patch("generation", "transformers.generation.utils.create_masks_for_generate")
def _patch_generate_prebuilt_4d_mask(original):
    """Pattern: for compileable caches (``StaticCache``) ``generate()`` pre-builds each step's 4D attention mask
    outside the model and passes it as an input; a generation loop over exported steps has no model to
    rebuild it with. While capturing, generate() passes the 2D mask on, and the exported forward builds the
    same 4D mask itself (it asks the cache for its mask sizes). TODO: upstream issue not found.
    """

    def create_masks_for_generate(*args, attention_mask=None, **kwargs):
        return attention_mask

    return create_masks_for_generate


_STATIC_SLIDING = "transformers.cache_utils.StaticSlidingWindowLayer"


@register_patch("generation", f"{_STATIC_SLIDING}.__init__")
def _patch_static_sliding_window_counter_init(original):
    """Pattern: ``StaticSlidingWindowLayer`` keeps a Python int (``cumulative_length_int``) that picks its write branch
    and its mask sizes, so an exported decode step bakes the traced length in (as
    https://github.com/huggingface/transformers/issues/44609 describes for compiled generation).

    For exported generation steps the layer behaves as a full static layer: a buffer of ``max_cache_len`` written at its
    tensor counter, mask sizes ``(max_cache_len, 0)``; the sliding-window mask still limits attention to the window, so
    tokens are unchanged. The cost is memory: the buffer is ``max_cache_len`` long, not the window."""
    from transformers.cache_utils import StaticLayer

    def __init__(self, max_cache_len: int, sliding_window: int, **kwargs):
        StaticLayer.__init__(self, max_cache_len=max_cache_len)
        self.sliding_window = sliding_window

    return __init__


def _static_layer_method(name: str):
    def factory(original):
        from transformers.cache_utils import StaticLayer

        return getattr(StaticLayer, name)

    factory.__name__ = f"_patch_static_sliding_window_counter_{name}"
    factory.__doc__ = f"Same pattern as :func:`_patch_static_sliding_window_counter_init`: ``{name}`` of a full static layer."
    return factory


for _method in ("update", "get_mask_sizes", "get_seq_length"):
    register_patch("generation", f"{_STATIC_SLIDING}.{_method}")(_static_layer_method(_method))
