"""Twelve tiny random architectures for the exporter tests, written by hand.

Each entry builds a model in eval mode and sample inputs at two shapes: ``trace`` (what the model is
exported with; batch 2 so torch.export does not specialise the batch dim) and ``run`` (a different batch
and sequence length / image count, inside what the architecture allows) to prove dynamic shapes.
The sweep's zoo synthesises configs for every class; these stay hand-written so engine tests do not
depend on the zoo.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import copy

import torch
import transformers as tf


@dataclass(frozen=True)
class TinyModel:
    name: str
    build: Callable[[], torch.nn.Module]
    make_inputs: Callable[[int, int, int], dict]  # (batch, length, seed) -> inputs
    trace_shape: tuple[int, int] = (2, 7)
    run_shape: tuple[int, int] = (3, 5)
    #: input dims that the architecture fixes (torch.export specialises them; the report warns)
    fixed_dims: tuple[str, ...] = field(default=())

    def model(self) -> torch.nn.Module:
        torch.manual_seed(0)
        return self.build().eval()

    def inputs(self, which: str = "trace", seed: int = 0) -> dict:
        batch, length = self.trace_shape if which == "trace" else self.run_shape
        return self.make_inputs(batch, length, seed)


VOCAB = 96


def eager_leaves(model: torch.nn.Module, inputs: dict) -> dict:
    """Eager outputs as ``{leaf name: tensor}``; the inputs are copied (an eager forward mutates caches)."""
    from engine import get_leaf_tensors

    with torch.no_grad():
        return get_leaf_tensors(model(**copy.deepcopy(inputs)))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _text(batch: int, length: int, seed: int, vocab: int = VOCAB, **extra) -> dict:
    g = _gen(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, : length // 3] = 0  # left padding on one row exercises the mask path
    return {"input_ids": torch.randint(0, vocab, (batch, length), generator=g), "attention_mask": mask, **extra}


def _pixels(batch: int, seed: int, size: int = 32, channels: int = 3) -> torch.Tensor:
    return torch.randn(batch, channels, size, size, generator=_gen(seed + 1))


_DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=128)

TINY_MODELS: dict[str, TinyModel] = {
    m.name: m
    for m in [
        TinyModel(
            "llama",
            lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**_DECODER, num_attention_heads=4, num_key_value_heads=2, head_dim=8)),
            _text,
        ),
        TinyModel(
            "gpt2",
            lambda: tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128)),
            _text,
        ),
        TinyModel(
            "qwen3",
            lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(**_DECODER, num_attention_heads=4, num_key_value_heads=2, head_dim=8)),
            _text,
        ),
        TinyModel(
            "gemma3_text",
            lambda: tf.Gemma3ForCausalLM(
                tf.Gemma3TextConfig(
                    **{**_DECODER, "num_hidden_layers": 3},
                    num_attention_heads=4,
                    num_key_value_heads=1,
                    head_dim=8,
                    sliding_window=4,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                )
            ),
            _text,
            trace_shape=(2, 9),
            run_shape=(3, 6),
        ),
        TinyModel(
            "mixtral",
            lambda: tf.MixtralForCausalLM(
                tf.MixtralConfig(**_DECODER, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2)
            ),
            _text,
        ),
        TinyModel(
            "mamba2",
            lambda: tf.Mamba2ForCausalLM(
                tf.Mamba2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_heads=8, head_dim=8, expand=2, n_groups=1, state_size=8, chunk_size=4, conv_kernel=4)
            ),
            lambda b, n, s: {"input_ids": _text(b, n, s)["input_ids"]},
        ),
        TinyModel(
            "bert",
            lambda: tf.BertForMaskedLM(tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=128)),
            lambda b, n, s: _text(b, n, s, token_type_ids=torch.zeros(b, n, dtype=torch.long)),
        ),
        TinyModel(
            "t5",
            lambda: tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0)),
            lambda b, n, s: _text(b, n, s, decoder_input_ids=torch.randint(0, VOCAB, (b, max(n - 2, 2)), generator=_gen(s + 7))),
        ),
        TinyModel(
            "whisper",
            lambda: tf.WhisperForConditionalGeneration(
                tf.WhisperConfig(
                    vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                    encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16, max_target_positions=64,
                    decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                    begin_suppress_tokens=None, suppress_tokens=None,
                )
            ),
            lambda b, n, s: {
                "input_features": torch.randn(b, 8, 32, generator=_gen(s)),
                "decoder_input_ids": torch.randint(0, VOCAB, (b, n), generator=_gen(s + 1)),
            },
            fixed_dims=("input_features dim 2",),  # the encoder requires 2 * max_source_positions frames
        ),
        TinyModel(
            "vit",
            lambda: tf.ViTForImageClassification(tf.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_labels=3)),
            # channels, height and width are the config's image_size: dynamic=True keeps them static
            lambda b, n, s: {"pixel_values": _pixels(b, s)},
        ),
        TinyModel(
            "convnext",
            lambda: tf.ConvNextForImageClassification(tf.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_labels=3)),
            # any multiple of 32 px works, but the last stage must stay above 1x1 (torch.export assumes a
            # dim traced at 2 is never 1, so a 64 px trace accepts >= 64 px)
            lambda b, n, s: {"pixel_values": _pixels(b, s, size=8 * n)},
            trace_shape=(2, 8),
            run_shape=(3, 12),
            fixed_dims=("pixel_values dim 1",),  # channels
        ),
        TinyModel(
            "clip",
            lambda: tf.CLIPModel(
                tf.CLIPConfig(
                    text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32),
                    vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
                    projection_dim=16,
                )
            ),
            # text count (batch) and image count (length // 2) vary independently
            lambda b, n, s: _text(b, n, s) | {"pixel_values": _pixels(max(n // 2, 2), s)},
        ),
    ]
}


# ─── Generative extras (not part of the twelve exporter architectures) ─────────────────────────────

IMAGE_TOKEN = VOCAB - 1
IMAGE_TOKENS = 16  # (32 px / 8 px patches) ** 2, the CLS token is dropped by the default feature selection


def _llava_inputs(batch: int, length: int, seed: int) -> dict:
    text = _text(batch, length, seed, vocab=VOCAB - 1)
    ids = torch.cat([text["input_ids"][:, :1], torch.full((batch, IMAGE_TOKENS), IMAGE_TOKEN), text["input_ids"][:, 1:]], dim=1)
    mask = torch.cat([torch.ones(batch, IMAGE_TOKENS + 1, dtype=torch.long), text["attention_mask"][:, 1:]], dim=1)
    mask[0, :2] = 0  # keep one padded row (the image tokens stay attended)
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": _pixels(batch, seed)}


GENERATIVE_EXTRAS: dict[str, TinyModel] = {
    "llava": TinyModel(
        "llava",
        lambda: tf.LlavaForConditionalGeneration(
            tf.LlavaConfig(
                vision_config=tf.CLIPVisionConfig(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
                text_config=tf.LlamaConfig(**_DECODER, num_attention_heads=4, num_key_value_heads=2, head_dim=8),
                image_token_index=IMAGE_TOKEN,
                vision_feature_layer=-1,
                projector_hidden_act="gelu",
            )
        ),
        _llava_inputs,
    ),
}


#: The models each lowering backend runs in CI; ``-m slow`` runs the rest. Dynamo runs all twelve; the smoke sweep
#: runs each family's zoo class through both lowerings, so CI lowers here one decoder and one vision model to
#: ExecuTorch, and a decoder, a mixture of experts and an encoder-decoder to ONNX.
CI_LOWERING = {
    "executorch": ("gpt2", "vit"),
    "onnx": ("llama", "mixtral", "whisper"),
}


def ci_cover(names, in_ci) -> list:
    """``names`` as pytest params, the ones outside ``in_ci`` marked ``slow`` (left out of ``./dev test``)."""
    import pytest

    return [pytest.param(n, marks=() if n in in_ci else pytest.mark.slow) for n in names]


# ─── Small widths at real limits (ExecuTorch's default memory planning) ────────────────────────────

_SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16)
_JAMBA = dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=2,
              mamba_d_state=8)

#: small-width models whose configs keep the position limits and windows of the released checkpoints (Mistral
#: 32k, Gemma 2 8k, Gemma 3 128k, Jamba 256k; Mamba states none), traced at batch 13 and 7 tokens: the zoo's
#: shrunken configs never show what ExecuTorch plans for such limits
REAL_LIMIT_MODELS: dict[str, TinyModel] = {
    m.name: m
    for m in [
        TinyModel("mistral", lambda: tf.MistralForCausalLM(tf.MistralConfig(**_SMALL, max_position_embeddings=32768, sliding_window=4096)),
                  _text, (13, 7), (3, 12)),
        TinyModel("gemma2", lambda: tf.Gemma2ForCausalLM(tf.Gemma2Config(**_SMALL, max_position_embeddings=8192, sliding_window=4096)),
                  _text, (13, 7), (3, 12)),
        TinyModel("gemma3", lambda: tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**_SMALL, max_position_embeddings=131072, sliding_window=512)),
                  _text, (13, 7), (3, 12)),
        TinyModel("jamba", lambda: tf.JambaForCausalLM(tf.JambaConfig(**_SMALL, **_JAMBA, max_position_embeddings=262144)),
                  _text, (13, 7), (3, 12)),
        TinyModel("mamba", lambda: tf.MambaForCausalLM(tf.MambaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, state_size=8)),
                  _text, (13, 7), (3, 12)),
    ]
}
