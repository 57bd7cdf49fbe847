"""torch pins a dynamic dim to 2 via the `numel < 2` layout probe on `cumsum(x)[:-1]` (one shorter than the input).

Pattern: MusicFlamingo's `cumsum_post = torch.cat([torch.zeros(1, ...), torch.cumsum(post_lengths, dim=0)[:-1]])`
(musicflamingo/modeling_musicflamingo.py:355 at transformers 5.24.0), post_lengths having one entry per audio window
(input_features dim 0). At the traced size 2 the slice has one element, and fake-tensor layout probes in
torch/_prims_common (is_contiguous:322 here; _is_non_overlapping_and_dense_or_false:511 in the ExecuTorch
lowering's run_decompositions, via _to_copy -> _convert_element_type_meta) call `guard_or_false(numel < 2)`,
which adds the guard `s - 1 < 2` and refines the window count to exactly 2.
The engine works around it with its patches of torch._prims_common's check_contiguous_sizes_strides,
is_contiguous and _is_non_overlapping_and_dense_or_false (engine/patches/torch_export.py). Registered for torch.export
only, they left the ExecuTorch lowering's decomposition retrace on the original probes, which narrowed MusicFlamingo's
input_features dim 0 from 0..8 to 0..2 (TORCH_LOGS=+dynamic: `eval s4 - 1 < 2 [guard added]
(_prims_common/__init__.py:511 in _is_non_overlapping_and_dense_or_false)`, then `set_replacement s4 = 2`). All three
are needed: with two, check_contiguous_sizes_strides:285 still pins (`Eq(s4 - 1, 1)`).
Error: the program exported at 2 windows raises AssertionError 'Guard failed: -1 + input_features.size()[0] < 2' on 3.
Tracker: pytorch/pytorch
"""

import sys

import torch


class WindowOffsets(torch.nn.Module):
    def forward(self, input_features):  # [windows, mel, frames]
        post_lengths = (input_features > 0).sum(-1).sum(-1)  # one length per window
        cumsum_post = torch.cat([torch.zeros(1), torch.cumsum(post_lengths, dim=0)[:-1]])
        return input_features.mean((1, 2)) + cumsum_post


model = WindowOffsets()
ep = torch.export.export(model, (torch.randn(2, 4, 8),), dynamic_shapes=({0: torch.export.Dim.AUTO},), strict=False)
second = (torch.randn(3, 4, 8),)
try:
    out = ep.module()(*second)
except AssertionError as e:  # the program's guard on the specialised window count
    if "input_features.size()[0] < 2" not in str(e).replace("-1 + ", ""):
        raise
    print(f"reproduced: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(out, model(*second))
print("passes now: the window count stays symbolic and the program matches eager at 3 windows")
