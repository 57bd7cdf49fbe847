"""ExecuTorch's dim-order check refuses the remainder of a window-aligned split when the traced length leaves none.

Pattern: `usable = (seq // 4) * 4; kv[:, :usable], kv[:, usable:]` (DeepSeek-V4's compressor keeps the remainder in
its cache buffer: models/deepseek_v4/modeling_deepseek_v4.py:222-223 at transformers 5.24.0), exported with a dynamic
length traced at 8 (remainder 0). The remainder's strides are `(16*Max(1, s - 4*(s//4)), 16, 1)`, never 0, but
`to_executorch`'s spec propagation (exir/tensor.py dim_order_from_stride, `torch._check(s != 0)`) raises; traced at
10 (remainder 2) the same program lowers.
Error: RuntimeError '0 in strides is not supported for ExecuTorch.' in EdgeProgramManager.to_executorch.
Tracker: pytorch/executorch
"""

import sys

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower


class WindowsAndRemainder(torch.nn.Module):
    def forward(self, x):
        usable = (x.shape[1] // 4) * 4
        return x[:, :usable] * 2, x[:, usable:] + 1


dims = ({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},)
ep = torch.export.export(WindowsAndRemainder(), (torch.randn(2, 8, 16),), dynamic_shapes=dims, strict=False)
edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
try:
    edge.to_executorch()
except RuntimeError as e:
    if "0 in strides" not in str(e):
        raise
    print(f"reproduced: RuntimeError: {e}", file=sys.stderr)
    raise SystemExit(10)
print("passes now: the zero-length remainder lowers to a .pte")
