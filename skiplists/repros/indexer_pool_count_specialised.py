"""Glm5Next's sparse-attention indexer, exported at fewer keys than one pool holds, refuses more keys than one pool.

Pattern: Glm5NextTextIndexer (modeling_glm5_next.py:772-914 at transformers 5.24.0) scores the keys in pools of
`index_kpool` (16) tokens: `number_of_pools = (seq_len + 15) // 16` in get_pooled_states. Traced at 8 keys that is
one pool, and the pooled tensors' pool dim of size 1 specialises the program to one pool: torch.export bounds the
sequence to at most 16 keys. The generation case's decode step keeps the same guard over the cache's indexer keys
(`(15 + past_key_values.1.indexer_keys dim 1 + input_ids dim 1) // 16 == 1`), which the second decode step breaks.
Error: the exported indexer run at 20 keys raises "Guard failed: hidden_states.size()[1] <= 16".
"""

import sys

import torch
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextIndexer

config = Glm5NextTextConfig(hidden_size=32, q_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=2048,
                            index_kpool=16)
torch.manual_seed(0)
indexer = Glm5NextTextIndexer(config, layer_idx=0).eval()
for parameter in indexer.parameters():  # (the pool gate starts as zeros)
    torch.nn.init.normal_(parameter)


class Indexer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.indexer = indexer

    def forward(self, hidden_states, q_resid, attention_mask):
        return self.indexer(hidden_states, q_resid, attention_mask, None)


def sample(keys: int) -> dict:
    return {"hidden_states": torch.randn(1, keys, 32), "q_resid": torch.randn(1, keys, 16),
            "attention_mask": torch.ones(1, keys, dtype=torch.bool)}


dims = {name: {1: torch.export.Dim.AUTO} for name in sample(8)}
program = torch.export.export(Indexer(), (), sample(8), dynamic_shapes=dims)
longer = sample(20)
try:
    got = program.module()(**longer)
except AssertionError as e:
    if "Guard failed" in str(e) and "<= 16" in str(e):
        print(f"reproduced: exported at 8 keys, run at 20: {str(e).strip()[:120]}", file=sys.stderr)
        raise SystemExit(10)
    raise
torch.testing.assert_close(got, Indexer()(**longer))
print("passes now: the indexer exported at 8 keys runs at 20 and matches eager", file=sys.stderr)
