"""torch.export cannot trace CSM's audio lengths: torch.diff of a boolean-mask selection of input_values_cutoffs.

Pattern: `input_values_cutoffs = F.pad(input_values_cutoffs, (1, 0))`, then
`audio_lengths = input_values_cutoffs[input_values_cutoffs >= 0].diff()` (CsmForConditionalGeneration.
_merge_input_ids_with_input_values, modeling_csm.py:829 at transformers 5.24.0; the entry cites :825): the selection
has an unbacked length u0, and torch.diff on it guards on that length.
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression' (1 > u0).
Tracker: huggingface/transformers
"""

import sys

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode


class AudioLengthsFromCutoffs(torch.nn.Module):
    def forward(self, input_values, input_values_cutoffs):
        input_values_cutoffs = F.pad(input_values_cutoffs, (1, 0))
        audio_lengths = input_values_cutoffs[input_values_cutoffs >= 0].diff()
        audio_lengths = audio_lengths[audio_lengths > 0]
        input_values_mask = torch.arange(input_values_cutoffs.max()).expand(len(audio_lengths), -1)
        return input_values_mask < audio_lengths.unsqueeze(1)


model = AudioLengthsFromCutoffs()
args = (torch.randn(2, 1, 40), torch.tensor([[10, 40], [25, -1]]))
try:
    ep = torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO},
                                                          {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}),
                             strict=False)
except GuardOnDataDependentSymNode as e:
    if "data-dependent expression" not in str(e):
        raise
    # stderr, after torch's own log of the failing graph: the summary is the last line printed
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: diff of the boolean-mask selection of the cutoffs exports and matches eager")
