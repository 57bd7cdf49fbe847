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


def _sized_by_audio(self, *args, **kwargs):
    values = kwargs.get("input_values")
    return values.shape[-1]


def _optional_assistant(self, **kwargs):
    assistant = kwargs.get("assistant_model", None)
    if assistant is not None:
        return assistant.config
    if "draft" in kwargs:
        draft = kwargs["draft"]
        return draft.config
    return kwargs.pop("streamer")


def test_keywords_a_generate_reads_from_kwargs_count_as_required_only_when_used_unchecked():
    from sweep.zoo.generation_prompt import _keywords_used_unchecked

    assert _keywords_used_unchecked(_sized_by_audio, "kwargs") == ["input_values"]
    assert _keywords_used_unchecked(_optional_assistant, "kwargs") == []  # tested for None, tested for presence, unused


def test_a_generate_that_sizes_its_output_by_a_kwargs_waveform_gets_one_channel_of_it():
    """Kyutai's generate(*args, **kwargs) bounds max_new_tokens by ``kwargs.get("input_values").shape[-1]``, and its
    codec encodes (batch, channels, samples): the forward's sample (audio-token ids) has none, so eager generate
    failed; the prompt is the zoo's waveform as one channel, on which two tokens generate."""
    from sweep.zoo.build import build_case

    case = build_case("KyutaiSpeechToTextForConditionalGeneration", seed=0)
    assert required_by_own_generate(case.model) == ["input_values"]
    prompt = generation_prompt(case.model, case.inputs)
    assert sorted(prompt) == ["input_values"] and prompt["input_values"].dim() == 3
    with torch.no_grad():
        assert case.model.generate(**prompt, max_new_tokens=2, do_sample=False).shape[-1] >= 2
