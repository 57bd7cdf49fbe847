"""Llama4ForConditionalGeneration.forward fails in eager at 5.24: it reads image_outputs off the text model's output.

Pattern: any forward of a tiny Llama4ForConditionalGeneration (even text-only input_ids); it returns
Llama4CausalLMOutputWithPast(..., image_outputs=outputs.image_outputs) (modeling_llama4.py:1318) where outputs is the
text model's MoeCausalLMOutputWithPast: AttributeError "'MoeCausalLMOutputWithPast' object has no attribute
'image_outputs'". (At 5.23 the field was image_hidden_states=image_features.)
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import Llama4Config, Llama4ForConditionalGeneration

config = Llama4Config(
    text_config=dict(vocab_size=64, hidden_size=16, intermediate_size=32, intermediate_size_mlp=32,
                     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                     num_local_experts=2, attention_chunk_size=16),
    vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                       image_size=28, patch_size=14, vision_output_dim=16, projector_input_dim=16,
                       projector_output_dim=16),
    image_token_index=5, boi_token_index=6, eoi_token_index=7,
)
torch.manual_seed(0)
model = Llama4ForConditionalGeneration(config).eval()
try:
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[1, 2, 3, 4]]))
except AttributeError as e:
    if "object has no attribute 'image_outputs'" in str(e):
        print(f"REPRODUCES: Llama4ForConditionalGeneration.forward raises AttributeError: {e}", file=sys.stderr)
        raise SystemExit(10)
    raise
assert torch.isfinite(out.logits).all()
print("PASSES: Llama4ForConditionalGeneration runs a forward", file=sys.stderr)
