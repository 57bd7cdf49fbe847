"""torch.export cannot trace FastSpeech2Conformer's length regulator, which branches in Python on a duration sum.

Pattern: length_regulator (modeling_fastspeech2_conformer.py:108-126) does `if duration_labels.sum() == 0:` (a tensor
read as a Python bool), then `max_len = torch.sum(duration_labels, dim=1).max()` sizes a torch.zeros and each row is
`torch.repeat_interleave(encoded_embedding, target_duration, dim=0)`.
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression Eq(u0, 1)'.
Tracker: huggingface/transformers
"""

import sys

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode


class LengthRegulator(torch.nn.Module):
    def forward(self, encoded_embeddings, duration_labels):
        if duration_labels.sum() == 0:
            duration_labels[duration_labels.sum(dim=1).eq(0)] = 1
        max_len = torch.sum(duration_labels, dim=1).max()
        hidden_states = torch.zeros((encoded_embeddings.size(0), max_len, encoded_embeddings.size(2)),
                                    dtype=torch.float, device=encoded_embeddings.device)
        for i, (encoded_embedding, target_duration) in enumerate(zip(encoded_embeddings, duration_labels)):
            repeated = torch.repeat_interleave(encoded_embedding, target_duration, dim=0)
            hidden_states[i, : repeated.size(0)] = repeated
        return hidden_states


model = LengthRegulator()
args = (torch.randn(2, 5, 8), torch.tensor([[1, 2, 0, 3, 1], [2, 2, 2, 1, 0]]))
dims = {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}
try:
    ep = torch.export.export(model, args, dynamic_shapes=(dims, dims), strict=False)
except GuardOnDataDependentSymNode as e:
    if "data-dependent expression" not in str(e):
        raise
    # stderr, after torch's own log of the failing graph: the summary is the last line printed
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: the length regulator exports and matches eager")
