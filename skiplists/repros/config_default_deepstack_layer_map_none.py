"""Granite4VisionModel cannot be built from its default config: deepstack_layer_map defaults to None.

Pattern: Granite4VisionModel(Granite4VisionConfig()); __init__ builds one window-QFormer downsampler per entry of
config.deepstack_layer_map (modeling_granite4_vision.py:767, `range(len(config.deepstack_layer_map))`), whose default
is None: TypeError "object of type 'NoneType' has no len()".
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import Granite4VisionConfig, Granite4VisionModel

config = Granite4VisionConfig()
try:
    with torch.device("meta"):  # no weights: only the construction is tested
        Granite4VisionModel(config)
except TypeError as e:
    if "has no len()" in str(e) and config.deepstack_layer_map is None:
        print(f"REPRODUCES: Granite4VisionModel(Granite4VisionConfig()) raises TypeError: {e}", file=sys.stderr)
        raise SystemExit(10)
    raise
print("PASSES: the default Granite4VisionConfig builds a model", file=sys.stderr)
