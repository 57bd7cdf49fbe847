"""ExecuTorch's edge verifier rejects torch.bincount (aten.bincount is not Core ATen).

Pattern: a forward that counts ids with torch.bincount (SplinterForPreTraining's
num_questions = torch.bincount(rows), modeling_splinter.py:722), exported with torch.export and lowered with
to_edge_transform_and_lower(XnnpackPartitioner). The edge verifier raises SpecViolationError naming aten.bincount.
Tracker: pytorch/executorch
"""

import sys

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower


class M(torch.nn.Module):
    def forward(self, rows):
        return torch.bincount(rows, minlength=4) * 2


x = torch.tensor([0, 0, 1, 3, 3, 3])
try:
    program = torch.export.export(M(), (x,))
    et = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
except Exception as e:  # noqa: BLE001
    msg = f"{type(e).__name__}: {e}"
    if type(e).__name__ == "SpecViolationError" and "bincount" in msg:
        line = next(ln for ln in str(e).splitlines() if "bincount" in ln)
        print(f"REPRODUCES: {type(e).__name__}: {line.strip()[:160]}", file=sys.stderr)
        raise SystemExit(10)
    raise

from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer  # noqa: E402

out = _load_for_executorch_from_buffer(et.buffer).forward((x,))[0]
assert torch.equal(out, M()(x)), (out, M()(x))
print("PASSES: bincount lowers and matches eager", file=sys.stderr)
