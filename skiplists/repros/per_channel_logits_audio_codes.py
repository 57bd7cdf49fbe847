"""A token-by-token greedy step cannot pick Dia's next tokens: its logits are per audio channel, (batch * channels, seq, vocab).

Pattern: `audio_logits = self.logits_dense(last_hidden_state).view((batch_size, -1, self.num_channels, self.vocab_size))
.transpose(1, 2).contiguous().view(batch_size * self.num_channels, -1, self.vocab_size)` (modeling_dia.py:832-838
at transformers 5.24.0), with 3-D decoder_input_ids (batch, seq, channels) and a delay pattern / EOS-channel
handled by Dia's own generate (generation_dia.py:59-136). A step that argmaxes the last position and masks finished
rows, as GenerationMixin's greedy loop does, gets batch * channels tokens for batch rows.
Error: RuntimeError 'The size of tensor a (18) must match the size of tensor b (2)' (2 rows, 18 = 2 x 9 channels).
Not an upstream bug (by design: audio-code decoding is out of a token-by-token loop's scope, not an upstream bug)
"""

import sys

import torch
from transformers import DiaConfig, DiaForConditionalGeneration

channels = 9
config = DiaConfig(
    encoder_config=dict(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                        intermediate_size=32, vocab_size=64, max_position_embeddings=64),
    decoder_config=dict(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=8, cross_num_attention_heads=2, cross_head_dim=8,
                        cross_num_key_value_heads=2, cross_hidden_size=16, vocab_size=40, num_channels=channels,
                        max_position_embeddings=64, pad_token_id=37, eos_token_id=36, bos_token_id=38),
    delay_pattern=list(range(channels)),
)
torch.manual_seed(0)
model = DiaForConditionalGeneration(config).eval()
batch = 2
input_ids = torch.randint(0, 64, (batch, 5))
decoder_input_ids = torch.full((batch, 1, channels), 38)
with torch.no_grad():
    logits = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits
print(f"decoder_input_ids {tuple(decoder_input_ids.shape)} -> logits {tuple(logits.shape)}", file=sys.stderr)

# GenerationMixin._sample's step: one token per row, finished rows padded
next_tokens = logits[:, -1, :].argmax(-1)
unfinished_sequences = torch.ones(batch, dtype=torch.long)
try:
    next_tokens = next_tokens * unfinished_sequences + config.decoder_config.pad_token_id * (1 - unfinished_sequences)
except RuntimeError as e:
    if "must match the size of tensor b" in str(e) and logits.shape[0] == batch * channels:
        print(f"reproduced: RuntimeError: {e} (logits rows {logits.shape[0]} = {batch} x {channels} channels)",
              file=sys.stderr)
        raise SystemExit(10)
    raise
assert next_tokens.shape == (batch,), next_tokens.shape
print("passes now: Dia's step gives one token per row")
