"""Pop2Piano's generate() cannot start from token inputs: it requires the feature extractor's input_features.

Pattern: `def generate(self, input_features, attention_mask=None, composer="composer1", generation_config=None,
**kwargs)` (Pop2PianoForConditionalGeneration.generate, modeling_pop2piano.py:958-964 at transformers 5.24.0; the
entry cites 954-956), while its forward takes T5-style input_ids/attention_mask. Called with the forward's inputs, as
the zoo's generation sample does, input_features is missing.
Error: TypeError "generate() missing 1 required positional argument: 'input_features'".
Not an upstream bug (generate()'s documented signature; the zoo's inputs are the cause)
"""

import sys

import torch
from transformers import Pop2PianoConfig, Pop2PianoForConditionalGeneration

config = Pop2PianoConfig(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                         relative_attention_num_buckets=8, relative_attention_max_distance=16)
torch.manual_seed(0)
model = Pop2PianoForConditionalGeneration(config).eval()
input_ids = torch.randint(0, 64, (2, 8))
with torch.no_grad():
    logits = model(input_ids=input_ids, decoder_input_ids=input_ids[:, :1]).logits  # the forward runs on tokens
try:
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=2)
except TypeError as e:
    if "missing 1 required positional argument: 'input_features'" in str(e):
        print(f"reproduced: TypeError: {e} (the forward gave logits {tuple(logits.shape)})", file=sys.stderr)
        raise SystemExit(10)
    raise
print(f"passes now: generate from input_ids returns {tuple(out.shape)}", file=sys.stderr)
