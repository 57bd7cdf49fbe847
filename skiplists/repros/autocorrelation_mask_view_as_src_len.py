"""torch.export cannot trace AutoformerModel at any shape: the encoder mask export builds is added with a wrong view.

Pattern: AutoformerEncoder builds `attention_mask = create_bidirectional_mask(...)` (modeling_autoformer.py:852),
which is None in eager (all-ones mask skipped) but materialised under torch.export (masking_utils.py:353 does not
skip while exporting). AutoformerAttention then adds it with
`attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + attention_mask` (modeling_autoformer.py:517)
while the autocorrelation weights are (bsz * num_heads, tgt_len, head_dim): the view is valid only if head_dim ==
src_len. Static shapes fail the same way, so it is not the dynamic time dims the entry blames.
Error: RuntimeError "shape '[2, 2, 8, 8]' is invalid for input of size 128" (with a symbolic batch
"shape '[s11, 2, 8, 8]' is invalid for input of size 64*s11").
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import AutoformerConfig, AutoformerModel

config = AutoformerConfig(prediction_length=4, context_length=8, lags_sequence=[1, 2], num_time_features=1,
                          d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, label_length=4)
torch.manual_seed(0)
model = AutoformerModel(config).eval()
past = config.context_length + max(config.lags_sequence)
kwargs = dict(past_values=torch.randn(2, past), past_time_features=torch.randn(2, past, 1),
              past_observed_mask=torch.ones(2, past), future_values=torch.randn(2, 4),
              future_time_features=torch.randn(2, 4, 1))
with torch.no_grad():
    expected = model(**kwargs).last_hidden_state  # eager runs: its encoder mask is None
try:
    ep = torch.export.export(model, (), kwargs, strict=False)
except RuntimeError as e:
    if "is invalid for input of size" not in str(e):
        raise
    print(f"reproduced: RuntimeError: {str(e).splitlines()[0]}", file=sys.stderr)
    raise SystemExit(10)
torch.testing.assert_close(ep.module()(**kwargs).last_hidden_state, expected)
print("passes now: AutoformerModel exports and matches eager")
