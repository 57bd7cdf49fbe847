"""PeAudioVideoModel.forward refuses a single modality: it contrasts two of text, video and audio.

Pattern: `if sum([input_ids is not None, pixel_values_videos is not None, input_values is not None]) < 2: raise
ValueError("At least two of input_ids, pixel_values_videos, or input_values must be provided. ...")`
(modeling_pe_audio_video.py:907-911 at transformers 5.24.0), the first statement of the forward: a sample of one
modality (here input_ids alone) never reaches the towers, while text plus mono audio runs (the control).
Error: ValueError 'At least two of input_ids, pixel_values_videos, or input_values must be provided.'
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import PeAudioVideoConfig, PeAudioVideoModel

small = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, head_dim=8)
dac = dict(encoder_hidden_size=2, downsampling_ratios=[2, 2], decoder_hidden_size=4, codebook_dim=4, n_codebooks=1,
           codebook_size=8)
vit = dict(architecture="vit_pe_core_large_patch14_336", do_pooling=True, num_classes=16, global_pool="map",
           model_args=dict(embed_dim=16, depth=1, num_heads=2, img_size=28))  # timm tower, shrunk
config = PeAudioVideoConfig(
    text_config=dict(model_type="modernbert", vocab_size=64, hidden_size=16, intermediate_size=32,
                     num_hidden_layers=1, num_attention_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     cls_token_id=1, sep_token_id=2),
    audio_video_config=dict(**small, audio_config=dict(**small, dac_config=dac),
                            video_config=dict(**small, vision_config=vit)),
)
torch.manual_seed(0)
model = PeAudioVideoModel(config).eval()
input_ids = torch.tensor([[1, 5, 6, 2]])
with torch.no_grad():
    control = model(input_ids=input_ids, input_values=torch.randn(1, 1, 64))  # text + mono audio
    assert torch.isfinite(control.audio_plus_text_embeds).all()
    try:
        out = model(input_ids=input_ids)
    except ValueError as e:
        if "At least two of input_ids, pixel_values_videos, or input_values must be provided" not in str(e):
            raise
        print(f"reproduced: one modality: ValueError: {e} (text + audio runs)", file=sys.stderr)
        raise SystemExit(10)
print(f"passes now: PeAudioVideoModel runs on input_ids alone ({type(out).__name__})")
