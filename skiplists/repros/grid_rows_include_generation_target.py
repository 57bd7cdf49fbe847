"""GlmImageModel.forward drops the last image_grid_thw row (the generation target), so one grid row per image fails.

Pattern: GlmImageModel.forward encodes `source_grids = self.get_image_grids_for_generation(images_per_sample,
image_grid_thw)` (modeling_glm_image.py:1246 at transformers 5.24.0), which keeps `grids[:-1]` of each sample or,
without images_per_sample, `image_grid_thw[:-1]` of the whole batch (:1305-1319; the entry cites 1300-1313): the last
grid of each sample is the image to generate, not an input. Given pixel_values for every row of image_grid_thw (a
batch of 2 images, one grid row each, as any Qwen-VL-style sample), the vision embeddings map the patches of the 2nd
image to a grid row that was dropped: `target_h = image_shapes[seq_ids, 1]` (:314; the entry cites 309).
The same pixel_values run once image_grid_thw carries one extra target row per sample (images_per_sample=[2, 2]).
Error: IndexError 'index 1 is out of bounds for dimension 0 with size 1'.
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import GlmImageConfig, GlmImageModel

config = GlmImageConfig(
    text_config=dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, pad_token_id=0, eos_token_id=102, vision_vocab_size=16,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])),
    vision_config=dict(depth=1, hidden_size=16, num_heads=2, image_size=32, patch_size=8, intermediate_size=32),
    vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=16),
    image_token_id=100, image_start_token_id=101, image_end_token_id=102,
)
torch.manual_seed(0)
model = GlmImageModel(config).eval()
input_ids = torch.tensor([[101, 100, 100, 100, 100, 102, 5, 6]] * 2)  # 4 image tokens per sample
pixel_values = torch.randn(2 * 4, 3 * 8 * 8)  # 2 images of 2x2 patches, packed
one_row_per_image = torch.tensor([[1, 2, 2], [1, 2, 2]])

with torch.no_grad():
    # control: the processor's layout (each sample's source grid, then its target grid) runs
    ok = model(input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=one_row_per_image.repeat_interleave(2, 0),
               images_per_sample=torch.tensor([2, 2])).last_hidden_state
    assert ok.shape == (2, 8, 32) and torch.isfinite(ok).all()
    try:
        out = model(input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=one_row_per_image)
    except IndexError as e:
        if "out of bounds for dimension 0 with size 1" not in str(e):
            raise
        print(f"reproduced: one grid row per image: IndexError: {e} (with a target row per sample it runs)",
              file=sys.stderr)
        raise SystemExit(10)
assert torch.isfinite(out.last_hidden_state).all()
print("passes now: GlmImageModel encodes every image_grid_thw row given pixel_values for all of them")
