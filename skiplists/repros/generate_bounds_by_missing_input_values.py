"""Kyutai speech-to-text generate() fails without raw audio: it bounds max_new_tokens by input_values.shape[-1].

Pattern: `input_values = kwargs.get("input_values")` then
`max_audio_frames = input_values.shape[-1] // self.config.codec_config.frame_size`
(KyutaiSpeechToTextForConditionalGeneration.generate, modeling_kyutai_speech_to_text.py:905-909 at transformers 5.24.0;
the entry cites 901-905). Called with the forward's inputs (audio-token input_ids (batch, seq, codebooks + 1) and
attention_mask), as the zoo's sample does, input_values is None.
Error: AttributeError "'NoneType' object has no attribute 'shape'" raised in that generate().
Tracker: huggingface/transformers
"""

import sys
import traceback

import torch
from transformers import KyutaiSpeechToTextConfig, KyutaiSpeechToTextForConditionalGeneration

config = KyutaiSpeechToTextConfig(
    codebook_vocab_size=33, vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=2, ffn_dim=32, num_codebooks=8, audio_bos_token_id=32, audio_pad_token_id=60, pad_token_id=3,
    bos_token_id=4, max_position_embeddings=64, sliding_window=16,
    codec_config=dict(model_type="mimi", hidden_size=16, num_filters=4, num_residual_layers=1, upsampling_ratios=[4, 2],
                      codebook_size=32, codebook_dim=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=8, intermediate_size=32, num_quantizers=8,
                      num_semantic_quantizers=1, sliding_window=16, max_position_embeddings=64, upsample_groups=16),
)
torch.manual_seed(0)
model = KyutaiSpeechToTextForConditionalGeneration(config).eval()
input_ids = torch.randint(0, 32, (2, 8, config.num_codebooks + 1))
try:
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones(2, 8, dtype=torch.long), max_new_tokens=2)
except AttributeError as e:
    where = traceback.extract_tb(e.__traceback__)[-1]
    if "'NoneType' object has no attribute 'shape'" in str(e) and where.name == "generate" \
            and "input_values" in (where.line or ""):
        print(f"reproduced: AttributeError: {e} at {where.filename.rsplit('/', 1)[-1]}:{where.lineno} "
              f"`{where.line}`", file=sys.stderr)
        raise SystemExit(10)
    raise
print(f"passes now: generate without input_values returns {tuple(out.shape)}", file=sys.stderr)
