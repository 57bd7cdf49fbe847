"""torch.export cannot trace Pixtral's per-image slicing of patch embeds by values read from the image_sizes tensor.

Pattern: `embed[..., : (size[0] // patch), : (size[1] // patch)] for embed, size in zip(patch_embeds, image_sizes)`
(PixtralVisionModel.forward, modeling_pixtral.py:418-420): each bound is unbacked, the packed length is u1*u3 + u5*u7,
and sdpa_attention_forward's `is_causal = q_length > 1 and attention_mask is None and is_causal`
(integrations/sdpa_attention.py:148 at transformers 5.24.0; the entry cites :159) guards on it.
Error: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression'.
Tracker: huggingface/transformers
"""

import sys

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode


def generate_block_attention_mask(patch_embeds_list, tensor):  # modeling_pixtral.py:360-374
    seq_len = tensor.shape[1]
    causal_mask = torch.full((seq_len, seq_len), fill_value=torch.finfo(tensor.dtype).min, dtype=tensor.dtype)
    start = 0
    for num_patches in patch_embeds_list:
        end = start + num_patches
        causal_mask[start:end, start:end] = 0
        start = end
    return causal_mask[None, None, :, :].expand(tensor.shape[0], 1, -1, -1)


class SliceByImageSizes(torch.nn.Module):
    def __init__(self, patch_size=4, hidden=8):
        super().__init__()
        self.patch_size = patch_size
        self.patch_conv = torch.nn.Conv2d(3, hidden, kernel_size=patch_size, stride=patch_size, bias=False)

    def forward(self, pixel_values, image_sizes):
        patch_embeds = self.patch_conv(pixel_values)
        patch_embeds_list = [
            embed[..., : (size[0] // self.patch_size), : (size[1] // self.patch_size)]
            for embed, size in zip(patch_embeds, image_sizes)
        ]
        patch_embeds = torch.cat([p.flatten(1).T for p in patch_embeds_list], dim=0).unsqueeze(0)
        attention_mask = generate_block_attention_mask([p.shape[-2] * p.shape[-1] for p in patch_embeds_list],
                                                       patch_embeds)
        query = patch_embeds.unsqueeze(1)  # (batch, heads, seq, dim)
        q_length = query.shape[2]
        is_causal = q_length > 1 and attention_mask is None  # integrations/sdpa_attention.py:148
        return F.scaled_dot_product_attention(query, query, query, attn_mask=attention_mask, is_causal=is_causal)


model = SliceByImageSizes()
args = (torch.randn(2, 3, 16, 16), torch.tensor([[16, 8], [8, 16]]))
try:
    ep = torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim.AUTO}, {0: torch.export.Dim.AUTO}),
                             strict=False)
except GuardOnDataDependentSymNode as e:
    if "data-dependent expression" not in str(e):
        raise
    # stderr, after torch's own log of the failing graph: the summary is the last line printed
    print(f"reproduced: GuardOnDataDependentSymNode: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(*args), model(*args))
print("passes now: slicing patch embeds by image_sizes values exports and matches eager")
