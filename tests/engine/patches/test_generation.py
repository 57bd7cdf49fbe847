"""Generation patches (:mod:`engine.patches.generation`): cache state that follows symbolic shapes."""

from __future__ import annotations

import torch


def test_the_sliding_window_history_of_a_layer_still_holding_its_placeholder_is_zero():
    """``lazy_initialization`` leaves 1-D empty keys; a subclass that keeps the prompt elsewhere (UnlimitedOcr) asks
    the patched length before its first ``super().update``."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    from engine.patches.generation import _history_length

    layer = DynamicSlidingWindowLayer(sliding_window=4)
    layer.lazy_initialization(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))
    assert layer.keys.ndim == 1 and _history_length(layer) == 0
