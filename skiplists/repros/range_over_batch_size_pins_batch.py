"""torch.export pins UnlimitedOcr's image batch to the traced size: get_image_features loops over range(batch_size).

Pattern: `batch_size = pixel_values.shape[0]`, `per_image_local = [None] * batch_size`, then
`for idx in range(batch_size): global_grid = global_features[idx].reshape(...); ...
all_features.append(torch.cat([global_flat, view_separator], dim=0))` (UnlimitedOcrModel.get_image_features,
modeling_unlimited_ocr.py:1840-1883 at transformers 5.24.0; the entry cites :1865; DeepseekOcr2's
modeling_deepseek_ocr2.py:1430 is the same loop): range() of a Dim.AUTO batch specialises it to 2, so the program
refuses 3 images.
Error: the program exported at batch 2 raises AssertionError 'Guard failed: pixel_values.size()[0] == 2' on batch 3.
Tracker: huggingface/transformers
"""

import sys

import torch


class PerImageFeatures(torch.nn.Module):
    def __init__(self, hidden=8, grid=2):
        super().__init__()
        self.grid = grid
        self.proj = torch.nn.Linear(hidden, hidden)
        self.image_newline = torch.nn.Parameter(torch.randn(hidden))
        self.view_separator = torch.nn.Parameter(torch.randn(hidden))

    def forward(self, pixel_values):  # (images, grid*grid, hidden) stands in for the vision tower's patches
        batch_size = pixel_values.shape[0]
        global_features = self.proj(pixel_values)
        hidden_size = global_features.shape[-1]
        newline = self.image_newline[None, None, :]
        view_separator = self.view_separator.unsqueeze(0)
        all_features = []
        for idx in range(batch_size):
            global_grid = global_features[idx].reshape(self.grid, self.grid, hidden_size)
            global_grid = torch.cat([global_grid, newline.expand(self.grid, 1, hidden_size)], dim=1)
            all_features.append(torch.cat([global_grid.reshape(-1, hidden_size), view_separator], dim=0))
        return torch.cat(all_features, dim=0)


model = PerImageFeatures().eval()
ep = torch.export.export(model, (torch.randn(2, 4, 8),), dynamic_shapes=({0: torch.export.Dim.AUTO},), strict=False)
second = (torch.randn(3, 4, 8),)
try:
    out = ep.module()(*second)
except AssertionError as e:  # the program's guard on the specialised batch
    if "pixel_values.size()[0] == 2" not in str(e):
        raise
    print(f"reproduced: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(out, model(*second))
print("passes now: the image batch stays symbolic and the program matches eager at 3 images")
