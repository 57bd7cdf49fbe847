"""torch.export of Informer's encoder fails: its attention mask keeps the input length after the distilling conv.

Pattern: InformerEncoder.forward builds `attention_mask = create_bidirectional_mask(...)` once for the input length
(informer/modeling_informer.py:837 at transformers 5.24.0), then after each layer `hidden_states = conv_layer(hidden_states)`
(line 858, config.distil: the InformerConvLayer max-pool halves the time length) and passes the same mask to the next
layer, whose InformerProbSparseAttention checks `attention_mask.size() != (bsz, 1, tgt_len, src_len)` (line 543).
In eager without a padding mask the mask is skipped (None); under torch.export transformers materialises it
(masking_utils._ignore_bidirectional_mask_sdpa returns False when exporting), so the check fires, static or dynamic.
Eager with a padding attention_mask fails the same way (a transformers bug, not an export one).
Error: ValueError 'Attention mask should be of size (2, 1, 2, 2), but is torch.Size([2, 1, 4, 4])'.
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import InformerConfig
from transformers.models.informer.modeling_informer import InformerEncoder

config = InformerConfig(prediction_length=2, context_length=4, input_size=1, lags_sequence=[1], num_time_features=1,
                        d_model=8, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, distil=True,
                        attention_type="prob")
torch.manual_seed(0)
encoder = InformerEncoder(config).eval()
kwargs = {"inputs_embeds": torch.randn(2, config.context_length, config.feature_size)}
try:
    ep = torch.export.export(encoder, (), kwargs, strict=False)
except ValueError as e:
    if "Attention mask should be of size" not in str(e):
        raise
    print(f"reproduced: ValueError: {e}", file=sys.stderr)
    raise SystemExit(10)
torch.manual_seed(1)  # ProbSparse attention samples keys with torch.randint: same seed for both runs
out = ep.module()(**kwargs)
torch.manual_seed(1)
torch.testing.assert_close(out, encoder(**kwargs))
print("passes now: the distilled encoder exports and matches eager")
