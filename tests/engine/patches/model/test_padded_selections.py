"""Per-sample boolean selections padded to one length (engine.patches.model.padded_selections), against the loops
they replace."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.patches.export_checks import assert_exports_and_runs


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(0, 8), st.integers(0, 2**16))
def test_compacted_equals_the_per_sample_pad(batch, rows, length, seed):
    from transformers.models.udop.modeling_udop import pad_sequence

    from engine.patches.model.padded_selections import compacted

    g = torch.Generator().manual_seed(seed)
    values, keep = torch.randn(batch, rows, 3, generator=g), torch.rand(batch, rows, generator=g) > 0.5
    expected = torch.stack([pad_sequence(values[i][keep[i]], length, torch.zeros(3)) for i in range(batch)])
    torch.testing.assert_close(compacted(values, keep, length), expected, rtol=0, atol=0)


def _udop_inputs(batch, tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    corners = torch.rand(batch, tokens, 2, 2, generator=g).sort(dim=2).values  # x0 <= x1, y0 <= y1
    bbox = corners.permute(0, 1, 3, 2).reshape(batch, tokens, 4)[..., [0, 2, 1, 3]]
    bbox[:, 0] = 0.0  # a token without a box (the merge leaves its embedding as it is)
    return {"image_embeddings": torch.randn(batch, 16, 8, generator=g), "inputs_embeds": torch.randn(batch, tokens, 8, generator=g),
            "bbox": bbox, "attention_mask": torch.ones(batch, tokens, dtype=torch.long)}


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(0, 2**16), st.sampled_from([0, 12]))
def test_the_merge_equals_udops(batch, tokens, seed, max_len):
    from transformers.models.udop import modeling_udop

    from engine.patches.model.padded_selections import _patch_uncovered_patches_compacted_by_rank

    merge = _patch_uncovered_patches_compacted_by_rank(modeling_udop.combine_image_text_embeddings)
    inputs = _udop_inputs(batch, tokens, seed)
    kwargs = {"num_patches": 4, "max_len": max_len, "image_size": 16, "patch_size": 4, "visual_bbox": None}
    expected = modeling_udop.combine_image_text_embeddings(**{**inputs, "inputs_embeds": inputs["inputs_embeds"].clone()}, **kwargs)
    got = merge(**{**inputs, "inputs_embeds": inputs["inputs_embeds"].clone()}, **kwargs)
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _Merge(torch.nn.Module):
    """UDOP's merge as the model calls it (the registered patch replaces it while exported)."""

    def forward(self, image_embeddings, inputs_embeds, bbox, attention_mask):
        from transformers.models.udop import modeling_udop

        return modeling_udop.combine_image_text_embeddings(image_embeddings, inputs_embeds.clone(), bbox, None,
                                                           attention_mask, num_patches=4, image_size=16, patch_size=4)


def test_the_merge_exports_for_any_batch():
    """Traced at two samples, the program takes three with other boxes (the original iterates the index tensor:
    'its data is not allocated yet')."""
    assert_exports_and_runs(_Merge(), _udop_inputs(2, 5), _udop_inputs(3, 5, seed=1), "dynamo", tolerance=1e-6)
