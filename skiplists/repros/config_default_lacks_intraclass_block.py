"""PPOCRV6MediumDetModel cannot be built from its default config: intraclass_block_config defaults to None.

Pattern: PPOCRV6MediumDetModel(PPOCRV6MediumDetConfig()); PPOCRV6MediumDetIntraclassBlock indexes
config.intraclass_block_config['reduce_channel'] (modeling_pp_ocrv6_medium_det.py:140) while the config defaults it
to None (configuration_pp_ocrv6_medium_det.py:73): TypeError "'NoneType' object is not subscriptable".
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import PPOCRV6MediumDetConfig, PPOCRV6MediumDetModel

config = PPOCRV6MediumDetConfig()
try:
    with torch.device("meta"):  # no weights: only the construction is tested
        PPOCRV6MediumDetModel(config)
except TypeError as e:
    if "not subscriptable" in str(e) and config.intraclass_block_config is None:
        print(f"REPRODUCES: PPOCRV6MediumDetModel(PPOCRV6MediumDetConfig()) raises TypeError: {e}", file=sys.stderr)
        raise SystemExit(10)
    raise
print("PASSES: the default PPOCRV6MediumDetConfig builds a model", file=sys.stderr)
