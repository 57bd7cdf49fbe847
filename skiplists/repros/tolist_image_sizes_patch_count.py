"""torch.export cannot trace LLaVA-NeXT's anyres patch count computed from image_sizes.tolist() (data-dependent guard).

Pattern: get_image_features -> image_size_to_num_patches does `image_size = image_size.tolist()` on the image_sizes
input (modeling_llava_next.py:101), then select_best_resolution compares
`scale = min(width / original_width, height / original_height)` (image_processing_utils.py:665) on unbacked floats.
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression'
(IntTrueDiv(56, u0)) < (IntTrueDiv(112, u1)).
Tracker: huggingface/transformers
"""

import sys

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

GRID_PINPOINTS = [[56, 112], [112, 56], [112, 112]]
PATCH = 56


def select_best_resolution(original_size, possible_resolutions):  # image_processing_utils.py:642-677
    original_height, original_width = original_size
    best_fit, max_effective, min_wasted = None, 0, float("inf")
    for height, width in possible_resolutions:
        scale = min(width / original_width, height / original_height)
        downscaled_width, downscaled_height = int(original_width * scale), int(original_height * scale)
        effective = min(downscaled_width * downscaled_height, original_width * original_height)
        wasted = (width * height) - effective
        if effective > max_effective or (effective == max_effective and wasted < min_wasted):
            max_effective, min_wasted, best_fit = effective, wasted, (height, width)
    return best_fit


def image_size_to_num_patches(image_size, grid_pinpoints, patch_size):  # modeling_llava_next.py:78-111
    image_size = image_size.tolist()
    height, width = select_best_resolution(image_size, grid_pinpoints)
    return (height // patch_size) * (width // patch_size) + 1


class AnyresPatchCount(torch.nn.Module):
    def forward(self, pixel_values, image_sizes):
        num_patches = [image_size_to_num_patches(s, GRID_PINPOINTS, PATCH) for s in image_sizes]
        # split the stacked patches per image by its patch count, as get_image_features does
        return torch.cat([pixel_values[i, :n] for i, n in enumerate(num_patches)]).sum(dim=(1, 2, 3))


pixel_values = torch.randn(2, 5, 3, 8, 8)
image_sizes = torch.tensor([[40, 90], [100, 50]])
args = (pixel_values, image_sizes)
try:
    ep = torch.export.export(AnyresPatchCount(), args,
                             dynamic_shapes=({0: torch.export.Dim.AUTO}, {0: torch.export.Dim.AUTO}), strict=False)
except GuardOnDataDependentSymNode as e:
    if "Could not guard on data-dependent expression" not in str(e):
        raise
    # stderr, after torch's own log of the failing graph: the summary is the last line printed
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), AnyresPatchCount()(*args))
print("passes now: the anyres patch count from image_sizes.tolist() exports and matches eager")
