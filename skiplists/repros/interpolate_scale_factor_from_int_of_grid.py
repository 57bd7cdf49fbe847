"""torch.export cannot trace HYV4VL's position-grid interpolation whose scale_factor is int() of a grid_thw value.

Pattern: HYV4VLVisionPatchEmbed iterates `for t, h, w in grid_thw` and interpolate_pos_encoding calls
`F.interpolate(pos, scale_factor=((int(height) + 0.1) / edge, (int(width) + 0.1) / edge), mode="bilinear")`
(modeling_hy_v4_vl.py:798-805): int() of a tensor element is an unbacked u0 and a float scale factor needs a number.
Error: GuardOnDataDependentSymNode 'Could not extract specialized integer from data-dependent expression u0'.
Tracker: huggingface/transformers
"""

import sys

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode


class ScaleFactorPositionGrid(torch.nn.Module):
    def __init__(self, edge=4, hidden=8):
        super().__init__()
        self.position_edge, self.embed_dim = edge, hidden
        self.position_embedding = torch.nn.Embedding(edge * edge + 1, hidden)

    def interpolate_pos_encoding(self, height, width):
        patch_pos_embed = self.position_embedding.weight[1:, :].reshape(1, self.position_edge, self.position_edge,
                                                                       self.embed_dim)
        patch_pos_embed = patch_pos_embed.permute(0, 3, 1, 2).float()
        scale_h = (int(height) + 0.1) / self.position_edge
        scale_w = (int(width) + 0.1) / self.position_edge
        patch_pos_embed = F.interpolate(patch_pos_embed, scale_factor=(scale_h, scale_w), mode="bilinear",
                                        align_corners=False)
        return patch_pos_embed.permute(0, 2, 3, 1).reshape(1, -1, self.embed_dim)

    def forward(self, embeddings, grid_thw):
        position_embeddings = torch.concat(
            [self.interpolate_pos_encoding(h, w).squeeze(0).repeat(t, 1) for t, h, w in grid_thw], dim=0)
        return embeddings + position_embeddings


model = ScaleFactorPositionGrid()
args = (torch.randn(48, 8), torch.tensor([[1, 4, 6], [1, 6, 4]]))
try:
    ep = torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim.AUTO}, {0: torch.export.Dim.AUTO}),
                             strict=False)
except GuardOnDataDependentSymNode as e:
    if "Could not extract specialized integer" not in str(e):
        raise
    # stderr, after torch's own log of the failing graph: the summary is the last line printed
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: interpolation by a scale factor from int() of grid_thw exports and matches eager")
