"""ExecuTorch's edge verifier rejects F.interpolate(mode="bicubic", antialias=True) (aten._upsample_bicubic2d_aa).

Pattern: resize a position-embedding grid with antialiased bicubic interpolation (UnlimitedOcr's vision tower,
modeling_unlimited_ocr.py:617/802); torch.export records aten._upsample_bicubic2d_aa, which is not Core ATen, and
to_edge_transform_and_lower(XnnpackPartitioner) raises SpecViolationError naming it.
Tracker: pytorch/executorch
"""

import sys

import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower


class M(torch.nn.Module):
    def forward(self, pos):
        return F.interpolate(pos, size=(5, 5), mode="bicubic", antialias=True, align_corners=False)


x = torch.randn(1, 8, 12, 12)
try:
    program = torch.export.export(M(), (x,))
    et = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
except Exception as e:  # noqa: BLE001
    if type(e).__name__ == "SpecViolationError" and "_upsample_bicubic2d_aa" in str(e):
        line = next(ln for ln in str(e).splitlines() if "_upsample_bicubic2d_aa" in ln)
        print(f"REPRODUCES: {type(e).__name__}: {line.strip()[:160]}", file=sys.stderr)
        raise SystemExit(10)
    raise

from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer  # noqa: E402

out = _load_for_executorch_from_buffer(et.buffer).forward((x,))[0]
torch.testing.assert_close(out, M()(x), atol=1e-4, rtol=1e-4)
print("PASSES: antialiased bicubic interpolate lowers and matches eager", file=sys.stderr)
