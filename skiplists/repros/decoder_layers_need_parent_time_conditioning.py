"""VoxtralRealtimeTextModel cannot run on its own: its decoder layers need t_cond, which only its parent computes.

Pattern: every VoxtralRealtimeTextDecoderLayer scales its MLP input by the time conditioning,
`hidden_states = hidden_states * (1 + self.ada_rms_norm(t_cond))` with `t_cond: torch.Tensor | None = None`
(modeling_voxtral_realtime.py:708/728 at transformers 5.24.0), and VoxtralRealtimeTextModel.forward only forwards
**kwargs to its layers; t_cond is computed by VoxtralRealtimeModel.forward (`t_cond = self.time_embedding(time_tensor)`,
:989, passed to language_model at :998; the entry says ForConditionalGeneration). The text model is registered in
MODEL_MAPPING as ("voxtral_realtime_text", "VoxtralRealtimeTextModel") (models/auto/modeling_auto.py:643; the entry
cites 628) though it is not in the module's __all__ (:1314): AutoModel.from_config raises, and the class built from
its modeling module (as the zoo does) fails a plain input_ids forward in ada_rms_norm.linear1 on None. Passing t_cond
(the control) runs.
Error: ValueError 'Could not find VoxtralRealtimeTextModel neither in <module transformers.models.voxtral_realtime>
nor in <module transformers>!' (AutoModel); TypeError "linear(): argument 'input' (position 1) must be Tensor, not
NoneType" (forward).
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import AutoConfig, AutoModel
from transformers.models.voxtral_realtime import modeling_voxtral_realtime

config = AutoConfig.for_model("voxtral_realtime_text", vocab_size=64, hidden_size=16, intermediate_size=32,
                              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                              sliding_window=16)
found = []
try:
    AutoModel.from_config(config)
except ValueError as e:
    if "Could not find VoxtralRealtimeTextModel" not in str(e):
        raise
    found.append(f"AutoModel.from_config: ValueError: {e}")
torch.manual_seed(0)
model = modeling_voxtral_realtime.VoxtralRealtimeTextModel(config).eval()
input_ids = torch.tensor([[1, 5, 6, 7]])
with torch.no_grad():
    control = model(input_ids=input_ids, t_cond=torch.zeros(1, 1, 16)).last_hidden_state  # what the parent passes
    assert torch.isfinite(control).all()
    try:
        out = model(input_ids=input_ids)
        assert torch.isfinite(out.last_hidden_state).all()
    except TypeError as e:
        if "must be Tensor, not NoneType" not in str(e):
            raise
        found.append(f"forward(input_ids): TypeError: {e} (with t_cond it runs)")
if len(found) == 2:
    print("reproduced: " + " | ".join(found), file=sys.stderr)
    raise SystemExit(10)
print(f"passes now (at least in part): only {found or 'nothing'} still fails -- update the entry")
