"""torch.export cannot trace UDOP's in-place mask write indexed by tuples of 0-d tensors (zip(*ind)).

Pattern: combine_image_text_embeddings builds `ind` (batch, token -> patch) pairs, then `rows, cols = zip(*ind)` and
`patch_inds[rows, cols] = False` (modeling_udop.py:219-220): the tuples of 0-d tensors are turned into index tensors
by reading their data, which a fake tensor under export tracing does not have.
Error: RuntimeError 'The tensor has a non-zero number of elements, but its data is not allocated yet'.
Tracker: huggingface/transformers
"""

import sys

import torch

NUM_PATCHES = 4  # patches per side


class PatchMaskFromTokenBoxes(torch.nn.Module):
    def forward(self, image_embeddings, bbox):
        sequence_length = NUM_PATCHES
        ocr_points_x = torch.clip(torch.floor((bbox[:, :, 0] + bbox[:, :, 2]) / 2.0 * sequence_length).long(),
                                  0, sequence_length - 1)
        ocr_points_y = torch.clip(torch.floor((bbox[:, :, 1] + bbox[:, :, 3]) / 2.0 * sequence_length).long(),
                                  0, sequence_length - 1) * sequence_length
        ocr_points = ocr_points_x + ocr_points_y
        patch_inds = torch.full_like(image_embeddings[:, :, 0], True).bool()
        ind = torch.cat(
            [
                torch.arange(len(ocr_points))[:, None].repeat(1, ocr_points.size(-1))[:, :, None].to(ocr_points),
                ocr_points[:, :, None],
            ],
            dim=-1,
        )
        ind = ind.flatten(0, 1)
        rows, cols = zip(*ind)
        patch_inds[rows, cols] = False
        return image_embeddings * patch_inds[:, :, None]


model = PatchMaskFromTokenBoxes()
args = (torch.randn(2, NUM_PATCHES * NUM_PATCHES, 8), torch.rand(2, 3, 4))
try:
    ep = torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim.AUTO}, {0: torch.export.Dim.AUTO,
                                                                                      1: torch.export.Dim.AUTO}),
                             strict=False)
except RuntimeError as e:
    if "data is not allocated yet" not in str(e):
        raise
    # stderr, after torch's own log of the failing graph: the summary is the last line printed
    print(f"reproduced: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: the in-place write indexed by zip(*ind) exports and matches eager")
