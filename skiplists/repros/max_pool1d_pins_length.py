"""torch.export pins the length of a ``max_pool1d`` input: the C++ op computes its output size from concrete sizes.

Pattern: ``nn.MaxPool1d(kernel_size=4, stride=4)`` over a dynamic length (Canine's attention-mask downsampling,
models/canine/modeling_canine.py ``_downsample_attention_mask``). Tracing records ``Eq(seq, 8)``, so the exported
program takes only the traced length; ``max_pool2d`` over a height of 1 keeps it symbolic
(engine.patches.torch_export._patch_max_pool1d_as_max_pool2d).
Error: the program exported at length 8 raises AssertionError 'Guard failed: x.size()[1] == 8' at length 12.
Tracker: pytorch/pytorch
"""

import sys

import torch


class PoolMask(torch.nn.Module):
    def forward(self, x):
        return torch.nn.MaxPool1d(kernel_size=4, stride=4)(x[:, None]).squeeze(1)


model = PoolMask()
ep = torch.export.export(model, (torch.randn(2, 8),),
                         dynamic_shapes=({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},), strict=False)
second = (torch.randn(3, 12),)
try:
    out = ep.module()(*second)
except AssertionError as e:  # the length was specialised to the traced 8
    if "== 8" not in str(e):
        raise
    print(f"reproduced: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(out, model(*second))
print("passes now: max_pool1d keeps the length symbolic, and the program matches eager at length 12")
