"""DeepSeek-V4's cache holds compressor buffers whose length changes from step to step, beside its keys and values.

Pattern: DeepseekV4Cache.store_compression_weights (modeling_deepseek_v4.py:203-223 at transformers 5.24.0) concatenates
each step's projected tokens to `buffer_kv[name]`/`buffer_gate[name]`, compresses the longest prefix that is a whole
number of `compress_rate` windows and keeps the remainder: `self.buffer_kv[name] = kv[:, usable:]`. The buffer's
length is the tokens seen so far modulo the compress rate, so each decode step's cache has a buffer one token longer
(or back to 0) than the step before. An exporter that makes only a layer's keys and values grow with the tokens
traces a decode step that takes one buffer length alone.
Shown: the buffer lengths greedy decoding passes to each step's forward, for an 8-token prompt and 4 new tokens.
"""

import sys

import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

config = DeepseekV4Config(
    vocab_size=64, hidden_size=32, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=1, head_dim=8, q_lora_rank=16, num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1,
    max_position_embeddings=128, layer_types=["heavily_compressed_attention", "compressed_sparse_attention"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    mlp_layer_types=["hash_moe", "moe"], sliding_window=16, o_groups=4, o_lora_rank=16, index_n_heads=2,
    index_head_dim=16, index_topk=8, pad_token_id=2, bos_token_id=0, eos_token_id=1, num_nextn_predict_layers=1)
torch.manual_seed(0)
model = DeepseekV4ForCausalLM(config).eval()
lengths = []


def record(module, args, kwargs):
    cache = kwargs.get("cache") if kwargs.get("cache") is not None else kwargs.get("past_key_values")
    buffers = getattr(cache.layers[1], "buffer_kv", None) if cache is not None else None
    lengths.append({name: None if b is None else b.shape[1] for name, b in (buffers or {}).items()})


model.register_forward_pre_hook(record, with_kwargs=True)
with torch.no_grad():
    model.generate(torch.randint(3, 64, (1, 8)), max_new_tokens=4, do_sample=False)
step_lengths = [next(iter(step.values()), None) for step in lengths[1:]]  # the decode steps' inputs
if len(set(step_lengths)) > 1 and None not in step_lengths:
    print(f"reproduced: the compressor buffer a decode step takes is {step_lengths} tokens long, step after step "
          f"(per-step buffers {lengths})", file=sys.stderr)
    raise SystemExit(10)
print(f"passes now: the decode steps take buffers of {step_lengths} tokens", file=sys.stderr)
