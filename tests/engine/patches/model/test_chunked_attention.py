"""Local attention looped window by window, as one block-masked attention: the loop's numbers, at any length."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.patches.model.chunked_attention import _patch_chunk_loop_as_window_mask
from tests.engine.patches.export_checks import assert_exports_and_runs


def _local_attention(stride: int, to_width: int, first_position: bool):
    from transformers import CanineConfig
    from transformers.models.canine.modeling_canine import CanineAttention

    config = CanineConfig(hidden_size=16, num_attention_heads=2, attention_probs_dropout_prob=0.0,
                          hidden_dropout_prob=0.0)
    return CanineAttention(config, local=True, always_attend_to_first_position=first_position,
                           attend_from_chunk_width=stride, attend_from_chunk_stride=stride,
                           attend_to_chunk_width=to_width, attend_to_chunk_stride=stride).eval()


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 3), seq=st.integers(1, 20), stride=st.integers(1, 6), extra_width=st.integers(0, 3),
       first_position=st.booleans(), padded=st.lists(st.booleans(), min_size=20, max_size=20),
       seed=st.integers(0, 2**16))
def test_window_mask_equals_the_chunk_loop(batch, seq, stride, extra_width, first_position, padded, seed):
    """Any length (one window, several, a short last one), overlapping key windows, the first key in every window,
    and padding, including windows whose keys are all padding."""
    torch.manual_seed(seed)
    module = _local_attention(stride, stride + extra_width, first_position)
    hidden = torch.randn(batch, seq, 16)
    mask = torch.tensor([0.0 if p else 1.0 for p in padded[:seq]])[None, None, :].expand(batch, seq, seq)
    original = type(module).forward
    rewritten = _patch_chunk_loop_as_window_mask(original)
    with torch.no_grad():
        expected = original(module, hidden, mask)[0]
        torch.testing.assert_close(rewritten(module, hidden, mask)[0], expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_canine_local_attention_exports_for_other_lengths(backend):
    """Without the rewrite the loop pins the traced length (``Eq(seq, 8)``) and the program refuses 13."""
    torch.manual_seed(0)
    module = _local_attention(stride=4, to_width=4, first_position=False)
    trace = {"hidden_states": torch.randn(2, 8, 16), "attention_mask": torch.ones(2, 8, 8)}
    run = {"hidden_states": torch.randn(3, 13, 16), "attention_mask": torch.ones(3, 13, 13)}
    assert_exports_and_runs(module, trace, run, backend, tolerance=1e-5)
