"""Masks built by broadcasting equal the vmapped ones, and export without vmap."""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 3), q=st.integers(1, 7), kv_extra=st.integers(0, 5), window=st.integers(1, 6),
       combine=st.sampled_from(["and", "or"]), data=st.data())
def test_masks_by_broadcasting_equal_the_vmapped_ones(batch, q, kv_extra, window, combine, data):
    """transformers' mask functions (causal, sliding windows, padding, chunks), combined with and/or, give by
    broadcasting the mask ``sdpa_mask`` builds with vmap."""
    from transformers import masking_utils as mu

    from engine.patches.model.masks import _mask_by_broadcasting_first

    kv = q + kv_extra
    padding = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=kv, max_size=kv), min_size=batch,
                                              max_size=batch)))
    first = data.draw(st.sampled_from([mu.causal_mask_function, mu.bidirectional_mask_function]))
    second = data.draw(st.sampled_from([mu.sliding_window_causal_mask_function(window),
                                        mu.sliding_window_bidirectional_mask_function(window),
                                        mu.chunked_causal_mask_function(window, torch.zeros(batch, dtype=torch.long)),
                                        mu.padding_mask_function(padding)]))
    mask_function = (mu.and_masks if combine == "and" else mu.or_masks)(first, second)
    kwargs = dict(batch_size=batch, q_length=q, kv_length=kv, q_offset=kv - q, mask_function=mask_function,
                  allow_is_causal_skip=False, use_vmap=True)
    expected = mu.sdpa_mask(**kwargs)
    assert torch.equal(_mask_by_broadcasting_first(mu.sdpa_mask)(**kwargs), expected)


def test_a_combined_mask_exports_without_vmap(tmp_path):
    """Without the patch the and-combined mask is a vmapped ``flat_apply`` the program cannot be saved with; with
    it the program has none, saves, loads and computes eager's mask for another length."""
    from torch._export.serde.serialize import SerializeError
    from transformers import masking_utils as mu

    from engine import load_program, save_program
    from engine.patches.registry import apply_patches

    class Windowed(torch.nn.Module):
        def forward(self, x, attention_mask):
            mask = mu.sdpa_mask(batch_size=x.shape[0], q_length=x.shape[1], kv_length=x.shape[1],
                                mask_function=mu.and_masks(mu.padding_mask_function(attention_mask.bool()),
                                                           mu.sliding_window_bidirectional_mask_function(2)),
                                allow_is_causal_skip=False, use_vmap=True)
            return x.sum(-1)[:, None, :, None] * mask

    inputs, seq = (torch.randn(2, 8, 3), torch.ones(2, 8, dtype=torch.long)), torch.export.Dim("seq", min=2, max=64)
    program = torch.export.export(Windowed(), inputs, dynamic_shapes=({1: seq}, {1: seq}))
    with pytest.raises(SerializeError, match="flat_apply"):
        save_program(program, tmp_path / "vmapped.pt2")
    with apply_patches("dynamo"):
        program = torch.export.export(Windowed(), inputs, dynamic_shapes=({1: seq}, {1: seq}))
    assert not [n for n in program.graph.nodes if "flat_apply" in str(n.target)]
    program = load_program(save_program(program, tmp_path / "broadcast.pt2"))
    other = (torch.randn(2, 5, 3), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
    assert torch.equal(program.module()(*other), Windowed()(*other))


class _MaskAfterDistillingConv(torch.nn.Module):
    """Informer's pattern: the encoder builds its mask for the input length, a distilling step halves the length,
    and the next layer adds the mask it got to its scores when there is one."""

    def __init__(self):
        super().__init__()
        from transformers import PretrainedConfig

        self.config = PretrainedConfig()
        self.config._attn_implementation = "sdpa"

    def forward(self, embeds):
        from transformers.masking_utils import create_bidirectional_mask

        mask = create_bidirectional_mask(config=self.config, inputs_embeds=embeds, attention_mask=None)
        halved = embeds[:, ::2]
        scores = halved @ halved.transpose(1, 2)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, 0], float("-inf"))
        return scores.softmax(-1) @ halved


def test_an_unpadded_bidirectional_mask_is_skipped_under_export_as_in_eager():
    """Eager builds no mask without a padding mask; torch.export did build one, and the halved layer then fails on
    its size. Patched, the program builds none either and computes eager's numbers at another length."""
    from engine.patches.registry import apply_patches
    from tests.engine.patches.export_checks import assert_exports_and_runs

    module, embeds = _MaskAfterDistillingConv(), torch.randn(2, 8, 4)
    module(embeds)  # eager: no mask, no failure
    with pytest.raises(RuntimeError, match="broadcast"):
        torch.export.export(module, (embeds,), dynamic_shapes=({1: torch.export.Dim.AUTO},))
    with apply_patches("dynamo"):
        program = torch.export.export(module, (embeds,), dynamic_shapes=({1: torch.export.Dim.AUTO},))
    assert not [n for n in program.graph.nodes if "masked_fill" in str(n.target)]
    assert_exports_and_runs(module, {"embeds": embeds}, {"embeds": torch.randn(3, 6, 4)}, "dynamo", tolerance=1e-6)
