"""torch.export cannot trace VideoLlama3's per-image pixel_unshuffle: a .view of a tensor sized by grid_thw values.

Pattern: `hidden_states.split(grid_thw.prod(dim=1).tolist())`, then per image `for hidden_states, (t, h, w),
merge_size in zip(hidden_states_chunks, grid_thw, merge_sizes)`: view to (t, h // m, w // m, m, m, c), permute,
reshape, interpolate to (h // m, w // m), and `hidden_states.permute(0, 2, 3, 1).view(-1, c)`
(VideoLlama3VisionModel.pixel_unshuffle, modeling_video_llama_3.py:476-497 at transformers 5.24.0; the entry cites
447): every size is unbacked, and the final view's contiguity check guards on them.
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression 8*u2*u8*u9 < 2' (the contiguity
check in torch/_prims_common; symbol numbers vary).
Tracker: huggingface/transformers
"""

import sys
import traceback

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode


class PixelUnshuffle(torch.nn.Module):
    def forward(self, hidden_states, grid_thw, merge_sizes):
        hidden_states_chunks = hidden_states.split(grid_thw.prod(dim=1).tolist(), dim=0)
        outputs = []
        for hidden_states, (t, h, w), merge_size in zip(hidden_states_chunks, grid_thw, merge_sizes):
            c = hidden_states.shape[-1]
            hidden_states = hidden_states.view(t, h // merge_size, w // merge_size, merge_size, merge_size, c).permute(
                0, 1, 3, 2, 4, 5
            )
            hidden_states = hidden_states.reshape(t, h, w, c).permute(0, 3, 1, 2)
            hidden_states = torch.nn.functional.interpolate(
                hidden_states, size=(h // merge_size, w // merge_size), mode="bilinear"
            )
            hidden_states = hidden_states.permute(0, 2, 3, 1).view(-1, c)
            outputs.append(hidden_states)
        return torch.cat(outputs, dim=0)


model = PixelUnshuffle()
args = (torch.randn(32, 8), torch.tensor([[1, 4, 4], [1, 4, 4]]), torch.tensor([2, 2]))
try:
    ep = torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim.AUTO}, {0: torch.export.Dim.AUTO},
                                                         {0: torch.export.Dim.AUTO}), strict=False)
except GuardOnDataDependentSymNode as e:
    in_prims = any(f.filename.endswith("_prims_common/__init__.py") for f in traceback.extract_tb(e.__traceback__))
    if "data-dependent expression" not in str(e) or "< 2" not in str(e) or not in_prims:
        raise
    # stderr, after torch's own log of the failing graph: the summary is the last line printed
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]} (contiguity check in _prims_common)",
          file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: the per-image pixel_unshuffle exports and matches eager")
