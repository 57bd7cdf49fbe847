"""torch.export specialises a size derived from a dynamic dim when the sample makes it 2, so inputs that make it 1
are refused: Canine's molecule count, ``chars // downsampling_rate``.

Pattern: a tensor whose dim is ``seq // 4`` (Canine pools characters into molecules of 4: the pooled attention mask
and the strided convolution, models/canine/modeling_canine.py). The layout probes treat a size of 1 apart, so
tracing at 8 characters (2 molecules) records ``seq // 4 != 1`` (here folded into ``seq >= 8``), also under
``backed_size_oblivious`` (it covers input sizes, not sizes derived from them), and the program refuses 4 to 7
characters, which eager runs.
Error: the program exported at length 8 raises AssertionError 'Guard failed: x.size()[1] >= 8' at length 6.
Tracker: pytorch/pytorch
"""

import sys

import torch


class PoolByFour(torch.nn.Module):
    def forward(self, x):
        windows = torch.arange(x.shape[1] // 4)[:, None] * 4 + torch.arange(4)  # [seq // 4, 4]
        return x[:, windows].amax(-1)


model = PoolByFour()
ep = torch.export.export(model, (torch.randn(2, 8),),
                         dynamic_shapes=({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},), strict=False)
second = (torch.randn(3, 6),)
try:
    out = ep.module()(*second)
except AssertionError as e:  # the program's guard on the derived size
    if "x.size()[1] >= 8" not in str(e):
        raise
    print(f"reproduced: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(out, model(*second))
print("passes now: a derived size of 1 is not specialised, and the program matches eager at length 6")
