"""ExecuTorch's edge verifier rejects torch.randn_like (aten.randn_like is not Core ATen).

Pattern: inference-time sampling noise, `latents + std * torch.randn_like(latents)` (VibeVoice's acoustic
tokenizer, vibevoice_acoustic_tokenizer:527-532; Vits' flow/duration predictor, modeling_vits.py:398,754,1370),
exported with torch.export and lowered with to_edge_transform_and_lower(XnnpackPartitioner): SpecViolationError
naming aten.randn_like (random ops are not in Core ATen).
Tracker: pytorch/pytorch
"""

import sys

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower


class M(torch.nn.Module):
    def forward(self, latents):
        return latents + 0.0 * torch.randn_like(latents)


x = torch.randn(2, 8)
try:
    program = torch.export.export(M(), (x,))
    et = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
except Exception as e:  # noqa: BLE001
    if type(e).__name__ == "SpecViolationError" and "randn_like" in str(e):
        line = next(ln for ln in str(e).splitlines() if "randn_like" in ln)
        print(f"REPRODUCES: {type(e).__name__}: {line.strip()[:160]}", file=sys.stderr)
        raise SystemExit(10)
    raise

from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer  # noqa: E402

out = _load_for_executorch_from_buffer(et.buffer).forward((x,))[0]
torch.testing.assert_close(out, x)  # the noise is scaled by 0: eager returns the input
print("PASSES: randn_like lowers and the program matches eager", file=sys.stderr)
