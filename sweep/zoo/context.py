"""The ground input synthesis stands on: sample sizes, what the recipes read and what the errors taught.

:class:`Context` is what a recipe (:mod:`sweep.zoo.modalities`) reads: the config tree, the model, the generator and
the inputs made so far. :class:`Hints` is what the model's own errors taught
(:mod:`sweep.zoo.input_lessons` writes it, the recipes read it). The forward-signature helpers say which parameters
are ever filled. Kept below the recipes, the input builder and the lessons so that each imports it and none imports
another for a constant.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import torch
from transformers import PreTrainedConfig

BATCH = 2
SEQ = 8
WAVEFORM = 8000
AUDIO_FRAMES = 64
TOKEN_FIELD_SUFFIXES = ("_token_id", "_token_ids", "_token_index", "_token_idx")

# Forward parameters never synthesised: training targets, caches, and alternatives to the ids we do give.
NEVER = {"labels", "past_key_values", "inputs_embeds", "decoder_inputs_embeds", "use_cache", "output_attentions",
         "output_hidden_states", "return_dict", "cache_position", "head_mask", "decoder_head_mask",
         "cross_attn_head_mask", "position_ids", "decoder_position_ids", "kwargs", "return_loss",
         "encoder_outputs", "logits_to_keep", "num_logits_to_keep", "start_positions", "end_positions",
         "next_sentence_label", "mc_labels", "future_values", "mask_labels", "class_labels", "sentence_order_label",
         "output_router_logits", "interpolate_pos_encoding", "bool_masked_pos", "noise", "mm_encoder_outputs"}
# ... unless the forward requires them or the model's own error names them (masked pre-training heads).
WHEN_NEEDED = {"bool_masked_pos"}


@dataclasses.dataclass
class Hints:
    """What the zoo learned from earlier failed attempts."""

    image_tokens: int | None = None
    audio_tokens: int | None = None
    feature_dim: int | None = None  # last dimension input_features must have
    frames: int | None = None  # audio frames the model asked for (a multiple of its window)
    tiles: int | None = None  # image tiles per sample (any-resolution layouts: (B, tiles, C, H, W))
    text_len: int = SEQ
    samples: int | None = None  # waveform length the model asked for (a multiple of its hop)
    image_side: int | None = None  # image side the model asked for (multi-scale patching)
    image_hw: tuple[int, int] | None = None  # (height, width) per image, when images are stacked before patching
    patch_width: int | None = None  # pixels as flattened patches (num_patches, patch_width), as the model asked
    text_width: int | None = None  # hidden size of the text model (some checks count features as numel)
    shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # learned per input
    bounds: dict[str, int] = dataclasses.field(default_factory=dict)  # ids must stay below (an embedding's size)
    extra: tuple[str, ...] = ()  # optional forward parameters the forward turned out to need (see _add_extra)
    tokens: tuple[int, ...] = ()  # special tokens every row must hold ("at least one question token")
    no_cache: bool = False  # the forward failed building its KV cache: run it with use_cache=False
    bool_masks: tuple[str, ...] = ()  # 0/1 mask inputs the model negates or fills with: given as booleans


def forward_parameters(model: torch.nn.Module) -> dict[str, inspect.Parameter]:
    params = inspect.signature(model.forward).parameters
    return {k: p for k, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def required(params: dict[str, inspect.Parameter]) -> set[str]:
    return {k for k, p in params.items() if p.default is inspect.Parameter.empty}


def skipped(name: str, params: dict[str, inspect.Parameter], needed: bool = False) -> bool:
    """Whether a parameter stays unfilled: in NEVER or a training target (``*_labels``), unless it is WHEN_NEEDED
    and required or named as ``needed``. (A required parameter is always filled, by the fallback when no recipe
    makes it.)"""
    never = name in NEVER or name.endswith(("labels", "label"))
    return never and not (name in WHEN_NEEDED and (needed or name in required(params)))


@dataclasses.dataclass
class Context:
    """What a recipe reads: the config tree, the model, the generator, the hints, and the inputs made so far."""

    config: PreTrainedConfig
    model: torch.nn.Module
    gen: torch.Generator
    batch: int
    hints: Hints
    params: dict[str, inspect.Parameter]
    made: dict[str, Any] = dataclasses.field(default_factory=dict)

    # -- config lookups ------------------------------------------------------------------------------------
    def configs(self) -> list[PreTrainedConfig]:
        out, todo = [], [self.config]
        while todo:
            c = todo.pop(0)
            out.append(c)
            for key in getattr(c, "sub_configs", {}) or {}:
                sub = getattr(c, key, None)
                if isinstance(sub, PreTrainedConfig):
                    todo.append(sub)
        return out

    def find(self, *keys: str, where: Callable[[PreTrainedConfig], bool] | None = None, default=None):
        for c in self.configs():
            if where is not None and not where(c):
                continue
            for key in keys:
                value = getattr(c, key, None)
                if value is not None:
                    return value
        return default

    def text_config(self) -> PreTrainedConfig:
        try:
            return self.config.get_text_config(decoder=False)
        except Exception:  # noqa: BLE001 - configs without a text part
            return self.config

    def vision_config(self) -> PreTrainedConfig:
        for c in self.configs():
            if getattr(c, "image_size", None) is not None or getattr(c, "patch_size", None) is not None:
                return c
        return self.config

    def special_ids(self) -> set[int]:
        ids = set()
        for c in self.configs():
            for key, value in c.to_diff_dict().items() if False else vars(c).items():
                if key.endswith(TOKEN_FIELD_SUFFIXES) or key in ("pad_token_id", "padding_idx"):
                    values = value if isinstance(value, (list, tuple)) else [value]
                    ids.update(v for v in values if isinstance(v, int) and not isinstance(v, bool))
        return ids

    def token_ids(self, shape: tuple[int, ...], vocab: int) -> torch.Tensor:
        specials = self.special_ids()
        allowed = torch.tensor([i for i in range(min(vocab, 4096)) if i not in specials] or [0])
        low = allowed[allowed >= 3] if (allowed >= 3).any() else allowed
        idx = torch.randint(0, len(low), shape, generator=self.gen)
        return low[idx]

    def floats(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen)


def model_modalities(model: torch.nn.Module) -> tuple[str, ...]:
    """The modalities a class declares; a bare string (``input_modalities = "audio"``) names one."""
    declared = getattr(model, "input_modalities", ()) or ()
    return (declared,) if isinstance(declared, str) else tuple(declared)


def vocab_size(ctx: Context, decoder: bool = False) -> int:
    try:
        text = ctx.config.get_text_config(decoder=decoder)
    except Exception:  # noqa: BLE001
        text = ctx.config
    return getattr(text, "vocab_size", None) or ctx.find("vocab_size", default=256)


def image_token_id(ctx: Context) -> int | None:
    found = ctx.find("image_token_id", "image_token_index")
    if found is None and "video" in model_modalities(ctx.model):
        found = ctx.find("video_token_id", "video_token_index")  # clips passed as pixel_values (InstructBLIP-Video)
    return found


def image_side(ctx: Context) -> tuple[int, int]:
    if getattr(ctx.hints, "image_hw", None):
        return tuple(ctx.hints.image_hw)
    if getattr(ctx.hints, "image_side", None):
        return ctx.hints.image_side, ctx.hints.image_side
    size = ctx.find("image_size", where=lambda c: c is ctx.vision_config(), default=None)
    if size is None:
        size = ctx.find("image_size", default=64)
    if isinstance(size, dict):
        size = (size.get("height", 64), size.get("width", 64))
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    return int(size), int(size)


def image_channels(ctx: Context) -> int:
    return ctx.find("num_channels", "in_channels", "input_channels", where=lambda c: c is ctx.vision_config(),
                    default=None) or ctx.find("num_channels", default=3)


def text_width(model: torch.nn.Module) -> int | None:
    """The width of the model's token embeddings (of ``inputs_embeds``); None for a model without them."""
    try:
        return int(model.get_input_embeddings().weight.shape[-1])
    except Exception:  # noqa: BLE001 - models without a token embedding
        return None
