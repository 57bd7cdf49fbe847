"""torch.export pins TimesFM's batch to the traced size: the forecast iterates over the series in a Python list.

Pattern: `inputs = [ts[-fcontext_len:] for ts in past_values]`, then
`inp_min = torch.min(torch.stack([torch.min(ts) for ts in inputs]))` (TimesFmModelForPrediction.forward,
modeling_timesfm.py:701-702, timesfm2_5/modeling_timesfm2_5.py:755 at transformers 5.24.0; the entry cites 702/754):
iterating unbinds dim 0, so a Dim.AUTO batch is specialised to 2 and the exported program refuses batch 3.
Error: the program exported at batch 2 raises AssertionError 'Guard failed: past_values.size()[0] == 2' on batch 3.
Tracker: huggingface/transformers
"""

import sys

import torch

CONTEXT_LEN = 8


class ForecastOverSeries(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(CONTEXT_LEN, 4)

    def forward(self, past_values):
        inputs = [ts[-CONTEXT_LEN:] for ts in past_values]
        inp_min = torch.min(torch.stack([torch.min(ts) for ts in inputs]))
        return self.proj(torch.stack(inputs) - inp_min)


model = ForecastOverSeries()
ep = torch.export.export(model, (torch.randn(2, 12),),
                         dynamic_shapes=({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},), strict=False)
second = (torch.randn(3, 10),)
try:
    out = ep.module()(*second)
except AssertionError as e:  # the program's guard on the specialised batch
    if "past_values.size()[0] == 2" not in str(e):
        raise
    print(f"reproduced: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(out, model(*second))
print("passes now: the batch stays symbolic and the program matches eager at batch 3")
