"""torch.export cannot trace EoMT's layer loop, whose Python `if` reads a registered buffer's value.

Pattern: `if idx >= num_hidden_layers - num_blocks and (self.training or self.attn_mask_probs[idx - ...] > 0):`
(modeling_eomt.py:1108, modeling_eomt_dinov3.py:1262 at transformers 5.24.0; the entry cites 1109/1263) with
`self.attn_mask_probs = nn.Buffer(torch.ones(num_blocks))`: export lifts the buffer to a graph input, so the
comparison is a data-dependent Python bool.
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression Eq(u0, 1)'.
Tracker: huggingface/transformers
"""

import sys

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode


class BufferGatedLayers(torch.nn.Module):
    def __init__(self, hidden=8, num_hidden_layers=3, num_blocks=2):
        super().__init__()
        self.num_hidden_layers, self.num_blocks = num_hidden_layers, num_blocks
        self.layers = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(num_hidden_layers))
        self.mask_head = torch.nn.Linear(hidden, 1)
        self.attn_mask_probs = torch.nn.Buffer(torch.ones(num_blocks))

    def forward(self, hidden_states):
        masks_per_layer = ()
        for idx, layer_module in enumerate(self.layers):
            if idx >= self.num_hidden_layers - self.num_blocks and (
                self.training or self.attn_mask_probs[idx - self.num_hidden_layers + self.num_blocks] > 0
            ):
                masks_per_layer += (self.mask_head(hidden_states),)
            hidden_states = layer_module(hidden_states)
        return hidden_states, masks_per_layer


model = BufferGatedLayers().eval()
args = (torch.randn(2, 5, 8),)
try:
    ep = torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},),
                             strict=False)
except GuardOnDataDependentSymNode as e:
    if "data-dependent expression" not in str(e):
        raise
    # stderr, after torch's own log of the failing graph: the summary is the last line printed
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: the Python if on a buffer value exports and matches eager")
