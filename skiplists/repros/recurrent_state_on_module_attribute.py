"""An exported RecurrentGemma step drops its recurrent state: the forward keeps it on module attributes and returns no cache.

Pattern: RecurrentGemmaRecurrentBlock.forward assigns `self.conv1d_state = nn.functional.pad(x_branch, ...)` /
`self.conv1d_state = conv_state[:, :, 1:]` and `self.rg_lru.recurrent_states = ...` (modeling_recurrent_gemma.py:434-451,
338 at transformers 5.24.0; the entry cites 448), and RecurrentGemmaForCausalLM.forward returns
`CausalLMOutput(loss=..., logits=..., ...)` with no past_key_values (modeling_recurrent_gemma.py:752). torch.export
warns the attributes "were assigned during export" and the program's only output is the logits, so an exported
prefill gives the next (decode) step no state to start from.
Error: UserWarning 'The tensor attributes ...conv1d_state... were assigned during export'; the program has 1 output.
Tracker: huggingface/transformers
"""

import sys
import warnings

import torch
from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM

config = RecurrentGemmaConfig(num_hidden_layers=3, vocab_size=64, hidden_size=16, intermediate_size=32,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=8, lru_width=16,
                              attention_window_size=8, conv1d_width=4,
                              block_types=("recurrent", "recurrent", "attention"))
torch.manual_seed(0)
model = RecurrentGemmaForCausalLM(config).eval()
ids = torch.randint(0, 64, (2, 6))
with torch.no_grad():
    eager = model(ids, use_cache=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ep = torch.export.export(model, (ids,), {"use_cache": True}, strict=False)
outputs = [s for s in ep.graph_signature.output_specs if s.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT]
assigned = [str(w.message) for w in caught if "were assigned during export" in str(w.message)]
if not {"cache", "past_key_values"} & set(eager.keys()) and len(outputs) == 1 and assigned \
        and "conv1d_state" in assigned[0]:
    print(f"reproduced: forward returns {type(eager).__name__}{list(eager.keys())}; the exported step has "
          f"{len(outputs)} output; UserWarning: {assigned[0][:160]}...", file=sys.stderr)
    raise SystemExit(10)
print(f"passes now: the exported step returns {len(outputs)} outputs (its recurrent state) and no state is left "
      f"on the module", file=sys.stderr)
