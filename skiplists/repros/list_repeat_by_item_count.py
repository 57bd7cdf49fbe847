"""torch.export cannot trace Qwen3-ASR's audio window boundaries, a Python list repeated by a count from .max().item().

Pattern: get_audio_cu_seqlens takes `max_len_after_cnn = feature_lens_after_cnn.max().item()` (unbacked) and builds
`cu_chunk_lens += [window_aftercnn] * (cnn_len // window_aftercnn)` per sample (modeling_qwen3_asr.py:308-315):
list repetition needs a concrete int.
Error: GuardOnDataDependentSymNode 'Could not extract specialized integer from data-dependent expression'.
Tracker: huggingface/transformers
"""

import sys

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

N_WINDOW, N_WINDOW_INFER = 2, 8  # config defaults 50 and 800; n_window_infer a multiple of 2 * n_window


def _get_feat_extract_output_lengths(input_lengths, n_window=50):  # modeling_qwen3_asr.py:271-278
    chunk_len = n_window * 2
    input_lengths_leave = input_lengths % chunk_len
    feat_lengths = (input_lengths_leave - 1) // 2 + 1
    return ((feat_lengths - 1) // 2 + 1 - 1) // 2 + 1 + (input_lengths // chunk_len) * 13


def get_audio_cu_seqlens(chunk_lengths, feature_lens, n_window_infer, n_window):  # modeling_qwen3_asr.py:281-319
    aftercnn_lens = _get_feat_extract_output_lengths(feature_lens, n_window)
    feature_lens_after_cnn = _get_feat_extract_output_lengths(chunk_lengths, n_window)
    max_len_after_cnn = feature_lens_after_cnn.max().item()
    n_window_ratio = n_window_infer // (n_window * 2)
    window_aftercnn = max_len_after_cnn * n_window_ratio
    cu_chunk_lens = [0]
    for cnn_len in aftercnn_lens:
        cu_chunk_lens += [window_aftercnn] * (cnn_len // window_aftercnn)
        remainder = cnn_len % window_aftercnn
        if remainder != 0:
            cu_chunk_lens += [remainder]
    return torch.tensor(cu_chunk_lens, device=feature_lens.device).cumsum(-1, dtype=torch.int32)


class AudioWindowBoundaries(torch.nn.Module):
    def forward(self, input_features_mask):
        batch_size, padded_feature_length = input_features_mask.shape
        chunk_len = N_WINDOW * 2
        num_chunks = padded_feature_length // chunk_len
        feature_lens = input_features_mask.sum(-1).to(torch.long)
        chunk_lengths = input_features_mask.view(batch_size, num_chunks, chunk_len).sum(dim=-1).reshape(-1).long()
        return get_audio_cu_seqlens(chunk_lengths, feature_lens, N_WINDOW_INFER, N_WINDOW)


model = AudioWindowBoundaries()
input_features_mask = torch.ones(2, 48, dtype=torch.long)
input_features_mask[1, 30:] = 0
args = (input_features_mask,)
try:
    ep = torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},),
                             strict=False)
except GuardOnDataDependentSymNode as e:
    if "Could not extract specialized integer" not in str(e):
        raise
    # stderr, after torch's own log of the failing graph: the summary is the last line printed
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: the window boundaries list from .max().item() exports and matches eager")
