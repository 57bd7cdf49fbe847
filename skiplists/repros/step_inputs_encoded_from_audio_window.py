"""Kyutai speech-to-text's decode steps take audio codes that prepare_inputs_for_generation encodes from the waveform.

Pattern: KyutaiSpeechToTextForConditionalGeneration.prepare_inputs_for_generation (modeling_kyutai_speech_to_text.py:
815-860 at transformers 5.24.0) builds each step's input_ids as (batch, 1, 1 + codebooks): the generated text token
and the current audio frame's codes, which it reads from `audio_tokens` and refills by running the Mimi codec over the
next window of `input_values` whenever the step passes the current window. A step's inputs are therefore not the
previous step's token alone: a loop over exported steps must run that codec window and frame indexing between them.
Shown: step k of eager generate() takes the codec's codes of audio frame k - 1, the text token being one column.
"""

import sys

import torch
from transformers import KyutaiSpeechToTextConfig, KyutaiSpeechToTextForConditionalGeneration

config = KyutaiSpeechToTextConfig(
    codebook_vocab_size=64, vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
    num_key_value_heads=4, head_dim=8, ffn_dim=64, num_codebooks=8, audio_bos_token_id=63, audio_pad_token_id=61,
    pad_token_id=3, bos_token_id=62, max_position_embeddings=128, sliding_window=64,
    codec_config=dict(model_type="mimi", hidden_size=32, num_filters=8, num_residual_layers=1,
                      upsampling_ratios=[8, 6, 5, 4], codebook_size=64, codebook_dim=32, num_quantizers=8,
                      vector_quantization_hidden_dimension=32, num_semantic_quantizers=1, upsample_groups=32,
                      num_hidden_layers=1, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
                      head_dim=8, max_position_embeddings=128, sliding_window=64),
)
torch.manual_seed(0)
model = KyutaiSpeechToTextForConditionalGeneration(config).eval()
for module in model.codec_model.modules():  # codebooks of distinct random vectors (they start as zeros)
    if hasattr(module, "embed_sum"):
        module.embed_sum.normal_()
steps = []
model.register_forward_pre_hook(lambda module, args, kwargs: steps.append(kwargs["input_ids"].clone()), with_kwargs=True)
waveform = torch.randn(2, 1, 8 * config.frame_size) * 10
with torch.no_grad():
    model.generate(input_values=waveform, max_new_tokens=4, do_sample=False)
    frames = model.codec_model.encode(waveform).audio_codes  # (batch, codebooks, frames)
codes = [step[:, -1, 1:] for step in steps]  # step k > 0 takes frame k - 1; step 0 the audio BOS
if all(step.ndim == 3 and step.shape[-1] == 1 + config.num_codebooks for step in steps) \
        and all(torch.equal(c, frames[:, :, k - 1]) for k, c in enumerate(codes) if k) and len(steps) > 2:
    print(f"reproduced: {len(steps)} steps of input_ids {[tuple(s.shape) for s in steps]}, step k carrying the "
          f"codec's codes of audio frame k - 1 beside the text token (row 0: {[c[0].tolist()[:3] for c in codes]})",
          file=sys.stderr)
    raise SystemExit(10)
print(f"passes now: the steps take {[tuple(s.shape) for s in steps]}, no per-step audio codes", file=sys.stderr)
