"""XNNPACK's ChannelsLastTaggedReshapePass asserts on nn.PReLU applied to a 3-D (batch, seq, hidden) tensor.

Pattern: DAB-DETR's default activation_function="prelu" (configuration_dab_detr.py:89) runs nn.PReLU after the
encoder/decoder fc1 on (batch, seq, hidden) states (modeling_dab_detr.py:639/694); the partitioner delegates prelu,
which the pass lists as NHWC-requiring, and input_to_nhwc (channels_last_tagged_reshape_pass.py:386) raises
AssertionError 'Attempting to convert non-NHWC compatible node to NHWC' inside XNNPACK preprocess.
Tracker: pytorch/executorch
"""

import sys

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.act = torch.nn.PReLU()

    def forward(self, hidden_states):
        return self.act(self.fc1(hidden_states))


torch.manual_seed(0)
model, x = M().eval(), torch.randn(2, 5, 8)
try:
    program = torch.export.export(model, (x,))
    et = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
except Exception as e:  # noqa: BLE001
    chain, c = [], e
    while c is not None:
        chain.append(c)
        c = c.__cause__ or c.__context__
    root = next((c for c in chain if isinstance(c, AssertionError) and "non-NHWC compatible" in str(c)), None)
    if root is not None:
        print(f"REPRODUCES: {type(e).__name__}: {str(e).strip()[:110]} <- AssertionError: {root}", file=sys.stderr)
        raise SystemExit(10)
    raise

from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer  # noqa: E402

out = _load_for_executorch_from_buffer(et.buffer).forward((x,))[0]
torch.testing.assert_close(out, model(x), atol=1e-4, rtol=1e-4)
print("PASSES: PReLU on a 3-D tensor lowers to XNNPACK and matches eager", file=sys.stderr)
