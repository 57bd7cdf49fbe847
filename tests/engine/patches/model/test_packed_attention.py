"""Packed variable-length attention traced as one masked SDPA: per-segment attention exactly, and exportable."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from engine.patches.model.packed_attention import (IMPLEMENTATION, masked_sdpa_varlen_attention, packed_attention_as_masked_sdpa,
                                     segment_ids)


def _per_segment(query, key, value, lengths, scale):
    """What transformers' sdpa path computes: split by the segment lengths, attend each piece, concatenate."""
    pieces = [F.scaled_dot_product_attention(q, k, v, scale=scale)
              for q, k, v in zip(*(t.split(lengths, dim=2) for t in (query, key, value)))]
    return torch.cat(pieces, dim=2).transpose(1, 2)


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5), heads=st.integers(1, 3),
       dim=st.sampled_from([4, 8]), seed=st.integers(0, 2**16))
def test_masked_sdpa_equals_attention_per_segment(lengths, heads, dim, seed):
    generator = torch.Generator().manual_seed(seed)
    query, key, value = (torch.randn(1, heads, sum(lengths), dim, generator=generator) for _ in range(3))
    cu_seqlens = F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).to(torch.int32)
    module = torch.nn.Module()
    module.is_causal = False
    got, _ = masked_sdpa_varlen_attention(module, query, key, value, None, scaling=dim**-0.5,
                                          cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens)
    torch.testing.assert_close(got, _per_segment(query, key, value, lengths, dim**-0.5), atol=1e-5, rtol=1e-5)
    assert segment_ids(cu_seqlens, sum(lengths)).tolist() == [i for i, n in enumerate(lengths) for _ in range(n)]


def tiny_vision_tower():
    from transformers import Qwen3VLVisionConfig, Qwen3VLVisionModel

    config = Qwen3VLVisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=4,
                                 spatial_merge_size=2, temporal_patch_size=2, in_channels=3, out_hidden_size=32,
                                 num_position_embeddings=64, deepstack_visual_indexes=[])
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen3VLVisionModel(config).eval()


def sample_images(grid: list[tuple[int, int]]):
    grid_thw = torch.tensor([[1, h, w] for h, w in grid])
    return {"hidden_states": torch.randn(int(grid_thw.prod(-1).sum()), 3 * 2 * 4 * 4), "grid_thw": grid_thw}


def test_a_packed_vision_tower_exports_for_any_image_sizes():
    """Qwen3-VL's vision tower (sdpa: split per image by ``lengths.tolist()``) fails torch.export on the
    data-dependent split without the switch; with it, one program runs images of other sizes exactly (other image
    counts: tests/engine/patches/model/test_packed_grids.py)."""
    from engine import DynamoExporter
    from engine.compare import compare_leaves
    from engine.pytree import get_leaf_tensors
    from engine.runtime import run_exported

    model = tiny_vision_tower()
    sample = sample_images([(4, 4), (2, 4)])
    with pytest.raises(GuardOnDataDependentSymNode):
        torch.export.export(model, (), dict(sample), strict=False)  # the split as transformers writes it
    with packed_attention_as_masked_sdpa(model) as switched:
        assert switched and model.config._attn_implementation == IMPLEMENTATION
    assert model.config._attn_implementation == "sdpa"
    program = DynamoExporter().export(model, sample, {"dynamic": True})
    for inputs in (sample, sample_images([(2, 6), (6, 4)])):
        with torch.no_grad():
            expected = get_leaf_tensors(model(**inputs))
        assert compare_leaves(expected, run_exported(program, inputs)).ok
