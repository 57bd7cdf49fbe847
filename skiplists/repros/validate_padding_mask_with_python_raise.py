"""torch.export cannot trace Apertus1p5's audio tokenization, which validates the padding mask with Python branches.

Pattern: Apertus1p5Model.get_audio_tokens (modeling_apertus1p5.py:851-864 at transformers 5.24.0) does
`audio_lengths = padding_mask.sum(dim=-1)`, `if (audio_lengths == 0).any(): raise ValueError(...)` and
`if (padding_mask.long().diff(dim=-1) > 0).any(): raise ...`, then tokenizes each clip at its own length,
`for clip, length in zip(input_values, audio_lengths.tolist()): clip[None, :, :length]`: tensor values read as Python
bools (and then as slice lengths).
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression Eq(u0, 1)'.
Tracker: huggingface/transformers
"""

import sys

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode


class TokenizeClipsAtTheirLengths(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Conv1d(1, 4, kernel_size=4, stride=4)

    def forward(self, input_values, padding_mask):
        audio_lengths = padding_mask.sum(dim=-1)
        if (audio_lengths == 0).any():
            raise ValueError("`padding_mask` marks an audio clip with zero valid samples.")
        if (padding_mask.long().diff(dim=-1) > 0).any():
            raise ValueError("`padding_mask` must be right-padded")
        audio_tokens = []
        for clip, length in zip(input_values, audio_lengths.tolist()):
            audio_tokens.append(self.encoder(clip[None, :, :length]).argmax(1).flatten())
        return torch.cat(audio_tokens)


model = TokenizeClipsAtTheirLengths().eval()
padding_mask = torch.ones(2, 32, dtype=torch.long)
padding_mask[1, 24:] = 0
args = (torch.randn(2, 1, 32), padding_mask)
try:
    ep = torch.export.export(model, args, strict=False)
except GuardOnDataDependentSymNode as e:
    if "data-dependent expression" not in str(e):
        raise
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: the padding-mask validation and per-clip tokenization export and match eager")
