"""XLM, XLNet and Reformer generate() build per-step inputs/caches that are not prompt-then-one-token steps of fixed structure.

Pattern: each overrides prepare_inputs_for_generation (transformers 5.24.0; the entry cites xlm 950-953, xlnet 1235,
reformer 2277-2281):
- XLM (modeling_xlm.py:931-944): `mask_token = torch.full((effective_batch_size, 1), mask_token_id, ...)`;
  `input_ids = torch.cat([input_ids, mask_token], dim=1)`, with no cache: every step runs the whole sequence plus a mask
  token (9, 10, 11 tokens for an 8-token prompt), not one new token;
- XLNet (modeling_xlnet.py:1248-1297): `input_ids = torch.cat([input_ids[:, -offset:], dummy_token], dim=1)` with
  offset = 2 and a perm_mask/target_mapping rebuilt around it each step (perm_mask (b, 9, 9) at the prefill,
  (b, 3, 3) after);
- Reformer: ReformerDynamicCache.update appends to buckets_cache on every step of a local-attention layer
  (`self.buckets_cache.append(torch.tensor([], ...))`, modeling_reformer.py:127-129, in the `else` of
  `if buckets is not None`, lines 122-129), so the cache's per-layer list grows from step to step (4 entries for
  4 layers after the prefill, 6 after one decode step) and no step's cache has the leaves of the next.
Error: the step inputs and cache structure above, recorded from eager generate() of tiny configs.
Tracker: huggingface/transformers
"""

import sys

import torch
from transformers import (ReformerConfig, ReformerModelWithLMHead, XLMConfig, XLMWithLMHeadModel, XLNetConfig,
                          XLNetLMHeadModel)

PROMPT = 8


def steps_of(model, names):
    steps = []

    def record(module, args, kwargs):
        step = {n: tuple(kwargs[n].shape) for n in names if torch.is_tensor(kwargs.get(n))}
        cache = kwargs.get("past_buckets_states")
        if cache is not None:
            step["buckets_cache"], step["states_cache"] = len(cache.buckets_cache), len(cache.states_cache)
        steps.append(step)

    model.register_forward_pre_hook(record, with_kwargs=True)
    with torch.no_grad():
        model.generate(input_ids=torch.randint(6, 64, (2, PROMPT)), max_new_tokens=3, do_sample=False)
    return steps


torch.manual_seed(0)
found = []
xlm = XLMWithLMHeadModel(XLMConfig(vocab_size=64, emb_dim=16, n_layers=1, n_heads=2, max_position_embeddings=64,
                                   mask_token_id=5, pad_token_id=2, bos_token_id=0, eos_token_id=1)).eval()
steps = steps_of(xlm, ["input_ids"])
lengths = [s["input_ids"][1] for s in steps]
if lengths[1] != 1:
    found.append(f"XLM step input_ids lengths {lengths} (prompt {PROMPT}: the sequence so far plus a mask token)")

xlnet = XLNetLMHeadModel(XLNetConfig(vocab_size=64, d_model=16, n_layer=1, n_head=2, d_inner=32, pad_token_id=5,
                                     bos_token_id=1, eos_token_id=2)).eval()
steps = steps_of(xlnet, ["input_ids", "perm_mask"])
if steps[1].get("perm_mask") is not None and steps[1]["input_ids"][1] != 1:
    found.append(f"XLNet step input_ids/perm_mask {[(s['input_ids'], s['perm_mask']) for s in steps]} "
                 f"(offset-2 window plus a dummy token, perm_mask rebuilt each step)")

layers = ["local", "lsh", "local", "lsh"]
reformer = ReformerModelWithLMHead(ReformerConfig(
    vocab_size=64, hidden_size=16, attention_head_size=8, num_attention_heads=2, feed_forward_size=32,
    attn_layers=layers, axial_pos_embds=False, max_position_embeddings=64, local_attn_chunk_length=4,
    lsh_attn_chunk_length=4, num_buckets=2, is_decoder=True, pad_token_id=0, eos_token_id=1)).eval()
steps = steps_of(reformer, ["input_ids"])
sizes = [s["buckets_cache"] for s in steps if "buckets_cache" in s]
if len(set(sizes)) > 1:
    found.append(f"Reformer buckets_cache lengths per decode step {sizes} for {len(layers)} layers "
                 f"(states_cache {[s['states_cache'] for s in steps if 'states_cache' in s]})")

if found:
    print("reproduced: " + "; ".join(found), file=sys.stderr)
    raise SystemExit(10)
print("passes now: every step after the prefill takes one new token and a cache of fixed structure", file=sys.stderr)
