"""torch.export cannot trace ViLT's position-embedding interpolation to patch sizes summed from pixel_mask.

Pattern: ViltEmbeddings.visual_embed (modeling_vilt.py:98-109) takes `x_h = x_mask[:, 0].sum(dim=1)[:, 0]` (and x_w)
and does `F.interpolate(spatial_pos, size=(h, w), mode="bilinear", align_corners=True) for h, w in zip(x_h, x_w)`:
the output size is an unbacked tensor value, and the bilinear decomposition's `_compute_scale` guards `out_size > 1`.
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression' (u0 > 1).
Tracker: huggingface/transformers
"""

import sys

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode


class InterpolateToMaskSums(torch.nn.Module):
    def __init__(self, patch_size=4, hidden=8, patch_dim=4):
        super().__init__()
        self.patch_dim = patch_dim
        self.projection = torch.nn.Conv2d(3, hidden, kernel_size=patch_size, stride=patch_size)
        self.position_embeddings = torch.nn.Parameter(torch.randn(1, patch_dim * patch_dim + 1, hidden))

    def forward(self, pixel_values, pixel_mask):
        x = self.projection(pixel_values)
        x_mask = pixel_mask[:, None, :, :].float()
        x_mask = F.interpolate(x_mask, size=(x.shape[2], x.shape[3])).long()
        x_h = x_mask[:, 0].sum(dim=1)[:, 0]
        x_w = x_mask[:, 0].sum(dim=2)[:, 0]
        batch_size, num_channels, height, width = x.shape
        spatial_pos = self.position_embeddings[:, 1:, :].transpose(1, 2).view(1, num_channels, self.patch_dim,
                                                                             self.patch_dim)
        pos_embed = torch.cat(
            [
                F.pad(F.interpolate(spatial_pos, size=(h, w), mode="bilinear", align_corners=True),
                      (0, width - w, 0, height - h))
                for h, w in zip(x_h, x_w)
            ],
            dim=0,
        )
        return x + pos_embed


model = InterpolateToMaskSums()
pixel_mask = torch.ones(2, 24, 24, dtype=torch.long)
pixel_mask[1, 16:, :] = 0  # the second image is 16 x 24 pixels of the padded 24 x 24
args = (torch.randn(2, 3, 24, 24), pixel_mask)
try:
    ep = torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim.AUTO}, {0: torch.export.Dim.AUTO}),
                             strict=False)
except GuardOnDataDependentSymNode as e:
    if "data-dependent expression" not in str(e):
        raise
    # stderr, after torch's own log of the failing graph: the summary is the last line printed
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: interpolation to sizes summed from pixel_mask exports and matches eager")
