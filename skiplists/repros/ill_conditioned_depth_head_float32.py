"""A tiny random DepthPro's float32 depth is further from its float64 run than the sweep's tolerance allows.

Pattern: DepthProForDepthEstimation (modeling_depth_pro.py at transformers 5.24.0) with random weights at tiny widths
predicts depths in the hundreds; its float32 forward already differs from the same model run in float64 by more than
atol = rtol = 1e-4, the tolerance the sweep compares a backend with eager at. A backend's result is then judged
against eager's rounding, not against what the export computes (onnxruntime and XNNPACK are as far from float64 as
eager is). Not a bug of any project: an ill-conditioned sample, which the zoo's well_conditioned check flags.
Shown: how far float32 eager is from float64, against that tolerance.
"""

import copy
import sys

import torch
from transformers import DepthProConfig, DepthProForDepthEstimation

tower = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=56, patch_size=14,
             layer_norm_eps=1e-06, use_mask_token=True, reshape_hidden_states=True, out_indices=[2],
             stage_names=["stem", "stage1", "stage2"], out_features=["stage2"], model_type="dinov2")
config = DepthProConfig(
    fusion_hidden_size=32, patch_size=56, intermediate_hook_ids=[1, 1], intermediate_feature_dims=[16, 16],
    scaled_images_ratios=[0.25, 0.5, 1], scaled_images_overlap_ratios=[0.0, 0.5, 0.25],
    scaled_images_feature_dims=[32, 32, 16], merge_padding_value=3, use_fov_model=False,
    image_model_config=tower, patch_model_config=tower, fov_model_config=tower)
torch.manual_seed(0)
model = DepthProForDepthEstimation(config).eval()
pixel_values = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    single = model(pixel_values).predicted_depth
    double = copy.deepcopy(model).double()(pixel_values.double()).predicted_depth
error = (single.double() - double).abs()
allowed = 1e-4 + 1e-4 * double.abs()
outside = int((error > allowed).sum())
if outside:
    print(f"reproduced: float32 eager is {float(error.max()):.3g} from float64 (|depth| up to "
          f"{float(double.abs().max()):.0f}); {outside} of {error.numel()} elements outside atol = rtol = 1e-4",
          file=sys.stderr)
    raise SystemExit(10)
print(f"passes now: float32 eager is within 1e-4 of float64 (max {float(error.max()):.3g})", file=sys.stderr)
