"""torch.export cannot trace SLANet's step-by-step structure decoder, which breaks early on a tensor condition.

Pattern: `for _ in range(max_text_length + 1): ... if torch.stack(structure_ids_list, dim=1).eq(out_channels - 1)
.any(-1).all(): break` (modeling_slanet.py:180, modeling_slanext.py:588 at transformers 5.24.0; the entry cites
181/589): Python control flow on a tensor value.
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression Eq(u0, 1)'.
Tracker: huggingface/transformers
"""

import sys

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode


class DecodeUntilEos(torch.nn.Module):
    def __init__(self, in_channels=8, hidden=8, out_channels=6, max_text_length=4):
        super().__init__()
        self.out_channels, self.max_text_length, self.hidden = out_channels, max_text_length, hidden
        self.cell = torch.nn.GRUCell(in_channels + out_channels, hidden)  # stands in for SLANetAttentionGRUCell
        self.structure_generator = torch.nn.Linear(hidden, out_channels)

    def forward(self, hidden_states):
        features = torch.zeros((hidden_states.shape[0], self.hidden), dtype=torch.float32)
        predicted_chars = torch.zeros(size=[hidden_states.shape[0]], dtype=torch.long)
        context = hidden_states.mean(dim=1)
        structure_preds_list, structure_ids_list = [], []
        for _ in range(self.max_text_length + 1):
            embedding_feature = F.one_hot(predicted_chars, self.out_channels).float()
            features = self.cell(torch.cat([context, embedding_feature], dim=-1), features)
            structure_step = self.structure_generator(features)
            predicted_chars = structure_step.argmax(dim=1)
            structure_preds_list.append(structure_step)
            structure_ids_list.append(predicted_chars)
            if torch.stack(structure_ids_list, dim=1).eq(self.out_channels - 1).any(-1).all():
                break
        return F.softmax(torch.stack(structure_preds_list, dim=1), dim=-1)


model = DecodeUntilEos()
args = (torch.randn(2, 10, 8),)
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
print("passes now: the decode loop with a tensor-valued break exports and matches eager")
