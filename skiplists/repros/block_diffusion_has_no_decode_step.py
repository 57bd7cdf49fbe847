"""DiffusionGemma generates by denoising whole blocks, not one token per step: no prefill/decode step to export.

Pattern: DiffusionGemmaForBlockDiffusion's generate() (DiffusionGemmaGenerationMixin, transformers 5.24.0) fills a
canvas of masked positions and refines all of them at every denoising step through the model, instead of running
the class's forward on the prompt and then on one new token at a time with a cache. engine.generate decomposes
autoregressive generation into those two steps, so a block-diffusion model has no step of that kind to export.
Shown: the lengths of the sequences the model runs on during generate(), none of them one new token.
"""

import sys

import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=128, pad_token_id=0, eos_token_id=1,
            bos_token_id=2, sliding_window=32, layer_types=["sliding_attention", "full_attention"], num_experts=4,
            top_k_experts=2, moe_intermediate_size=64)
vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
              head_dim=8, patch_size=16, position_embedding_size=256)
config = DiffusionGemmaConfig(text_config=text, vision_config=vision, boi_token_id=63, eoi_token_id=61,
                              image_token_id=62, canvas_length=16)
torch.manual_seed(0)
model = DiffusionGemmaForBlockDiffusion(config).eval()
lengths = []
model.model.register_forward_pre_hook(
    lambda module, args, kwargs: lengths.append(next(v.shape[1] for v in (*args, *kwargs.values())
                                                     if isinstance(v, torch.Tensor) and v.dim() >= 2)),
    with_kwargs=True)
with torch.no_grad():
    model.generate(torch.randint(3, 60, (1, 8)), max_new_tokens=4)
if lengths and 1 not in lengths:
    print(f"reproduced: generate() ran the model {len(lengths)} times on sequences of {sorted(set(lengths))} "
          "positions, never on one new token", file=sys.stderr)
    raise SystemExit(10)
print(f"passes now: generate() ran one-token steps (lengths {lengths})", file=sys.stderr)
