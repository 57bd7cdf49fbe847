"""A generation case's prompt: the forward's sample as generate() takes it, or the inputs the class's own
generate() requires, made by the zoo."""

from __future__ import annotations

import torch

from sweep.zoo.generation_prompt import generation_prompt, required_by_own_generate


def test_a_generate_that_requires_features_gets_them_from_the_zoo_in_a_layout_it_runs():
    """Pop2Piano's generate(input_features, ...) takes embedded features (batch, frames, d_model), not the forward's
    token ids; the zoo's recipe lays features out as mel bins first, which fails, so the prompt holds the layout
    that runs (and no ids or mask of the sample), and the checkpoint's composer tokens are set."""
    from sweep.case import _set_decoder_start_token
    from sweep.zoo.build import build_case

    case = build_case("Pop2PianoForConditionalGeneration", seed=0)
    _set_decoder_start_token(case.model, {})  # the sweep's, before the prompt
    assert required_by_own_generate(case.model) == ["input_features"]
    prompt = generation_prompt(case.model, case.inputs)
    assert sorted(prompt) == ["input_features"]
    assert prompt["input_features"].shape[-1] == case.model.config.d_model
    tokens = case.model.generation_config.composer_to_feature_token
    assert len(tokens) == case.model.config.composer_vocab_size
    with torch.no_grad():
        case.model.generate(**prompt, max_new_tokens=2, do_sample=False)


def test_a_class_with_the_shared_generate_keeps_the_sample_without_decoder_inputs():
    from sweep.zoo.build import build_case

    case = build_case("T5ForConditionalGeneration", seed=0)
    assert required_by_own_generate(case.model) == []
    prompt = generation_prompt(case.model, case.inputs)
    assert sorted(prompt) == sorted(k for k in case.inputs if not k.startswith("decoder_"))
