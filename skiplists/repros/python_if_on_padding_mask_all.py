"""torch.export cannot trace PeAudioVideo's video/audio alignment, a Python `if` on whether no sample is padded.

Pattern: `audio_lengths = padding_mask.sum(dim=-1)`, then
`if (audio_lengths == video_hidden_state.shape[1]).all() or (video_lengths == audio_hidden_state.shape[1]).all():`
take the interpolation path, else align per sample (PeAudioVideoEncoder._align_video_hidden_state,
modeling_pe_audio_video.py:187-193 at transformers 5.24.0; the entry cites :193): a tensor read as a Python bool.
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression Eq(u0, 1)'.
Tracker: huggingface/transformers
"""

import sys

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode


class AlignVideoToAudio(torch.nn.Module):
    def forward(self, audio_hidden_state, video_hidden_state, padding_mask, padding_mask_videos):
        video_lengths = padding_mask_videos.sum(dim=-1)
        audio_lengths = padding_mask.sum(dim=-1)
        if (audio_lengths == video_hidden_state.shape[1]).all() or (
            video_lengths == audio_hidden_state.shape[1]
        ).all():
            return torch.nn.functional.interpolate(
                video_hidden_state.transpose(1, 2), size=audio_hidden_state.shape[1], mode="nearest"
            ).transpose(1, 2)
        aligned = audio_hidden_state.new_zeros((*audio_hidden_state.shape[:2], video_hidden_state.shape[-1]))
        return aligned  # the per-sample alignment (not reached with unpadded inputs)


model = AlignVideoToAudio().eval()
args = (torch.randn(2, 12, 8), torch.randn(2, 6, 8), torch.ones(2, 12, dtype=torch.long),
        torch.ones(2, 6, dtype=torch.long))
try:
    ep = torch.export.export(model, args, strict=False)
except GuardOnDataDependentSymNode as e:
    if "data-dependent expression" not in str(e):
        raise
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: the Python if on padding_mask.sum() == length exports and matches eager")
