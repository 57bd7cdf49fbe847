"""torch.export pins PixtralVisionModel's image batch to the traced size: without image_sizes it loops over a list.

Pattern: `image_sizes = [(height, width)] * batch_size`, then
`[embed[..., : size[0] // patch, : size[1] // patch] for embed, size in zip(patch_embeds, image_sizes)]`
(PixtralVisionModel.forward, modeling_pixtral.py:412-419 at transformers 5.24.0; the entry cites 413-420): a list as
long as the batch, so a Dim.AUTO batch is specialised to 2 and the program refuses 3 images.
Error: the program exported at batch 2 raises AssertionError 'Guard failed: pixel_values.size()[0] == 2' on batch 3.
Tracker: huggingface/transformers
"""

import sys

import torch


class UniformImageSizes(torch.nn.Module):
    def __init__(self, patch_size=4, hidden=8):
        super().__init__()
        self.patch_size = patch_size
        self.patch_conv = torch.nn.Conv2d(3, hidden, kernel_size=patch_size, stride=patch_size, bias=False)

    def forward(self, pixel_values):
        batch_size, _, height, width = pixel_values.shape
        image_sizes = [(height, width)] * batch_size
        patch_embeds = self.patch_conv(pixel_values)
        patch_embeds_list = [
            embed[..., : (size[0] // self.patch_size), : (size[1] // self.patch_size)]
            for embed, size in zip(patch_embeds, image_sizes)
        ]
        return torch.cat([p.flatten(1).T for p in patch_embeds_list], dim=0).unsqueeze(0)


model = UniformImageSizes()
ep = torch.export.export(model, (torch.randn(2, 3, 16, 16),),
                         dynamic_shapes=({0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO,
                                          3: torch.export.Dim.AUTO},), strict=False)
second = (torch.randn(3, 3, 16, 16),)
try:
    out = ep.module()(*second)
except AssertionError as e:  # the program's guard on the specialised batch
    if "pixel_values.size()[0] == 2" not in str(e):
        raise
    print(f"reproduced: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(out, model(*second))
print("passes now: the image batch stays symbolic and the program matches eager at 3 images")
