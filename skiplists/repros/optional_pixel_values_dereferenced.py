"""TvpModel.forward declares pixel_values optional but dereferences it unconditionally.

Pattern: TvpModel(...)(input_ids=..., attention_mask=...) with pixel_values left at its default None; the visual
prompter runs first and reads pixel_values.dtype (TvpFramePadPrompter.forward, modeling_tvp.py:659, called from :736):
AttributeError "'NoneType' object has no attribute 'dtype'".
Tracker: huggingface/transformers
"""

import inspect
import sys

import torch
from transformers import TvpConfig, TvpModel

assert inspect.signature(TvpModel.forward).parameters["pixel_values"].default is None  # declared optional
with torch.device("meta"):  # no weights or data: the failure comes before any computation
    model = TvpModel(TvpConfig()).eval()
    input_ids = torch.ones(1, 8, dtype=torch.long)
    try:
        model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    except AttributeError as e:
        if "'NoneType' object has no attribute 'dtype'" in str(e):
            print(f"REPRODUCES: TvpModel.forward without pixel_values raises AttributeError: {e}", file=sys.stderr)
            raise SystemExit(10)
        raise
print("PASSES: TvpModel runs a text-only forward", file=sys.stderr)
