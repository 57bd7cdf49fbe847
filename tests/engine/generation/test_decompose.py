"""The generation decomposition (:mod:`engine.generation.decompose`): component names, the captured calls a decode step is
merged from, the empty cache a decode program computes the prefill over, and the multimodal prefill learned as
embeddings + merge + language model + head."""

from __future__ import annotations

import copy

import pytest
import torch

from engine import ModelError, decompose_multimodal, decompose_prefill_decode
from tests.engine.generation.test_loop import MODELS, generation_inputs


def test_component_names():
    model = MODELS["llava"].model()
    parts = decompose_multimodal(model, MODELS["llava"].inputs())
    assert list(parts) == ["image_encoder", "multi_modal_projector", "language_model", "lm_head"]
    steps = decompose_prefill_decode(MODELS["t5"].model(), generation_inputs("t5", 0, "dynamic", None))
    assert list(steps) == ["encoder", "prefill", "decode"]
    decode = steps["decode"][1]
    assert decode["decoder_input_ids"].shape[-1] == 2, "decode is captured with two new tokens (symbolic query)"


def test_model_without_generate_is_rejected():
    with pytest.raises(ModelError, match="has no generate"):
        decompose_prefill_decode(torch.nn.Linear(2, 2), {"input": torch.zeros(1, 2)})


def test_not_multimodal_is_a_value_error():
    with pytest.raises(ValueError, match="not a multimodal model"):
        decompose_multimodal(MODELS["llama"].model(), MODELS["llama"].inputs())


# ── Prefill served by the decode program ─────────────────────────────────────────────────────────

def _dynamic_cache(length: int):
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.randn(2, 2, length, 4), torch.randn(2, 2, length, 4), 0)
    return cache


def test_empty_cache_leaves_zero_the_growing_dim():
    from engine.generation.prefill import empty_cache_leaves

    empty = empty_cache_leaves(None, _dynamic_cache(5), _dynamic_cache(6))
    assert {k: tuple(v.shape) for k, v in empty.items()} == {"0.keys": (2, 2, 0, 4), "0.values": (2, 2, 0, 4)}


def test_empty_cache_leaves_propose_zeros_for_a_fixed_state():
    """A leaf that neither grows nor was there at the prefill (a static cache's buffers, allocated zeroed at its
    first update) is proposed as zeros; a leaf whose shape changed since the prefill leaves the answer open."""
    from engine.generation.prefill import empty_cache_leaves

    fixed = empty_cache_leaves(None, _dynamic_cache(5), _dynamic_cache(5))
    assert {k: (tuple(v.shape), bool(v.any())) for k, v in fixed.items()} == {"0.keys": ((2, 2, 5, 4), False),
                                                                           "0.values": ((2, 2, 5, 4), False)}
    assert empty_cache_leaves(_dynamic_cache(3), _dynamic_cache(5), _dynamic_cache(5)) is None


def test_a_submodule_call_keeps_only_the_keywords_its_forward_declares():
    """GOT-OCR2 hands its Qwen2Model ``logits_to_keep``, which the model's typed ``**kwargs`` does not list."""
    from engine.generation.decompose import _declared

    language_model = MODELS["llama"].model().model
    ids = torch.zeros(1, 3, dtype=torch.long)
    assert _declared(language_model, {"input_ids": ids, "logits_to_keep": 1, "output_attentions": False}) == \
        {"input_ids": ids, "output_attentions": False}


# ── Prefill served by the reference's multimodal components ──────────────────────────────────────

def _llava_parts():
    from engine.generation.decompose import decompose_for_generation
    from engine.generation.plan import GenerationPlan

    model = MODELS["llava"].model()
    plan = GenerationPlan()
    return model, decompose_for_generation(model, generation_inputs("llava", 0, "dynamic", model), plan), plan


def test_llava_prefill_is_learned_as_embeddings_merge_language_model_and_head():
    """The image rows replace the image token's embeddings (LLaVA's masked_scatter), the language model is captured
    with the prefill's cache and positions (the capture prompt is left-padded: positions are not an arange), and
    ``lm_head`` reads its last hidden state."""
    model, parts, plan = _llava_parts()
    route = plan.multimodal_prefill
    assert route is not None and route.hidden == "last_hidden_state"
    assert route.placeholders == {"mm_encoder_outputs.image": (model.config.image_token_id, "pooler_output")}
    assert "embed_tokens" in parts and "position_ids" in parts["language_model"][1]


def test_a_merge_that_does_not_reproduce_the_language_models_inputs_is_not_learned():
    """Positions the language model does not share with the prefill, or features that do not fill the placeholder
    rows, leave the prefill to a program of its own."""
    from engine.generation.multimodal_prefill import learn_multimodal_prefill

    model, parts, plan = _llava_parts()
    lm, kwargs = parts["language_model"]
    shifted = {**parts, "language_model": (lm, {**kwargs, "position_ids": kwargs["position_ids"] + 1})}
    assert learn_multimodal_prefill(model, shifted, plan) is None
    prefill = parts["prefill"][1]
    features = prefill["mm_encoder_outputs"]["image"]
    fewer = copy.copy(features)
    fewer["pooler_output"] = features["pooler_output"][:1]  # one image's rows for two images' placeholders
    one_image = {**parts, "prefill": (parts["prefill"][0], {**prefill, "mm_encoder_outputs": {"image": fewer}})}
    assert learn_multimodal_prefill(model, one_image, plan) is None


def test_a_modality_generate_encoded_but_the_prefill_lacks_gives_no_learned_route():
    """generate() called get_audio_features (so an ``audio_features`` feed exists) while the prompt's prefill holds
    no audio features (Qwen2.5-Omni's thinker, Dots3-Note): no multimodal route is learned, and no KeyError."""
    from engine.generation.multimodal_prefill import learn_multimodal_prefill

    model, parts, plan = _llava_parts()
    plan.encoders["audio_features"] = "mm_encoder_outputs.audio"
    assert learn_multimodal_prefill(model, parts, plan) is None
