"""torch.export pins Step3p7's image batch to the traced size: get_image_features merges images via a Python list.

Pattern: `if num_local_patches is None: num_local_patches = [0] * image_features.shape[0]`, then
`for i, num_patch in enumerate(num_local_patches): ... cur_feature.append(image_features[i].view(-1,
image_features.shape[-1]))` (Step3p7Model.get_image_features, modeling_step3p7.py:976-988 at transformers 5.24.0),
and the caller's `torch.cat(image_features, dim=0)` (:1056): a list as long as the image batch, so a Dim.AUTO
pixel_values batch is specialised to 2 and the program refuses 3 images.
Error: the program exported at batch 2 raises AssertionError 'Guard failed: pixel_values.size()[0] == 2' on batch 3.
Tracker: huggingface/transformers
"""

import sys

import torch


class MergeImageFeatures(torch.nn.Module):
    def __init__(self, patch_size=4, hidden=8):
        super().__init__()
        self.vision_model = torch.nn.Conv2d(3, hidden, kernel_size=patch_size, stride=patch_size)
        self.multi_modal_projector = torch.nn.Linear(hidden, hidden)

    def forward(self, pixel_values, pixel_values_local=None, num_local_patches=None):
        image_features = self.multi_modal_projector(self.vision_model(pixel_values).flatten(2).transpose(1, 2))
        patch_image_features = None
        if pixel_values_local is not None:
            patch_image_features = self.multi_modal_projector(
                self.vision_model(pixel_values_local).flatten(2).transpose(1, 2))
        if num_local_patches is None:
            num_local_patches = [0] * image_features.shape[0]
        merged = []
        cur_patch_idx = 0
        for i, num_patch in enumerate(num_local_patches):
            cur_feature = []
            if num_patch > 0:
                patch_slice = patch_image_features[cur_patch_idx : cur_patch_idx + num_patch]
                cur_feature.append(patch_slice.view(-1, patch_slice.shape[-1]))
            cur_feature.append(image_features[i].view(-1, image_features.shape[-1]))
            cur_patch_idx += num_patch
            merged.append(torch.cat(cur_feature) if len(cur_feature) > 1 else cur_feature[0])
        return torch.cat(merged, dim=0)  # Step3p7Model.forward, modeling_step3p7.py:1056


model = MergeImageFeatures()
ep = torch.export.export(model, (torch.randn(2, 3, 16, 16),), dynamic_shapes=({0: torch.export.Dim.AUTO},),
                         strict=False)
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
