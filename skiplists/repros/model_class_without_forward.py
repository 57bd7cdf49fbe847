"""BarkModel, Qwen2.5-Omni / Qwen3-Omni-MoE ForConditionalGeneration and GlmImageVQVAE define no forward() at 5.24.

Pattern: `class BarkModel(BarkPreTrainedModel, GenerationMixin)` (modeling_bark.py:1254) has only generate() (:1359)
over its semantic/coarse/fine sub-models and codec; `class Qwen2_5OmniForConditionalGeneration` (modeling_qwen2_5_omni.py
:3718, generate() at :3805) and `class Qwen3OmniMoeForConditionalGeneration` (modeling_qwen3_omni_moe.py:3959,
generate() at :4064) only generate over thinker/talker/token2wav; `class GlmImageVQVAE` (modeling_glm_image.py:580)
only has encode() (:597). Their forward is nn.Module's placeholder, so calling the module (what every exporter does)
raises. Shown by the class attribute for all four, and by calling tiny BarkModel and GlmImageVQVAE instances.
Error: NotImplementedError 'Module [BarkModel] is missing the required "forward" function'.
Tracker: huggingface/transformers
"""

import sys

import torch
import transformers
from transformers import BarkConfig, BarkModel, GlmImageVQVAE, GlmImageVQVAEConfig

NAMES = ["BarkModel", "Qwen2_5OmniForConditionalGeneration", "Qwen3OmniMoeForConditionalGeneration", "GlmImageVQVAE"]
missing = [n for n in NAMES if getattr(transformers, n).forward is torch.nn.Module.forward]

gpt = dict(block_size=32, input_vocab_size=64, output_vocab_size=64, num_layers=1, num_heads=2, hidden_size=16)
bark = BarkModel(BarkConfig(
    semantic_config=gpt, coarse_acoustics_config=gpt,
    fine_acoustics_config=dict(gpt, n_codes_total=2, n_codes_given=1),
    codec_config=dict(model_type="encodec", hidden_size=8, num_filters=2, upsampling_ratios=[2], codebook_size=16,
                      num_residual_layers=1, num_lstm_layers=1, codebook_dim=8),
)).eval()
vq = GlmImageVQVAE(GlmImageVQVAEConfig(embed_dim=8, num_embeddings=16, latent_channels=8)).eval()
errors = []
for model, args in ((bark, (torch.tensor([[1, 2, 3]]),)), (vq, (torch.randn(1, 8, 4, 4),))):
    try:
        with torch.no_grad():
            model(*args)
    except NotImplementedError as e:
        if 'is missing the required "forward" function' not in str(e):
            raise
        errors.append(str(e))

if missing == NAMES and len(errors) == 2:
    print(f"reproduced: no forward() on {', '.join(missing)}; NotImplementedError: {errors[0]} / {errors[1]}",
          file=sys.stderr)
    raise SystemExit(10)
print(f"passes now (at least in part): classes still without forward(): {missing or 'none'}; "
      f"call errors: {errors or 'none'} -- update the entry")
