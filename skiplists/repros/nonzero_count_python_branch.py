"""torch.export cannot trace Qwen4Exp's sparse-attention indexer: a Python `if` on the count of a per-query nonzero.

Pattern: `local_visible_indices = torch.nonzero(visible_token_indices[batch_idx, 0, query_idx]).flatten()`,
`num_complete_blocks = local_visible_indices.shape[-1] // self.compress_ratio`, `if num_complete_blocks > 0:`
(Qwen4ExpTextIndexer.forward, qwen4_exp/modeling_qwen4_exp.py:747-752 at transformers 5.24.0; the entry cites 728/733):
nonzero's length is an unbacked symbol u0, so the branch is a data-dependent Python bool.
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression (u0//2) > 0'.
Tracker: huggingface/transformers
"""

import sys

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

COMPRESS_RATIO = 2


class NonzeroBlockIndexer(torch.nn.Module):
    def forward(self, keys, visible):  # keys [B, S, D], visible [B, 1, S, S] bool
        batch_size, seq_length, _ = keys.shape
        pooled = []
        for batch_idx in range(batch_size):
            for query_idx in range(seq_length):
                local_visible_indices = torch.nonzero(visible[batch_idx, 0, query_idx], as_tuple=False).flatten()
                num_complete_blocks = local_visible_indices.shape[-1] // COMPRESS_RATIO
                if num_complete_blocks > 0:
                    idx = local_visible_indices[: num_complete_blocks * COMPRESS_RATIO]
                    pooled.append(keys[batch_idx].index_select(0, idx).sum(0))
                else:
                    pooled.append(keys.new_zeros(keys.shape[-1]))
        return torch.stack(pooled)


model = NonzeroBlockIndexer().eval()
seq = 4
args = (torch.randn(1, seq, 8), torch.tril(torch.ones(seq, seq, dtype=torch.bool))[None, None])
try:
    ep = torch.export.export(model, args, strict=False)
except GuardOnDataDependentSymNode as e:
    if "data-dependent expression" not in str(e) or "//2" not in str(e).replace(" ", ""):
        raise
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: the branch on the nonzero count exports and matches eager")
