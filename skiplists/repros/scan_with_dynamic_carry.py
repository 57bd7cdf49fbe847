"""ExecuTorch runs a ``scan`` only while its carry keeps the traced shape: a carry with a dynamic dim fails at run
time in the emitted ``aten::copy_`` of the initial carry (0x12).

Pattern: a recurrence over the sequence run as ``torch._higher_order_ops.scan`` carrying a ``[batch, hidden]`` state
with a dynamic batch (RWKV's WKV loop, xLSTM's mLSTM kernel, RecurrentGemma's RG-LRU as the engine scans them:
engine.patches.model.sequence_scans). ExecuTorch 1.5.1's emitter (``_emit_scan``) copies the initial carry into the
carry buffer with ``aten::copy_``, which broadcasts the source to the buffer without resizing it, so a batch other
than the buffer's planned one fails ("Check failed (tensor_is_broadcastable_to(src, in))"). A static batch runs.
Error: the .pte of a scan with a dynamic batch fails with 0x12 at batch 3 (op_copy.cpp: tensor_is_broadcastable_to).
Tracker: pytorch/executorch
"""

import sys

import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime
from torch._higher_order_ops.scan import scan


class DecayingSum(torch.nn.Module):
    def forward(self, xs):
        def step(state, x):
            state = state * 0.9 + x
            return state, state.clone()

        state, ys = scan(step, torch.zeros_like(xs[:, 0]).contiguous(), xs, dim=1)
        return ys, state


model = DecayingSum()
batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=64)
ep = torch.export.export(model, (torch.randn(2, 8, 4),), dynamic_shapes=({0: batch, 1: seq},))
method = Runtime.get().load_program(to_edge_transform_and_lower(ep).to_executorch().buffer).load_method("forward")
second = torch.randn(3, 5, 4)
try:
    out = method.execute([second])
except RuntimeError as e:  # the emitted copy_ of the initial carry
    if "0x12" not in str(e):
        raise
    print(f"reproduced: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
for got, expected in zip(out, model(second)):
    torch.testing.assert_close(got, expected)
print("passes now: the scan's carry takes batch 3, and the .pte matches eager")
