"""torch.export cannot trace HunYuanVL's placeholder-count check, a Python `!=` of two data-dependent counts.

Pattern: get_placeholder_mask checks `if image_features is not None and inputs_embeds[special_image_mask].numel()
!= image_features.numel(): raise ValueError` (modeling_hunyuan_vl.py:1029 at transformers 5.24.0; the entry cites
:1006): the boolean-mask selection has an unbacked size, and the image features are split by
`(merged_h * (merged_w + 1) + 2).tolist()` from image_grid_thw (get_image_features, :1005), so both sides are data.
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression' (Ne(u.., 8*u.. + 8*u..)).
Tracker: huggingface/transformers
"""

import sys

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

IMAGE_TOKEN_ID, SPATIAL_MERGE_SIZE = 3, 2


class PlaceholderCountCheck(torch.nn.Module):
    def __init__(self, vocab=16, hidden=8):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, hidden)

    def forward(self, input_ids, pooler_output, image_grid_thw):
        inputs_embeds = self.embed_tokens(input_ids)
        # get_image_features: one split per image, sized from the grid (row separators and boundary tokens included)
        merged_h, merged_w = (image_grid_thw[:, 1:] // SPATIAL_MERGE_SIZE).unbind(-1)
        split_sizes = (merged_h * (merged_w + 1) + 2).tolist()
        image_features = torch.cat(torch.split(pooler_output, split_sizes), dim=0)
        # get_placeholder_mask
        special_image_mask = input_ids == IMAGE_TOKEN_ID
        n_image_tokens = special_image_mask.sum()
        special_image_mask = special_image_mask.unsqueeze(-1).expand_as(inputs_embeds)
        if image_features is not None and inputs_embeds[special_image_mask].numel() != image_features.numel():
            raise ValueError(f"Image features and image tokens do not match: tokens: {n_image_tokens}, "
                             f"features {image_features.shape[0]}")
        return inputs_embeds.masked_scatter(special_image_mask, image_features)


model = PlaceholderCountCheck()
image_grid_thw = torch.tensor([[1, 4, 4], [1, 2, 4]])  # 2 * 3 + 2 = 8 and 1 * 3 + 2 = 5 features
input_ids = torch.tensor([[1] + [IMAGE_TOKEN_ID] * 8 + [2, 4], [IMAGE_TOKEN_ID] * 5 + [5] * 6])
args = (input_ids, torch.randn(13, 8), image_grid_thw)
try:
    ep = torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},
                                                          {0: torch.export.Dim.AUTO}, {0: torch.export.Dim.AUTO}),
                             strict=False)
except GuardOnDataDependentSymNode as e:
    if "data-dependent expression" not in str(e):
        raise
    # stderr, after torch's own log of the failing graph: the summary is the last line printed
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: the placeholder-count check exports and matches eager")
