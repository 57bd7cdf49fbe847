"""MusicgenForCausalLM.generate feeds only the last prompt column to its first step: the pre-created cache trips its slice.

Pattern: `if cache is not None: input_ids = input_ids[:, -1:]` in MusicgenForCausalLM.prepare_inputs_for_generation
(modeling_musicgen.py:794-795 at transformers 5.24.0), after generate() has already built an empty cache for the first
step (the regression of huggingface/transformers#43679 that #48679 fixed for MusicgenMelody, whose
prepare_inputs_for_generation uses is_first_iteration/next_sequence_length at 5.24.0; Musicgen's still has the guard).
The prompt's other columns never reach the model, and a prefill captured from generate() is traced at 1 token, so
it refuses the 8-token prompt (the entry puts the cut on build_delay_pattern_mask, modeling_musicgen.py:1024, which
returns all 8 columns of a prompt without -1 entries; it re-applies the delay pattern before every step, line 785).
Error: the first forward of generate(input_ids with 8 columns) gets 1 column over an empty cache, and its logits do not
change when every prompt token but the 4 of that column (codebook k's token 7 - k, after the delay) does.
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import MusicgenDecoderConfig, MusicgenForCausalLM

num_codebooks, batch, prompt = 4, 2, 8
config = MusicgenDecoderConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32,
                               max_position_embeddings=64, num_codebooks=num_codebooks, pad_token_id=32,
                               bos_token_id=32, decoder_start_token_id=32)
torch.manual_seed(0)
model = MusicgenForCausalLM(config).eval()
model.generation_config.pad_token_id = model.generation_config.decoder_start_token_id = 32
first_steps = []


def before(module, args, kwargs):
    cache = kwargs.get("cache")
    first_steps.append([tuple(kwargs["input_ids"].shape), cache.get_seq_length() if cache is not None else None])


def after(module, args, kwargs, output):
    first_steps[-1].append(output.logits)
    raise StopIteration  # one step is enough


model.register_forward_pre_hook(before, with_kwargs=True)
model.register_forward_hook(after, with_kwargs=True)
input_ids = torch.randint(0, 32, (batch * num_codebooks, prompt))
# another prompt, equal only where the delay pattern puts the last column: codebook k's token prompt - 1 - k
other_prompt = (input_ids + 1) % 32
rows = torch.arange(batch * num_codebooks)
keep = prompt - 1 - rows % num_codebooks
other_prompt[rows, keep] = input_ids[rows, keep]
for ids in (input_ids, other_prompt):
    try:
        with torch.no_grad():
            model.generate(input_ids=ids, max_new_tokens=3, do_sample=False, num_return_sequences=1)
    except StopIteration:
        pass
(shape, past, logits), (_, _, other_logits) = first_steps
print(f"prompt {tuple(input_ids.shape)}: first step input_ids {shape} over a cache of {past} tokens", file=sys.stderr)
diff = (logits - other_logits).abs().max().item()
if shape[-1] != prompt:
    assert past == 0 and diff == 0, f"a cut of another kind: cache length {past}, logits {diff:.2e} apart"
    print(f"reproduced: generate's first step sees {shape[-1]} of the {prompt} prompt columns (cache length {past}); "
          f"its logits are the same ({diff:.1e} apart) for two prompts that share only that column",
          file=sys.stderr)
    raise SystemExit(10)
print("passes now: generate's first step runs on the whole prompt", file=sys.stderr)
