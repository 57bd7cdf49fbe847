"""UnlimitedOcr's reference sliding-window cache layer still holds 1-D placeholder keys after the prefill, 4-D ones after a decode step.

Pattern: UnlimitedOcrDynamicReferenceSlidingWindowLayer.update keeps the prompt in prefill_keys/prefill_values and
`return self.prefill_keys, self.prefill_values` before `super().update(...)` (modeling_unlimited_ocr.py:1301-1320 at
transformers 5.24.0; the entry cites 1318-1340), so `self.keys` stays the `torch.tensor([])` of
DynamicLayer.lazy_initialization (cache_utils.py:115) until the first decode step. A program exported from the
prefill returns a cache whose keys have 1 dim, while the decode program, traced at a later step, takes 4-D keys.
Error: the layer's keys are 1-D after the prefill and 4-D after one decode step (engine: 'past_key_values.0.keys has
1 dims, the program takes 4').
Not an upstream bug (the cache layer's design; the entry's fix is the engine's)
"""

import sys

import torch
from transformers.models.unlimited_ocr.modeling_unlimited_ocr import UnlimitedOcrDynamicReferenceSlidingWindowLayer

torch.manual_seed(0)
layer = UnlimitedOcrDynamicReferenceSlidingWindowLayer(sliding_window=4)
batch, heads, prompt, head_dim = 2, 2, 6, 8
k, v = torch.randn(batch, heads, prompt, head_dim), torch.randn(batch, heads, prompt, head_dim)
full_k, _ = layer.update(k, v)
after_prefill = tuple(layer.keys.shape)
k1, v1 = torch.randn(batch, heads, 1, head_dim), torch.randn(batch, heads, 1, head_dim)
full_k1, _ = layer.update(k1, v1)
after_decode = tuple(layer.keys.shape)
torch.testing.assert_close(full_k1, torch.cat([k, k1], dim=-2))  # the attention sees the right keys either way
if len(after_prefill) != len(after_decode):
    print(f"reproduced: layer.keys is {after_prefill} ({len(after_prefill)}-D) after the prefill, {after_decode} "
          f"({len(after_decode)}-D) after one decode step", file=sys.stderr)
    raise SystemExit(10)
print(f"passes now: layer.keys has {len(after_prefill)} dims after the prefill and after a decode step", file=sys.stderr)
