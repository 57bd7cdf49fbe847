"""torch.export cannot trace Ernie4.5-VL-MoE's temporal slicing, a Python range() over values of the grid_thw input.

Pattern: Ernie4_5_VLMoe's _temporal_slicing (modeling_ernie4_5_vl_moe.py:1017-1036 at transformers 5.24.0; the entry
cites 1017-1030) loops `for temporal_size, spatial_size, batch_offset in zip(grid_t, grid_hw_after_conv,
batch_offsets):` with `first_offset_range = range(0, temporal_size, 2)` and
`torch.arange(batch_offset + t * spatial_size, batch_offset + (t + 1) * spatial_size)` per image: range() needs a
concrete int from a tensor value.
Error: GuardOnDataDependentSymNode 'Could not extract specialized integer from data-dependent expression u0'.
Tracker: huggingface/transformers
"""

import sys

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode


class TemporalSlicing(torch.nn.Module):
    spatial_merge_size = 2

    def forward(self, hidden_states, grid_thw):
        grid_t, grid_hw = grid_thw[:, 0], grid_thw[:, 1:]
        grid_hw_after_conv = grid_hw.prod(-1) // (self.spatial_merge_size**2)
        tokens_per_img_or_vid = (grid_thw.prod(-1) // (self.spatial_merge_size**2)).flatten()
        batch_offsets = torch.empty(tokens_per_img_or_vid.size(), dtype=tokens_per_img_or_vid.dtype)
        batch_offsets[0] = 0
        batch_offsets[1:] = tokens_per_img_or_vid.cumsum(dim=0)[:-1]
        first_slice_offsets, second_slice_offsets = [], []
        for temporal_size, spatial_size, batch_offset in zip(grid_t, grid_hw_after_conv, batch_offsets):
            first_offset_range = range(0, temporal_size, 2)
            second_offset_range = range(1 if temporal_size > 1 else 0, temporal_size, 2)
            for even, odd in zip(first_offset_range, second_offset_range):
                first_slice_offsets.append(torch.arange(batch_offset + even * spatial_size,
                                                        batch_offset + (even + 1) * spatial_size))
                second_slice_offsets.append(torch.arange(batch_offset + odd * spatial_size,
                                                         batch_offset + (odd + 1) * spatial_size))
        first = torch.cat(first_slice_offsets, dim=-1)
        second = torch.cat(second_slice_offsets, dim=-1)
        return torch.concat([torch.index_select(hidden_states, 0, first),
                             torch.index_select(hidden_states, 0, second)], dim=-1)


model = TemporalSlicing().eval()
grid_thw = torch.tensor([[1, 4, 4], [2, 4, 4]])  # an image and a two-frame video: 4 + 8 merged tokens
args = (torch.randn(12, 8), grid_thw)
try:
    ep = torch.export.export(model, args, strict=False)
except GuardOnDataDependentSymNode as e:
    if "data-dependent expression" not in str(e):
        raise
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: the per-image range() over grid_thw values exports and matches eager")
