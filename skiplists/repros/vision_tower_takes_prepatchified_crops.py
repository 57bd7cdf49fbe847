"""Molmo2's vision tower takes its processor's pre-patchified crops, so a (B, 3, H, W) image batch fails.

Pattern: Molmo2VisionModel embeds flattened patches with a Linear,
`self.patch_embedding = nn.Linear(config.patch_size * config.patch_size * config.num_channels, config.hidden_size)`
(modeling_molmo2.py:532-534 at transformers 5.24.0) applied as `self.patch_embedding(pixel_values)` (:544), and
Molmo2Model.get_image_features only reshapes a 4-D pixel_values to (-1, shape[-2], shape[-1]) (:746-748): pixel_values
must be (crops, patches, patch*patch*3) with patches == num_position_embeddings, plus image_token_pooling (the patch
indices each image token pools) and image_grids (tokens per image), as Molmo2Processor produces. A (B, 3, H, W)
image batch puts the image width where the 588 patch values are expected. The processor layout (the control) runs.
Error: RuntimeError 'mat1 and mat2 shapes cannot be multiplied (168x28 and 588x32)' (tiny config: 28-pixel images,
14-pixel patches; the entry's zoo case, 378-pixel images: 2268x378 and 588x32).
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import Molmo2Config, Molmo2ForConditionalGeneration

heads = dict(num_attention_heads=2, num_key_value_heads=2, head_dim=16)
config = Molmo2Config(
    vision_config=dict(**heads, hidden_size=32, intermediate_size=64, num_hidden_layers=2, image_size=[28, 28],
                       patch_size=14),  # 4 patches per crop
    adapter_config=dict(**heads, vision_feature_layer=[-1], hidden_size=32, intermediate_size=64, text_hidden_size=32),
    text_config=dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=128,
                     additional_vocab_size=16, num_hidden_layers=1, intermediate_size=64),
    image_start_token_id=130, low_res_image_start_token_id=131, image_end_token_id=132, image_patch_id=133,
    frame_start_token_id=134, frame_end_token_id=135,
)
torch.manual_seed(0)
model = Molmo2ForConditionalGeneration(config).eval()
input_ids = torch.tensor([[1, 130, 133, 132, 5]] * 2)  # one image token per sample
with torch.no_grad():
    # control: the processor's layout, one crop of 4 flattened patches per image, each image token pooling all 4
    ok = model(input_ids=input_ids, pixel_values=torch.randn(2, 4, 14 * 14 * 3),
               image_token_pooling=torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]]),
               image_grids=torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0]])).logits
    assert torch.isfinite(ok).all()
    try:
        out = model(input_ids=input_ids, pixel_values=torch.randn(2, 3, 28, 28))
    except RuntimeError as e:
        if "mat1 and mat2 shapes cannot be multiplied" not in str(e) or "588x32" not in str(e):
            raise
        print(f"reproduced: (B, 3, H, W) pixel_values: RuntimeError: {e} (the processor layout runs)", file=sys.stderr)
        raise SystemExit(10)
assert torch.isfinite(out.logits).all()
print("passes now: Molmo2 accepts (B, 3, H, W) pixel_values")
