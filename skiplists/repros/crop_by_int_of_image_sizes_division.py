"""torch.export cannot trace Emu3's VQ-VAE crop of each image's code grid to int() of its image_sizes value / factor.

Pattern: `image_tokens = [single_image[: int(size[0] / self.vision_spatial_factor), : int(size[1] /
self.vision_spatial_factor)] for single_image, size in zip(image_tokens, image_sizes)]` (Emu3VQVAE.encode,
modeling_emu3.py:1018-1021 at transformers 5.24.0): `size[0] / factor` is a float tensor, int() of it reads an
unbacked float (zuf0) that the slice bound needs as a concrete int.
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression' (zuf0).
Tracker: huggingface/transformers
"""

import sys

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode


class CropCodeGrids(torch.nn.Module):
    def __init__(self, vision_spatial_factor=4, codebook=16):
        super().__init__()
        self.vision_spatial_factor = vision_spatial_factor
        self.encoder = torch.nn.Conv2d(3, codebook, kernel_size=vision_spatial_factor, stride=vision_spatial_factor)
        self.embed = torch.nn.Embedding(codebook, 8)

    def forward(self, pixel_values, image_sizes):
        image_tokens = self.encoder(pixel_values).argmax(1)  # (batch, h / factor, w / factor) codes
        image_tokens = [
            single_image[: int(size[0] / self.vision_spatial_factor), : int(size[1] / self.vision_spatial_factor)]
            for single_image, size in zip(image_tokens, image_sizes)
        ]
        return self.embed(torch.cat([tokens.flatten() for tokens in image_tokens]))


model = CropCodeGrids()
args = (torch.randn(2, 3, 16, 16), torch.tensor([[16, 16], [16, 16]]))
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
print("passes now: cropping code grids by int(image_sizes / factor) exports and matches eager")
