"""VoxtralRealtime's generate() caps max_length at the audio's token count, so a prompt as long as the audio cannot grow.

Pattern: `num_audio_tokens = math.ceil(audio_length / self.config.audio_length_per_tok)` in
VoxtralRealtimeForConditionalGeneration._prepare_generation_config (modeling_voxtral_realtime.py:1257-1268 at
transformers 5.24.0; the entry cites 1255-1266) and `generation_config.max_length = min(generation_config.max_length,
num_audio_tokens)` in _prepare_generated_length (modeling_voxtral_realtime.py:1307-1309): with 64 frames of
input_features (8 audio tokens) and an 8-token prompt, max_length is 8 whatever max_new_tokens asks for.
Error: ValueError 'Input length of input_ids is 8, but `max_length` is set to 8'.
Not an upstream bug (by design: the transcript is bounded by the audio; the zoo's input_features are too short)
"""

import sys

import torch
from transformers import VoxtralRealtimeConfig, VoxtralRealtimeForConditionalGeneration

config = VoxtralRealtimeConfig(
    text_config=dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=8, max_position_embeddings=256, sliding_window=32),
    audio_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, head_dim=8,
                      num_mel_bins=8, max_position_embeddings=256, sliding_window=32),
)
torch.manual_seed(0)
model = VoxtralRealtimeForConditionalGeneration(config).eval()
input_ids = torch.randint(3, 64, (2, 8))
input_features = torch.randn(2, 8, 64)  # 64 frames = 8 audio tokens
try:
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                             input_features=input_features, max_new_tokens=8, min_new_tokens=8, do_sample=False)
except ValueError as e:
    if "Input length of input_ids is 8, but `max_length` is set to 8" in str(e):
        print(f"reproduced: ValueError: {str(e).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(10)
    raise
print(f"passes now: generate with max_new_tokens=8 returns {tuple(out.shape)}", file=sys.stderr)
