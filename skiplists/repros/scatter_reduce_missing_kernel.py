"""ExecuTorch's portable runtime has no kernel for aten::scatter_reduce.two_out, so loading the program fails.

Pattern: a segment mean with Tensor.scatter_reduce(reduce="mean") (Tapas' _segment_reduce, modeling_tapas.py:1416-1443);
the op stays outside the XNNPACK delegate, to_executorch() succeeds, and load_method fails with 0x14
(OperatorMissing: "Missing operator: ... aten::scatter_reduce.two_out").
Tracker: pytorch/executorch
"""

import sys

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer


class M(torch.nn.Module):
    def forward(self, values, segments):
        out = torch.zeros(4, values.shape[1])
        index = segments.unsqueeze(1).expand_as(values)
        return out.scatter_reduce(0, index, values, reduce="mean", include_self=False)


values, segments = torch.randn(6, 3), torch.tensor([0, 0, 1, 2, 2, 3])
program = torch.export.export(M(), (values, segments))
et = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
try:
    out = _load_for_executorch_from_buffer(et.buffer).forward((values, segments))[0]
except RuntimeError as e:
    msg = str(e)
    ops = {f"{op.name}.{op.overload}" for op in et.executorch_program.execution_plan[0].operators}
    if "0x14" in msg and "aten::scatter_reduce.two_out" in ops:
        print(f"REPRODUCES: {type(e).__name__} loading the program (aten::scatter_reduce.two_out has no kernel): "
              f"{msg.strip()[:160]}", file=sys.stderr)
        raise SystemExit(10)
    raise
torch.testing.assert_close(out, M()(values, segments))
print("PASSES: scatter_reduce runs in ExecuTorch and matches eager", file=sys.stderr)
