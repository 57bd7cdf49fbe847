"""PPOCRV6SmallDetModel's default config is inconsistent: the backbone gives one 384-channel map, the neck wants four.

Pattern: PPOCRV6SmallDetModel(PPOCRV6SmallDetConfig()) builds, but backbone_config.out_features is ['stage4'] while
the neck's insert convs expect layer_list_out_channels (12, 18, 42, 360) (modeling_pp_ocrv6_small_det.py:234-252),
so the first forward fails: RuntimeError 'expected input[...] to have 12 channels, but got 384 channels instead'.
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import PPOCRV6SmallDetConfig, PPOCRV6SmallDetModel

config = PPOCRV6SmallDetConfig()
torch.manual_seed(0)
model = PPOCRV6SmallDetModel(config).eval()
try:
    with torch.no_grad():
        model(pixel_values=torch.randn(1, 3, 64, 64))
except RuntimeError as e:
    if "to have 12 channels, but got 384 channels" in str(e):
        print(f"REPRODUCES: out_features={config.backbone_config.out_features}, neck in-channels "
              f"{tuple(config.layer_list_out_channels)}: RuntimeError: {e}", file=sys.stderr)
        raise SystemExit(10)
    raise
print("PASSES: the default PPOCRV6SmallDetConfig model runs a forward", file=sys.stderr)
