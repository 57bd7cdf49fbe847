"""What a generation capture learned: the decode plan and, for multimodal models, how the prefill runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch



# prefill + three decode calls; the last two are merged, so every cache length in the decode example is >= 2
# (an encoder-decoder's self-attention cache holds one token before the first decode call, and torch.export
# pins a dim traced at size 1)
CAPTURE_TOKENS = 4
TOKEN_INPUTS = ("input_ids", "decoder_input_ids")
PROJECTOR_NAMES = ("multi_modal_projector", "connector", "embed_vision", "embed_audio")
MODALITIES = ("image", "audio", "video")


@dataclass
class GenerationPlan:
    """How to build each step's kwargs from the previous step's outputs (plain data, no model)."""

    #: kwargs of each component as captured (templates: cache objects give the structure to refill)
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: kwargs that carry the new tokens (concatenated along ``token_dims[name]`` when merging decode calls)
    token_dims: dict[str, int] = field(default_factory=dict)
    #: kwargs that grow by one position per generated token (attention masks)
    growing: dict[str, int] = field(default_factory=dict)
    #: the growing kwargs that count positions (a step without cache takes every position so far): each step
    #: appends the next position, not the attended 1 of a mask
    growing_positions: list[str] = field(default_factory=list)
    #: per-position kwargs generate() extends by repeating the last position and slices to the tokens being
    #: processed (GPT-2's ``token_type_ids``, Idefics' ``image_attention_mask``): each decode step takes the
    #: prompt's last position along ``per_token[name]``
    per_token: dict[str, int] = field(default_factory=dict)
    #: the kwarg holding the token ids fed back each step (``input_ids`` or ``decoder_input_ids``)
    token_input: str = "input_ids"
    #: the component run once on the prompt, and the one run per new token
    prefill: str = "prefill"
    decode: str = "decode"
    #: components run before the prefill, with the (dotted) kwarg their outputs feed: an encoder-decoder's
    #: ``encoder`` -> ``encoder_outputs``; ``image_features`` -> ``mm_encoder_outputs.image``
    encoders: dict[str, str] = field(default_factory=dict)
    #: how many trailing prompt columns generate() returns before the new tokens; -1: the whole prompt, however
    #: long (what decoder-only models return)
    prompt_columns_returned: int = -1
    #: a decoder start token generate() prepends to given decoder ids (1x1), if it does
    start_tokens: torch.Tensor | None = None
    #: generate()'s stopping and padding, as the model's generation config says
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int | None = None
    #: the model's generation config, for the logits processors generate() applies to each step's scores
    #: (forced BOS/EOS tokens, suppressed tokens, n-gram and repetition penalties, minimum lengths)
    generation_config: Any = None
    is_encoder_decoder: bool = False
    #: the generate() input the encoder-side processors read (``main_input_name``: input_ids, input_features, ...)
    main_input_name: str = "input_ids"
    #: the decode cache's leaves before the first token (``{leaf: tensor}``), when the prefill can run as a
    #: decode step over it; kept by ``export_for_generation`` only once the decode program reproduced the
    #: eager prefill on it (see :func:`engine.generation.prefill.empty_cache_leaves`)
    empty_cache: dict[str, torch.Tensor] | None = None
    #: how a multimodal prefill runs through the reference's components (``embed_tokens``, the merge,
    #: ``language_model``, ``lm_head``) instead of a program of its own; kept by ``export_for_generation`` only once
    #: those programs reproduced the eager prefill (see :func:`engine.generation.multimodal_prefill.learn_multimodal_prefill`)
    multimodal_prefill: MultimodalPrefill | None = None
    #: the component run first on the caller's inputs where generate() hands over to a sub-model's generate()
    #: (BLIP-2 encodes the image, then calls ``language_model.generate(inputs_embeds=...)``): its outputs are the
    #: sub-model's generate() inputs, which the other components were captured from
    handover: str | None = None
    #: capture only (the exporter clears it): the last one-token decode call, the decode program's fallback when
    #: the merged two-token step cannot be exported or comes out pinned to two tokens (a Python loop over the
    #: query, an assert on one token)
    one_token_decode: dict[str, Any] | None = None


@dataclass
class MultimodalPrefill:
    """The merge the reference leaves to the caller, learned from one prefill: each modality's feature rows
    replace the embeddings of its placeholder token (``masked_scatter`` order), then ``language_model`` runs on
    the merged embeddings with the prefill's other kwargs and ``lm_head`` reads its ``hidden`` output."""

    #: encoder feed (``mm_encoder_outputs.image``) -> (placeholder token id, the feature field whose rows replace it)
    placeholders: dict[str, tuple[int, str]]
    #: the ``language_model`` output leaf ``lm_head`` reads
    hidden: str
