"""torch.export of MuseGlimmerAssistantModel without attention_mask fails: its mask spans the queries, not the keys.

Pattern: MuseGlimmerAssistantModel.forward calls `create_bidirectional_mask(config=..., inputs_embeds=noise_embeds,
attention_mask=attention_mask, cache=cache)` (modeling_muse_glimmer_assistant.py:416-429 at transformers 5.24.0)
while every attention layer's keys are `torch.cat([context_hidden_states, hidden_states], dim=1)` (:180). With
attention_mask=None and no cache, _preprocess_mask_arguments takes `kv_length = q_length` (masking_utils.py:851,
the noise length). Eager never builds that mask (SDPA's bidirectional skip returns None), but under export the skip
is off (`is_torchdynamo_exporting()`, masking_utils.py:353), so a (q, q) mask meets (q, context + q) scores: the
export fails at every shape (static: 'Attempting to broadcast a dimension of length 4'). Passing a 2-D
attention_mask of length context + block (as the docstring asks) exports.
Error: RuntimeError 'The size of tensor a (s30 + s39) must match the size of tensor b (s30) at non-singleton
dimension 3' (symbol numbers vary).
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

config = MuseGlimmerAssistantConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=1, head_dim=8, target_layer_ids=[0, 1], block_size=4,
                                    sliding_window=64)
torch.manual_seed(0)
model = MuseGlimmerAssistantModel(config).eval()
args = (torch.randn(2, 4, 16), torch.randn(2, 6, 32))  # noise_embeds (block 4), context_hidden_states (6 tokens)
auto = torch.export.Dim.AUTO
try:
    ep = torch.export.export(model, args, dynamic_shapes=({0: auto, 1: auto}, {0: auto, 1: auto}), strict=False)
except RuntimeError as e:
    message = str(e)
    if "must match the size of tensor b" not in message or "non-singleton dimension 3" not in message:
        raise
    print(f"reproduced: RuntimeError: {message.splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
with torch.no_grad():
    torch.testing.assert_close(ep.module()(*args).last_hidden_state, model(*args).last_hidden_state)
print("passes now: MuseGlimmerAssistantModel without attention_mask exports and matches eager")
